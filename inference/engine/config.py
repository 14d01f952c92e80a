"""One validated configuration for an engine (a worker process holds exactly one engine)."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from inference.checks import is_int, is_number
from inference.engine.speculation_policy import SpeculativeError, parse_speculative
from inference.roles import Role

# "auto": the model config's own dtype, resolved when the model loads (inference/engine/precision.py).
DTYPES = ("auto", "float32", "bfloat16", "float16")
# The KV cache's dtype, by the same names: "auto" (the model's) or a narrower one beside float32
# (precision.choose_kv_dtype).
KV_CACHE_DTYPES = DTYPES
# "int8": the linear layers (attention projections, MLP, lm_head) and the embedding table in int8 with per-channel
# scales (inference/engine/quantization.py); outputs are then not bit-identical to the model's own.
QUANTIZATIONS = ("none", "int8")
# How a float model's linear weights lie in memory (fusion.py, `choose_weight_layout`): "as_loaded" ([out, in], as
# the model file has them), "transposed" ([in, out], q/k/v and gate/up fused; faster one-token matmuls on a CPU,
# greedy tokens identical but values not bit-identical), "auto": transposed for float32 on a CPU, else as loaded.
WEIGHT_LAYOUTS = ("auto", "as_loaded", "transposed")
# Who multiplies a decode step's few tokens by the float linears on a CPU (matvec.py): "tandem" (Tandem's kernel,
# matvec.c: it streams the weights at about the rate a plain sum reads memory, faster than torch's one-token matmul
# in float32 and more so in bfloat16, see docs/performance.md, 'Decode against the bandwidth limit'; values not
# bit-identical, greedy tokens identical), "torch" (torch's matmul), "auto":
# the kernel where it runs (float32 or bfloat16 on a CPU with AVX2+FMA or AVX-512F and a C compiler), else torch.
# The same setting covers the decode rows' attention (paged_attention.c: K/V read in place from the cache; "torch":
# torch's gather and SDPA), the prefill chunks' attention (prefill_attention.c; "torch": SDPA), and
# INT8 linears: Tandem's int8 kernel (int8_matvec.c) for "tandem", and for "auto" on a
# decode worker or a CPU without VNNI (where fbgemm crawls); fbgemm for "torch"; for "auto" on prefill and
# colocated workers with VNNI the kernel for short steps and fbgemm for long ones (quantization.default_kernel).
MATVECS = ("auto", "tandem", "torch")
# What a worker says (/info) about the outputs of a quantized model.
QUANTIZATION_NOTES = {"int8": "int8 weights: outputs are not bit-identical to the unquantized model (greedy tokens "
                              "may part from its own after a near-tie)"}
_DEVICE_RE = re.compile(r"^(cpu|cuda|cuda:\d+)$")


class ConfigError(ValueError):
    """A bad setting. `field` names it, so that a front end can name it its own way (the worker: `--field-name`)."""

    def __init__(self, field: str, requirement: str):
        super().__init__(f"{field} {requirement}")
        self.field, self.requirement = field, requirement


@dataclass(slots=True)
class Config:
    model: str | Path
    role: Role = Role.COLOCATED
    device: str = "cpu"
    dtype: str = "auto"
    quantization: str = "none"
    # float16 on a CPU without fast float16 is refused unless this is set (see precision.py).
    allow_slow_float16: bool = False
    threads: int | None = None
    # The KV pool: bytes, or "auto": kv_memory_fraction of the memory free once the weights are loaded, clamped to
    # hold one full context (where memory allows) and no more than max_num_seqs of them (see kv_sizing.py).
    kv_cache_bytes: int | str = "auto"
    kv_memory_fraction: float | None = None  # None: 0.2 of available RAM on CPU, 0.8 of free GPU memory on CUDA
    # For kv_cache_bytes "auto": this worker's share of its host's KV memory, in bytes, handed over by whoever placed
    # it (the node agent divides the host's budget among the workers it runs there). Sized from this instead of a
    # fraction of free memory, which N workers on one host would each take in full.
    kv_memory_budget: int | None = None
    block_size: int = 16
    # One of KV_CACHE_DTYPES: "auto" keeps K and V in the model's dtype; "float16" or "bfloat16" beside a float32
    # model halves the pool's bytes per token (twice the tokens in the same memory) and what a decode step's attention
    # reads, each value rounded once on its way in (outputs then not bit-identical to the model's own).
    kv_cache_dtype: str = "auto"
    max_num_seqs: int = 64
    # The prefill token budget: the most prompt tokens one prefill step computes. One prompt longer than this still
    # runs, alone in its step, so that no admissible request waits forever.
    max_num_batched_tokens: int = 2048
    # Chunked prefill (colocated and prefill roles): a long prompt is prefilled in chunks, interleaved with the
    # decodes of the running batch (colocated) and with other prompts (prefill: shortest first), so that no step
    # feeds more than min(prefill_chunk_size, max_num_batched_tokens) tokens beside running decodes, and no more
    # than min(prefill_chunk_size_alone, max_num_batched_tokens) in a step without any. Off: a prompt is prefilled
    # whole in one step, however long (the old way).
    chunked_prefill: bool = True
    # The chunk beside running decodes, which each stream's next token waits for. None: 64 on a CPU, 512 on CUDA. On
    # one CPU thread a chunk of 64 SmolLM2 tokens already makes a step a few times a plain decode step's; chunks of
    # 256 make every step, which is what a stream would see, far longer (docs/engine.md, "Chunked prefill"). A GPU
    # reads its weights in about the time it computes a few hundred tokens, so its chunks can be far larger at the
    # same step time.
    prefill_chunk_size: int | None = None
    # The chunk of a step with no decode in it (every step of a prefill worker; a colocated one's while no stream is
    # past its prefill), at least prefill_chunk_size. None: 4 x prefill_chunk_size (256 on a CPU, 2,048 on CUDA).
    # No stream waits on such a step, but every chunk is a pass over the weights: a long prompt costs clearly more in
    # chunks of 64 than in one pass on one CPU thread, little more in chunks of 256; larger chunks gain nothing
    # measurable and make a short prompt arriving behind a long one wait longer for its first token (one chunk's time;
    # docs/performance.md, 'Stage split').
    prefill_chunk_size_alone: int | None = None
    # Prefix caching (colocated and prefill roles; block_manager.py, prefix_cache.py): full KV blocks are keyed by
    # their prefix and kept after a request ends while memory allows, so a later request that shares the prefix (a
    # system prompt, a chat's history) computes only the rest. Outputs are unchanged. A decode worker receives its
    # K/V from a prefill worker and computes no prompt: the setting does nothing there.
    prefix_caching: bool = True
    # The deployment's shared prompt (a system prompt every tenant sends): blocks holding only its leading tokens are
    # keyed without the tenant's salt, so all tenants reuse them (prefix_cache.py). None: every salted block is the
    # tenant's own.
    shared_prompt: str | None = None
    max_model_len: int | None = None  # None: from the model config
    # Speculative decoding (speculation_policy.py): None (off) or {"method": "ngram" | "layers", "num_tokens": k, ...},
    # kept here with its defaults filled in. Decode and colocated roles only: a prefill engine samples one token.
    speculative: dict | None = None
    # torch.compile of the decode step (compilation.py): inductor on a CPU (needs a C++ compiler; without one the
    # engine runs eager and says why in compile_info), CUDA graphs ("reduce-overhead") on CUDA. Compiled during the
    # engine's construction, before a worker reports ready.
    compile: bool = False
    # The lean decode forward (lean_decode.py): decode-only steps with far fewer tensor ops, bit-identical to the
    # reference forward over the Hugging Face modules (False: the reference, for comparisons).
    lean_decode: bool = True
    # Prefill steps (whole prompts, chunks, mixed chunked steps) through the same lean forward, which is as exact for
    # many tokens as for one (False: the reference forward, for comparisons). Needs lean_decode: the lean forward
    # exists only when it is on.
    lean_prefill: bool = True
    # Decode steps' layers in one C call (decode_layers.py) where Tandem's kernels run all of them: the lean forward's
    # ops without their Python and dispatch overhead (False: the lean forward, for comparisons).
    fused_decode: bool = True
    # Colocated: a request that arrives during a decode step is prefilled between that step's layers, so that its
    # first token does not wait for the step to end (interleave.py; in chunked mode only a prompt that fits the
    # chunk beside decodes). False: it waits for the step's end, as before.
    interleave_prefill: bool = True
    # One of WEIGHT_LAYOUTS: "auto" (transposed for float32 on a CPU, where one thread's matrix-vector products read
    # [in, out] weights faster; as loaded elsewhere), or either layout by name.
    weight_layout: str = "auto"
    # One of MATVECS: the kernel of the float linears in steps of a few tokens (decode steps) on a CPU.
    matvec: str = "auto"
    # Steps above the matvec kernel's tokens (prefill chunks, large decode batches) through oneDNN's GEMM over a copy
    # of the float weights packed once, instead of a GEMM that reorders every weight on every call; the kernel
    # cannot read the packed copy, so the float weights are held twice (packed_weights.py).
    packed_weights: bool = False

    def __post_init__(self) -> None:
        self.model = str(self.model)
        if not (Path(self.model) / "config.json").is_file():
            raise ConfigError("model", "must be a Hugging Face model folder (a local model folder with config.json), "
                                       f"got {self.model!r}")
        try:
            self.role = Role(self.role)
        except ValueError:
            raise ConfigError("role", f"must be one of {', '.join(Role)}, got {self.role!r}") from None
        if not isinstance(self.device, str) or not _DEVICE_RE.match(self.device):
            raise ConfigError("device", f"must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError("quantization", f"must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.weight_layout not in WEIGHT_LAYOUTS:
            raise ConfigError("weight_layout", f"must be one of {', '.join(WEIGHT_LAYOUTS)}, got "
                                               f"{self.weight_layout!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError("kv_cache_dtype", f"must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                                                f"{self.kv_cache_dtype!r}")
        if self.matvec not in MATVECS:
            raise ConfigError("matvec", f"must be one of {', '.join(MATVECS)}, got {self.matvec!r}")
        for name in _SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false, got {getattr(self, name)!r}")
        if self.shared_prompt is not None and (not isinstance(self.shared_prompt, str) or not self.shared_prompt):
            raise ConfigError("shared_prompt", f"must be a non-empty text or None, got {self.shared_prompt!r}")
        if self.threads is not None and (not is_int(self.threads) or self.threads < 1):
            raise ConfigError("threads", f"must be a positive integer or None, got {self.threads!r}")
        if self.kv_cache_bytes != "auto" and (not is_int(self.kv_cache_bytes) or self.kv_cache_bytes < 1):
            raise ConfigError("kv_cache_bytes", f"must be a positive integer or auto, got {self.kv_cache_bytes!r}")
        if self.kv_memory_fraction is not None and (not is_number(self.kv_memory_fraction)
                                                    or not 0 < self.kv_memory_fraction <= 1):
            raise ConfigError("kv_memory_fraction", f"must be a number in (0, 1] or None, got "
                                                    f"{self.kv_memory_fraction!r}")
        if self.kv_memory_budget is not None and (not is_int(self.kv_memory_budget) or self.kv_memory_budget < 1):
            raise ConfigError("kv_memory_budget", f"must be a positive number of bytes or None, got "
                                                  f"{self.kv_memory_budget!r}")
        if self.prefill_chunk_size is None:
            self.prefill_chunk_size = 64 if self.device == "cpu" else 512
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "prefill_chunk_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
        if self.prefill_chunk_size_alone is None:
            self.prefill_chunk_size_alone = 4 * self.prefill_chunk_size
        if not is_int(self.prefill_chunk_size_alone) or self.prefill_chunk_size_alone < self.prefill_chunk_size:
            raise ConfigError("prefill_chunk_size_alone", f"must be an integer at least prefill_chunk_size "
                                                          f"({self.prefill_chunk_size}), got "
                                                          f"{self.prefill_chunk_size_alone!r}")
        try:
            spec = parse_speculative(self.speculative)
        except SpeculativeError as exc:
            raise ConfigError("speculative", str(exc)) from None
        if spec is not None and self.role is Role.PREFILL:
            raise ConfigError("speculative", "is for the decode and colocated roles: a prefill engine samples only "
                                             "the first token (leave it out for prefill workers)")
        self.speculative = spec.as_dict() if spec is not None else None
        if self.max_model_len is not None and (not is_int(self.max_model_len) or self.max_model_len < 2):
            raise ConfigError("max_model_len", f"must be an integer >= 2 or None, got {self.max_model_len!r}")


# Every setting that is a switch: each field whose default is true or false.
_SWITCHES = tuple(f.name for f in fields(Config) if isinstance(f.default, bool))
