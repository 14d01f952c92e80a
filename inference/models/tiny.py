"""A deterministic random-weight Llama with a tokenizer trained on this machine: the model of the test suite.

Random weights give flat logits, where a 1e-6 difference between batched and unbatched math could flip a greedy
argmax and make equality tests flaky. So the weights are drawn with a large std (INIT_STD) and the lm_head is scaled
up, which makes the top-1/top-2 logit margin of order 1 rather than 1e-3.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

from inference.models import DEFAULT_MODELS_DIR
from inference.models.folder import build_once

RECIPE = "tiny-v1"
SEED = 1234
VOCAB_SIZE = 4096
HIDDEN_SIZE = 192
INTERMEDIATE_SIZE = 512
NUM_LAYERS = 4
NUM_HEADS = 4
NUM_KV_HEADS = 2  # GQA, so the engine's grouped-query path is exercised by every test
MAX_POSITIONS = 1024
INIT_STD = 0.3
LM_HEAD_SCALE = 4.0
CORPUS_MAX_BYTES = 3 << 20
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DEFAULT_DIR = DEFAULT_MODELS_DIR / "tiny"


def marker() -> dict:
    return {"kind": "tiny", "recipe": RECIPE, "seed": SEED, "vocab_size": VOCAB_SIZE, "hidden_size": HIDDEN_SIZE}


def prepare_tiny(out_dir: Path = DEFAULT_DIR) -> Path:
    """Build the tiny model folder unless it is already complete; return its path."""
    return build_once(Path(out_dir), marker(), _build)


def corpus_files() -> list[Path]:
    """English prose (the licenses Debian ships) then Python source, in a fixed sorted order, capped in size."""
    licenses = Path("/usr/share/common-licenses")
    files = sorted(p for p in licenses.glob("*") if p.is_file()) if licenses.is_dir() else []
    files += sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    chosen, total = [], 0
    for path in files:
        size = path.stat().st_size
        if total + size > CORPUS_MAX_BYTES:
            continue
        chosen.append(path)
        total += size
    return chosen


def _build(tmp_dir: Path) -> None:
    _train_tokenizer().save_pretrained(tmp_dir)
    _random_model().save_pretrained(tmp_dir, safe_serialization=True)


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable: no unknown tokens
        show_progress=False,
    )
    bpe.train([str(p) for p in corpus_files()], trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = MAX_POSITIONS
    return tokenizer


def _random_model():
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eos_id, pad_id = SPECIAL_TOKENS.index("<|im_end|>"), SPECIAL_TOKENS.index("<|endoftext|>")
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_STD,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    # fork_rng: seeding must not change the caller's global random state (a test calling this mid-run).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            model.lm_head.weight.mul_(LM_HEAD_SCALE)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False)
    return model.to(torch.float32).eval()
