"""Bad configuration and bad requests fail at the edge with a clear ValueError, and leave the engine untouched."""
import pytest

from inference.engine import Config, LLMEngine, SamplingParams


@pytest.mark.parametrize("kwargs, message", [
    ({"role": "router"}, "role must be one of"),
    ({"device": "gpu"}, "device must be cpu, cuda or cuda:N"),
    ({"dtype": "int8"}, "dtype must be one of"),
    ({"kv_cache_bytes": 0}, "kv_cache_bytes must be a positive integer"),
    ({"block_size": -16}, "block_size"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_batched_tokens": 1.5}, "max_num_batched_tokens"),
    ({"threads": 0}, "threads"),
    ({"max_model_len": 1}, "max_model_len"),
    ({"chunked_prefill": "yes"}, "chunked_prefill must be true or false"),
    ({"prefill_chunk_size": 0}, "prefill_chunk_size must be a positive integer"),
    ({"prefill_chunk_size_alone": 32},
     r"prefill_chunk_size_alone must be an integer at least prefill_chunk_size \(64\)"),
    ({"prefill_chunk_size_alone": "big"}, "prefill_chunk_size_alone must be an integer"),
])
def test_config_rejects_bad_values(tiny_model_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Config(model=tiny_model_dir, **kwargs)


def test_config_rejects_a_model_path_that_is_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match="local model folder"):
        Config(model=tmp_path / "missing")


def test_config_accepts_cuda_devices_by_index(tiny_model_dir):
    assert Config(model=tiny_model_dir, device="cuda:1").device == "cuda:1"


def test_the_prefill_chunk_size_defaults_by_device(tiny_model_dir):
    assert Config(model=tiny_model_dir).prefill_chunk_size == 64
    assert Config(model=tiny_model_dir, device="cuda").prefill_chunk_size == 512
    assert Config(model=tiny_model_dir, prefill_chunk_size=100).prefill_chunk_size == 100


def test_the_chunk_of_a_step_without_decodes_defaults_to_four_chunks(tiny_model_dir):
    assert Config(model=tiny_model_dir).prefill_chunk_size_alone == 256
    assert Config(model=tiny_model_dir, device="cuda").prefill_chunk_size_alone == 2048
    assert Config(model=tiny_model_dir, prefill_chunk_size=100).prefill_chunk_size_alone == 400
    assert Config(model=tiny_model_dir, prefill_chunk_size_alone=64).prefill_chunk_size_alone == 64


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(Config(model=tiny_model_dir, threads=1, kv_cache_bytes=4 << 20, max_model_len=64))


def test_the_engine_reports_its_limits_and_kv_layout(engine):
    assert engine.max_model_len == 64
    assert engine.kv_layout == {"num_layers": 4, "num_kv_heads": 2, "head_dim": 48, "dtype": "float32",
                                "block_size": 16}
    assert engine.tokenizer.decode(engine.tokenizer.encode("hello world")) == "hello world"


def test_a_max_model_len_beyond_the_model_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="exceeds what the model supports"):
        LLMEngine(Config(model=tiny_model_dir, threads=1, max_model_len=100_000))


def test_a_prompt_too_long_for_max_model_len_names_both_numbers(engine):
    with pytest.raises(ValueError, match=r"prompt_tokens \(60\) \+ max_tokens \(5\) = 65 exceeds max_model_len \(64\)"):
        engine.add_request("long", list(range(3, 63)), SamplingParams(max_tokens=5))


@pytest.mark.parametrize("request_id, prompt, params, message", [
    ("", [5], SamplingParams(), "request_id"),
    ("r", [], SamplingParams(), "non-empty list"),
    ("r", [5, -1], SamplingParams(), r"token ids in \[0, 4096\)"),
    ("r", [5, 4096], SamplingParams(), "token ids"),
    ("r", [5, "6"], SamplingParams(), "token ids"),
    ("r", [5], {"max_tokens": 3}, "SamplingParams"),
])
def test_bad_requests_are_refused(engine, request_id, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        engine.add_request(request_id, prompt, params)
    assert not engine.has_unfinished()


def test_a_request_id_in_use_is_refused(engine):
    engine.add_request("dup", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already in the engine"):
        engine.add_request("dup", [7], SamplingParams())
    while engine.has_unfinished():
        engine.step()


def test_generate_needs_the_colocated_role(tiny_model_dir):
    prefill = LLMEngine(Config(model=tiny_model_dir, role="prefill", threads=1, kv_cache_bytes=1 << 20))
    with pytest.raises(ValueError, match="colocated"):
        prefill.generate([[5, 6]], SamplingParams())
