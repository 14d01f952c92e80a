"""A step's layers in one C call (decode_layers.c), where Tandem's kernels run all of a layer.

At one token a sequence, the lean forward's ~25 tensor ops and 5-7 kernel calls per layer cost more in Python and
dispatch than in arithmetic: a sizeable share of a small model's single-stream step, beside the weight reads
(found by wrapping each kernel call of the lean step; the figures: docs/performance.md, 'Faster tokens'). Here
the lean forward hands its layer loop to C: the plan (each layer's weight pointers, the kernels' entry points, the
cache, scratch rows) is built once per runner from its kernel plan (kernel_plan.py), and each step makes one call
with its tokens' cos/sin, slots, block tables and context lengths. The embedding, RoPE's cos/sin, the final norm,
lm_head and sampling stay as they were.

It runs a step when every projection of every layer goes through one of Tandem's kernels (matvec.c for float32 and
bfloat16, int8_matvec.c for INT8 weights; anything else, e.g. the transposed float32 layout torch multiplies, keeps the
lean forward), a step's decode rows' attention is the paged kernel, and the step has no more tokens than the kernels
take (matvec.py's `max_tokens_for`: 32, 8 in bfloat16 on a CPU with AMX or with bfloat16 arithmetic but not the
AVX512-BF16 tiles; 127 for INT8). Prompt rows ride along where the prefill kernel runs their attention
(prefill_attention.c, over a cache of the activations' dtype): a mixed chunked step of a few prompt tokens beside its
decodes, or a short prompt alone, is one call too. Without that, a mixed step (the prompt work a step takes beside its
decodes under an ITL objective, batch_limit.py) ran the lean forward's ops and cost a good deal more than the pure
decode step beside it (docs/performance.md, 'The ITL objective'). Every other step runs the lean forward as before.
Values: the same kernel calls in the same order and the elementwise steps rounded where the lean forward's tensor ops
round (decode_layers.c); silu's exp is libm's rather than torch's, so values are not bit-identical to the lean
forward's, greedy tokens are (tests/inference/engine/test_decode_layers.py, test_mixed_layers.py).

`Config.fused_decode` (default on) turns it off for comparisons; `matvec: torch` has no kernels and so no fusion.
"""
from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch
from torch import nn

from inference.engine.kernels.int8_linear import MatVecInt8Linear
from inference.engine.interleave import Pause
from inference.engine.kernels.matvec import matvec_projection
from inference.engine.kernels.build import KernelLibrary, load_library
from inference.engine.kernels.paged_attention import KV_DTYPE_CODES, PagedDecode

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_layers.c")
MAX_CALLS = 4  # decode_layers.c's: kernel calls per projection (q, k, v: 3)
CALL_MATVEC, CALL_INT8 = 0, 1
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
_P = ctypes.c_void_p
_I = ctypes.c_int64


class Call(ctypes.Structure):
    _fields_ = [("fn", _P), ("kind", _I), ("w", _P), ("ldw", _I), ("scale", _P), ("bias", _P), ("rows", _I),
                ("column", _I)]


class Projection(ctypes.Structure):
    _fields_ = [("norm_w", _P), ("eps", ctypes.c_double), ("num_calls", _I), ("in_features", _I),
                ("out_features", _I), ("calls", Call * MAX_CALLS)]


class Layer(ctypes.Structure):
    _fields_ = [("qkv", Projection), ("o", Projection), ("gate_up", Projection), ("down", Projection),
                ("scale", ctypes.c_double)]


class Plan(ctypes.Structure):
    _fields_ = [("dtype", _I), ("num_threads", _I), ("num_layers", _I), ("hidden", _I), ("num_heads", _I),
                ("num_kv_heads", _I), ("head_dim", _I), ("intermediate", _I), ("max_tokens", _I),
                ("layers", ctypes.POINTER(Layer)), ("attention", _P), ("k_cache", _P), ("v_cache", _P),
                ("layer_bytes", _I), ("block_size", _I),
                ("qkv", _P), ("q", _P), ("o", _P), ("h", _P), ("gu", _P), ("a", _P), ("kv_dtype", _I),
                ("prefill_attention", _P)]


class Library(KernelLibrary):
    def __init__(self, lib: ctypes.CDLL):
        super().__init__(lib, "tandem_decode_layers")
        lib.tandem_decode_layers.restype = ctypes.c_int
        lib.tandem_decode_layers.argtypes = [ctypes.POINTER(Plan), _P, _I, _I, _I, _P, _P, _P, _P, _I, _P, _I, _P,
                                             _P, ctypes.POINTER(_I)]


@functools.lru_cache(maxsize=1)
def load() -> tuple[Library | None, str | None]:
    """(the library, None) or (None, why it cannot run here). Built at install, else on first use (build.py)."""
    return load_library(SOURCE, Library, "decode layers")


def _address(function) -> int:
    return ctypes.cast(function, _P).value


class _Unfusable(Exception):
    """Why a layer cannot run in C: the lean forward keeps it."""


