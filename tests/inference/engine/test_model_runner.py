"""The model runner: KV pool sizing, paged K/V against Hugging Face's own cache, K/V validation."""
import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from inference.engine import Config, SamplingParams, Sequence
from inference.engine.model_runner import ModelRunner


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=4 << 20, block_size=4))


def test_the_kv_pool_holds_as_many_blocks_as_kv_cache_bytes_allow(runner):
    layout = runner.pool.kv_layout
    num_bytes_per_block = 2 * layout["num_layers"] * 4 * layout["num_kv_heads"] * layout["head_dim"] * 4  # fp32
    assert runner.num_blocks == (4 << 20) // num_bytes_per_block
    assert runner.k_cache.shape == (layout["num_layers"], runner.num_blocks, 4, layout["num_kv_heads"],
                                    layout["head_dim"])
    assert runner.k_cache.numel() * 4 * 2 <= 4 << 20


def test_a_pool_too_small_for_one_block_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="holds no KV block"):
        ModelRunner(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=1024))


def test_prefill_writes_the_same_keys_and_values_as_hugging_face_into_scattered_blocks(runner, tiny_model_dir):
    prompt = list(range(100, 111))  # 11 tokens over 3 blocks of 4
    seq = Sequence("r", prompt, SamplingParams())
    seq.block_table = [7, 2, 5]  # deliberately out of order: the runner must follow the table
    seq.num_scheduled_tokens = len(prompt)  # what the scheduler sets: the whole prompt in this step
    runner.run([seq], is_prefill=True)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.inference_mode():
        cache = hf(torch.tensor([prompt]), use_cache=True).past_key_values
    slots = torch.tensor([seq.block_table[i // 4] * 4 + i % 4 for i in range(len(prompt))])
    k_slots = runner.k_cache.view(runner.shape.num_layers, -1, runner.shape.num_kv_heads, runner.shape.head_dim)
    v_slots = runner.v_cache.view(runner.shape.num_layers, -1, runner.shape.num_kv_heads, runner.shape.head_dim)
    # Within float32 rounding, not bit for bit: the engine's float32 GEMM (oneDNN's, inference/engine/gemm.py) sums in
    # another order than Hugging Face's (MKL's), and the differences grow over the layers (seen: 1.4e-5 on a key of
    # 0.035). A K/V in the wrong slot would be off by the values themselves.
    for layer_id in range(runner.shape.num_layers):
        hf_k = cache.layers[layer_id].keys[0].transpose(0, 1)  # [T, Hkv, D]
        hf_v = cache.layers[layer_id].values[0].transpose(0, 1)
        torch.testing.assert_close(k_slots[layer_id, slots], hf_k, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(v_slots[layer_id, slots], hf_v, rtol=1e-4, atol=1e-4)


def test_validate_kv_names_what_is_wrong(runner):
    shape = (runner.shape.num_layers, 5, runner.shape.num_kv_heads, runner.shape.head_dim)
    good = torch.zeros(shape)
    runner.pool.validate_kv(good, good, 5)
    with pytest.raises(ValueError, match=r"k has shape \[.*expected"):
        runner.pool.validate_kv(torch.zeros(shape[0], 4, *shape[2:]), good, 5)
    with pytest.raises(ValueError, match="v has shape"):
        runner.pool.validate_kv(good, torch.zeros(shape[0], 5, shape[2], shape[3] + 1), 5)
    with pytest.raises(ValueError, match="v has dtype bfloat16, expected float32"):
        runner.pool.validate_kv(good, good.to(torch.bfloat16), 5)
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        runner.pool.validate_kv(good.tolist(), good, 5)


def test_an_unsupported_architecture_is_refused_by_name(tmp_path):
    config = GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        ModelRunner(Config(model=tmp_path, threads=1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_asking_for_cuda_without_it_is_a_clear_error(tiny_model_dir):
    with pytest.raises(ValueError, match="no CUDA"):
        ModelRunner(Config(model=tiny_model_dir, device="cuda", threads=1))