def _float_calls(matvec, modules: list[nn.Module]) -> tuple[list[Call], int]:
    projection = matvec_projection(matvec, *modules)
    if projection is None:
        raise _Unfusable("a float projection Tandem's matvec kernel does not run (the weight layout, or torch's "
                         "matmul)")
    fn = _address(matvec.lib.tandem_matvec)
    calls = [Call(fn=fn, kind=CALL_MATVEC, w=w, ldw=ldw, scale=None, bias=b or None, rows=rows, column=column)
             for w, ldw, b, column, rows in projection.calls]
    return calls, projection.out_features


def _int8_calls(module: MatVecInt8Linear) -> tuple[list[Call], int]:
    q, ldq, scale = module._matrix
    return [Call(fn=_address(module._call), kind=CALL_INT8, w=q, ldw=ldq, scale=scale, bias=module._bias_ptr,
                 rows=module.out_features, column=0)], module.out_features


def _projection(matvec, modules: list[nn.Module], norm: nn.Module | None, dtype: torch.dtype) -> Projection:
    if len(modules) == 1 and isinstance(modules[0], MatVecInt8Linear):
        if dtype != torch.float32:
            raise _Unfusable("INT8 linears with activations other than float32")
        calls, out_features = _int8_calls(modules[0])
    elif all(isinstance(m, nn.Linear) for m in modules) and matvec is not None:
        calls, out_features = _float_calls(matvec, modules)
    else:
        raise _Unfusable(f"{type(modules[0]).__name__} projections (not one of Tandem's kernels)")
    norm_w, eps = (None, 0.0) if norm is None else (norm.weight, norm.variance_epsilon)
    if norm_w is not None and (norm_w.dtype != dtype or not norm_w.is_contiguous()):
        raise _Unfusable(f"an RMSNorm weight in {norm_w.dtype}, not the activations' {dtype}")
    projection = Projection(norm_w=None if norm_w is None else norm_w.data_ptr(), eps=eps, num_calls=len(calls),
                            in_features=modules[0].in_features, out_features=out_features)
    for i, call in enumerate(calls):
        projection.calls[i] = call
    return projection


def _is_silu(act: nn.Module) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


class FusedDecode:
    """The plan of one runner's layers and the step's call. `__call__` returns False where it does not run a step
    (the caller then runs the lean forward)."""

    def __init__(self, plan, model, k_cache: torch.Tensor, v_cache: torch.Tensor, *, dtype: torch.dtype,
                 num_heads: int, num_kv_heads: int, head_dim: int):
        # plan: the runner's kernel plan (kernel_plan.KernelPlan), whose decode layers run here
        self.library, self.int8 = plan.decode_layers, plan.int8_kernel is not None
        self.matvec, self.dtype = plan.matvec, dtype
        layers = model.model.layers
        self.layers = (Layer * len(layers))()
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            if not _is_silu(mlp.act_fn):
                raise _Unfusable(f"the MLP's activation {type(mlp.act_fn).__name__} (the C layer computes silu)")
            qkv = [attn.qkv_proj] if hasattr(attn, "qkv_proj") else [attn.q_proj, attn.k_proj, attn.v_proj]
            gate_up = [mlp.gate_up_proj] if hasattr(mlp, "gate_up_proj") else [mlp.gate_proj, mlp.up_proj]
            self.layers[i] = Layer(qkv=_projection(self.matvec, qkv, layer.input_layernorm, dtype),
                                   o=_projection(self.matvec, [attn.o_proj], None, dtype),
                                   gate_up=_projection(self.matvec, gate_up, layer.post_attention_layernorm, dtype),
                                   down=_projection(self.matvec, [mlp.down_proj], None, dtype),
                                   scale=attn.scaling)
        self.intermediate = self.layers[0].down.in_features
        h_q, h_kv, d = num_heads, num_kv_heads, head_dim
        hidden = model.config.hidden_size
        self.capacity = capacity = plan.decode_layers_capacity
        # Scratch rows, [capacity, ...] each: read and written by the C call only.
        widths = {"qkv": (h_q + 2 * h_kv) * d, "q": h_q * d, "o": h_q * d, "h": hidden, "gu": 2 * self.intermediate,
                  "a": self.intermediate}
        self.scratch = {name: torch.empty(capacity, width, dtype=dtype) for name, width in widths.items()}
        # Prompt rows run here where the prefill kernel runs the activations' dtype over a cache of that dtype (it
        # reads K/V in place, and a narrower cache's would be the chunk's own K/V rounded, which the lean forward's
        # attention does not see).
        prefill = plan.prefill_attention
        self.prefills = prefill is not None and prefill.runs(dtype) and k_cache.dtype == dtype
        self.plan = Plan(dtype=_DTYPE_CODES[dtype], num_threads=torch.get_num_threads(), num_layers=len(layers),
                         hidden=hidden, num_heads=h_q, num_kv_heads=h_kv, head_dim=d,
                         intermediate=self.intermediate, max_tokens=capacity,
                         layers=ctypes.cast(self.layers, ctypes.POINTER(Layer)),
                         attention=_address(plan.paged_attention.lib.tandem_paged_attention),
                         k_cache=k_cache.data_ptr(), v_cache=v_cache.data_ptr(),
                         layer_bytes=k_cache.stride(0) * k_cache.element_size(), block_size=k_cache.shape[2],
                         kv_dtype=KV_DTYPE_CODES[k_cache.dtype],
                         prefill_attention=_address(prefill.lib.tandem_prefill_attention) if self.prefills else None,
                         **{name: tensor.data_ptr() for name, tensor in self.scratch.items()})
        self._call = self.library.lib.tandem_decode_layers
        self._plan_ref = ctypes.byref(self.plan)

    def max_tokens(self) -> int:
        """The most tokens a step may have here now (the float kernel's limit follows its instruction set)."""
        if self.int8:
            return self.capacity
        return min(self.capacity, self.matvec.max_tokens_for(self.dtype))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                 attention, num_layers: int, pause: Pause | None = None) -> bool:
        # x: [T, hidden] (contiguous, updated in place); cos, sin: [T, D] contiguous in x's dtype, sin's first
        # half negated; slot_mapping: [T] int64; attention: the step's (attention.py); pause: where the step may
        # stop between layers for a prefill (interleave.py)
        num_tokens = x.shape[0]
        if (num_tokens > self.max_tokens() or x.dtype != self.dtype or not x.is_contiguous()
                or not slot_mapping.is_contiguous()):
            return False
        rows = self._rows(attention, slot_mapping, num_tokens)
        if rows is None:
            return False
        tables, context_lens, chunks = rows
        decode_rows = (None, 0, None) if tables is None else (tables.data_ptr(), tables.stride(0),
                                                              context_lens.data_ptr())
        chunk_rows = (0, None) if chunks is None else (chunks.shape[0], chunks.data_ptr())
        flag = None if pause is None else pause.arrivals.address
        layer, next_layer = 0, _I(0)
        while layer < num_layers:
            status = self._call(self._plan_ref, x.data_ptr(), num_tokens, layer, num_layers, cos.data_ptr(),
                                sin.data_ptr(), slot_mapping.data_ptr(), *decode_rows, *chunk_rows, flag,
                                ctypes.byref(next_layer))
            if status:
                raise MemoryError(f"decode layers: a kernel failed with status {status} on a {num_tokens}-token "
                                  "step")
            layer = next_layer.value
            if layer < num_layers:
                pause.between()  # the flag was raised: a prefill runs now, then the step goes on from `layer`
        return True

    def _rows(self, attention, slot_mapping: torch.Tensor, num_tokens: int):
        """(the decode rows' block tables and context lengths, or Nones; the prompt rows' chunks [C, 4] int64, or
        None) of a step whose every row runs here, else None."""
        if hasattr(attention, "num_prefill_tokens"):  # prompt rows, then decode rows (attention.MixedAttention)
            prefill, decode = attention.prefill, attention.decode
        elif hasattr(attention, "bounds"):  # prompt rows only (attention.PrefillAttention)
            prefill, decode = attention, None
        else:  # decode rows only (attention.DecodeAttention)
            prefill, decode = None, attention
        tables = context_lens = chunks = None
        num_rows = 0
        if decode is not None:
            kernel = getattr(decode, "kernel", None)
            if not isinstance(kernel, PagedDecode):  # torch's attention: the lean forward runs the step
                return None
            tables, context_lens = kernel.block_tables, kernel.context_lens
            num_rows += tables.shape[0]
        if prefill is not None:
            chunks = self._chunks(prefill, slot_mapping)
            if chunks is None:
                return None
            num_rows += sum(end - start for start, end in prefill.bounds)
        return (tables, context_lens, chunks) if num_rows == num_tokens else None

    def _chunks(self, prefill, slot_mapping: torch.Tensor) -> torch.Tensor | None:
        """Each chunk's (first row, rows, first position, address of its slots from position 0 on), where the
        prefill kernel runs the prompt rows' attention here, else None."""
        if not self.prefills or prefill.kernel is None:
            return None
        chunks = []
        for (start, end), context in zip(prefill.bounds, prefill.contexts):
            if context is None:  # a whole prompt: its own slots are those of positions 0 .. end - start - 1
                chunks.append((start, end - start, 0, slot_mapping.data_ptr() + start * slot_mapping.element_size()))
                continue
            slots = context[0]  # a chunk after its cached prefix: the slots of positions 0 .. its end
            if slots.dtype != torch.int64 or not slots.is_contiguous():
                return None
            chunks.append((start, end - start, slots.numel() - (end - start), slots.data_ptr()))
        return torch.tensor(chunks, dtype=torch.int64)  # [C, 4]


def bind(plan, model, k_cache: torch.Tensor, v_cache: torch.Tensor, **shape) -> tuple[FusedDecode | None, str]:
    """(the fused step over the model's layers, or None; why, for /info and the log) for the runner's kernel plan
    (kernel_plan.py decides whether the decode layers run; a layer the C call cannot run turns them off here).
    `shape`: FusedDecode's dtype, num_heads, num_kv_heads and head_dim."""
    if plan.decode_layers is None:
        return None, plan.decode_layers_reason
    try:
        return FusedDecode(plan, model, k_cache, v_cache, **shape), plan.decode_layers_reason
    except _Unfusable as exc:
        return None, f"off: {exc}"
