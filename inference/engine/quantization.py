"""INT8 weights: the model's linear layers (attention projections, MLP, lm_head) and its embedding table held as int8
with one scale per output channel (per row), swapped into the loaded Hugging Face model in place.

Four kernels, chosen by device, CPU, the worker's role and the engine's `matvec` setting (`default_kernel`):
- `matvec` (CPU, where Tandem's int8 kernel builds: by default on a decode worker, and on any worker of a CPU
  without an int8 dot product (VNNI); wherever the `matvec` setting is "tandem"): int8_linear.py, Tandem's kernel
  (int8_matvec.c: int8 weights, each token's activations rounded to int16, exact integer sums) for steps of fewer
  than 128 tokens, the weight dequantized into torch's float GEMM for longer ones, the int8 matrix held once for both.
- `split` (CPU, by default for prefill and colocated workers where the CPU has VNNI and the kernel runs): the kernel
  for those short steps, fbgemm's int8 GEMM for the long ones (int8_linear.SplitInt8Linear), the matrix held twice.
- `fbgemm` (CPU, `matvec` "torch", or where the kernel cannot run): torch's dynamic-quantization linear
  (`quantized::linear_dynamic`): the weight prepacked for fbgemm, each call quantizes its activations on the fly
  and multiplies in int8.
- `weight_only` (CUDA, and any device): int8 weights and scales in memory, the weight converted to the activation
  dtype inside the matmul and the scale applied to its output. Tested on CPU only (tests select it explicitly).

Why the CPU and the role decide (the figures: docs/performance.md, 'INT8 kernels by CPU and role', and docs/engine.md,
"INT8 weights"; bench/engine/int8_kernels.py measures them). Decode steps of up to 16 sequences ran faster with the
kernel than with fbgemm on every CPU tried: far faster with AVX2 only (fbgemm there sums pairs of 8-bit products in 16
bits, must take 7-bit activations, and its tied lm_head through `torch._int_mm` crawls; its KL from float32 is many
times the kernel's), by less with AVX-512 and VNNI, least at many sequences. Long steps (a prompt's) are another matter:
with VNNI fbgemm's int8 GEMM prefilled clearly faster than the kernel's dequantized float GEMM. A prefill or colocated
worker there takes both (`split`): holding the int8 matrix twice costs what bfloat16 weights cost, but a worker asked
for INT8 must never decode slower than at the default precision, which fbgemm's single stream did. Without VNNI the
kernel serves every role.

Activations (fbgemm): quantized per token on a fixed grid (see FbgemmInt8Linear), after SmoothQuant has moved the
range of a few outlier input channels into the weights (smooth_activations), which recovers most of what per-token
int8 activations cost in perplexity. The other kernels leave the weights as the model has them (smoothing
would only widen their range).

Tied embeddings (SmolLM2: lm_head is the embedding matrix). fbgemm's packed weight is opaque (no row can be read
back without unpacking all of it), so a packed lm_head beside an int8 embedding table would hold the matrix twice.
A tied matrix is therefore held once, as plain int8 [V, H] with per-row scales, shared by `Int8Embedding` (gathers
rows, then scales them) and the lm_head (fbgemm: `Int8TiedLMHead`, `torch._int_mm` with per-token activation scales;
matvec: a MatVecInt8Linear over the same tensors; elsewhere weight-only).

Outputs are not bit-identical to the unquantized model (the worker says so: config.QUANTIZATION_NOTES).
"""
from __future__ import annotations

import logging
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import inference.engine.kernels.int8_linear as int8_linear
from inference.engine.kernels.int8_linear import MatVecInt8Linear, SplitInt8Linear
from inference.engine.precision import cpu_flags
from inference.engine.smoothing import smooth_activations
from inference.hardware import INT8_DOT_PRODUCT_CPU_FLAGS

KERNELS = ("fbgemm", "weight_only", "matvec", "split")
_INT8_MAX = 127

log = logging.getLogger(__name__)


# What /info's matvec reason says of each kernel.
INT8_KERNEL_NAMES = {"fbgemm": "fbgemm's dynamic int8 linear", "matvec": "Tandem's int8 kernel",
                     "weight_only": "weight-only int8 through torch's matmul",
                     "split": "Tandem's int8 kernel for short steps, fbgemm's int8 GEMM for long ones"}


def default_kernel(device: torch.device, matvec: str = "auto", flags: frozenset[str] | None = None,
                   role: str = "colocated") -> str:
    """The kernel for `device`, the engine's `matvec` setting (Config.matvec), the CPU's `flags` (read from the CPU
    where None) and the worker's `role`, where Tandem's int8 kernel runs here: the kernel where the setting is
    "tandem", or "auto" on a decode worker or a CPU without VNNI; "auto" on a prefilling worker of a CPU with VNNI the
    kernel for short steps and fbgemm for long ones; fbgemm otherwise (the module docstring says why)."""
    if device.type != "cpu":
        return "weight_only"
    if matvec == "torch":
        return "fbgemm"
    library, reason = int8_linear.load()
    if library is None:
        log.warning("int8: fbgemm's linear instead of Tandem's kernel: %s", reason)
        return "fbgemm"
    if matvec == "auto" and role != "decode" and (cpu_flags() if flags is None else flags) & INT8_DOT_PRODUCT_CPU_FLAGS:
        return "split"
    return "matvec"


def kernel_note(kernel: str, matvec: str = "auto", flags: frozenset[str] | None = None,
                role: str = "colocated") -> str:
    """What /info says of the int8 kernel in use and, where `auto` chose it on a CPU, what decided."""
    name = INT8_KERNEL_NAMES[kernel]
    if matvec != "auto" or kernel == "weight_only":
        return name
    vnni = sorted((cpu_flags() if flags is None else flags) & INT8_DOT_PRODUCT_CPU_FLAGS)
    if kernel == "matvec":
        return f"{name}: a decode worker's steps are a few tokens" if role == "decode" else \
            f"{name}: no int8 dot product (VNNI) on this CPU"
    if kernel == "split":
        return f"{name}: this CPU has {', '.join(vnni)}, whose int8 GEMM prefills faster"
    return name


def quantize_per_row(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one float32 scale per row: weight ~ w_int8 * scale[:, None]."""
    # weight: [N, K]  ->  w_int8: [N, K] int8, scale: [N] float32
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / _INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)  # an all-zero row stays 0
    w_int8 = torch.round(w / scale[:, None]).clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    return w_int8, scale


class FbgemmInt8Linear(nn.Module):
    """CPU: per-channel int8 weight prepacked for fbgemm; activations quantized per call (dynamic quantization).

    fbgemm quantizes its input with one range for the whole tensor, so a token with outlier activations would coarsen
    every other token of its batch (SmolLM2's perplexity went from 16.5 to 51.8 that way), and a sequence's output
    would depend on what else is in its batch. So each row is first scaled to max |x| = 1, and two anchor columns
    (-1 and +1, with zero weights) pin the tensor's range to [-1, 1]: every token is quantized alone, on a fixed
    grid, whatever else is in its batch (outputs are batch-invariant), and the row scale is multiplied back after.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w_int8, scale = quantize_per_row(weight)
        anchored = torch.cat((w_int8.cpu(), torch.zeros(self.out_features, 2, dtype=torch.int8)), dim=1)
        with warnings.catch_warnings():  # quantized tensors are deprecated in torch, fbgemm's prepack still takes one
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(
                anchored, scale.double().cpu(), torch.zeros(self.out_features, dtype=torch.long), 0)
        self._packed = torch.ops.quantized.linear_prepack(qweight, None)
        # Without an int8 dot product (VNNI) fbgemm sums pairs of u8 x s8 products in 16 bits, which 8-bit
        # activations can saturate: it takes 7-bit ones there (reduce_range), at some cost in precision.
        self.reduce_range = not (cpu_flags() & INT8_DOT_PRODUCT_CPU_FLAGS)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.register_buffer("anchors", torch.tensor([[-1.0, 1.0]]), persistent=False)
        # What fbgemm keeps for it: the int8 matrix (with the anchor columns), and per output channel a float32
        # scale, an int32 zero point and an int32 column offset.
        self.num_packed_bytes = anchored.numel() + 12 * self.out_features

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "FbgemmInt8Linear":
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., K]  ->  [..., N] in x's dtype
        # Few tensor ops: at batch 1 each costs about as much as a small matmul (max |x| as one norm, no casts or
        # expand where they would do nothing).
        flat = x.reshape(-1, self.in_features)  # [M, K]
        if flat.dtype != torch.float32:
            flat = flat.float()
        row_max = torch.linalg.vector_norm(flat, math.inf, dim=1, keepdim=True).clamp_(
            min=torch.finfo(torch.float32).tiny)  # [M, 1], max |x| per row
        anchors = self.anchors if flat.shape[0] == 1 else self.anchors.expand(flat.shape[0], 2)
        anchored = torch.cat((flat / row_max, anchors), dim=1)  # [M, K + 2]
        y = torch.ops.quantized.linear_dynamic(anchored, self._packed, self.reduce_range).mul_(row_max)  # [M, N]
        if self.bias is not None:
            y += self.bias
        y = y.view(*x.shape[:-1], self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 fbgemm"


class WeightOnlyInt8Linear(nn.Module):
    """Any device (the CUDA path): int8 weight and per-channel scales in memory, dequantized inside the matmul."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w_int8, scale = quantize_per_row(weight)
        self.register_buffer("weight_int8", w_int8.to(weight.device))  # [N, K]
        self.register_buffer("scale", scale.to(weight.device, weight.dtype))  # [N]
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "WeightOnlyInt8Linear":
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., K]  ->  [..., N]
        y = F.linear(x, self.weight_int8.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


class OutputSlice(nn.Module):
    """One projection of a fused one (q of qkv): Hugging Face's own forward calls q_proj, k_proj and v_proj apart,
    and gets exactly the columns of the fused projection (each output column is computed alone). The engine calls
    the fused module once instead."""

    def __init__(self, fused: nn.Module, start: int, end: int):
        super().__init__()
        self.fused, self.start, self.end = fused, start, end

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused(x)[..., self.start:self.end]


class Int8GatedMLP(nn.Module):
    """Llama's gated MLP with gate and up fused into one int8 projection: down(act(gate(x)) * up(x))."""

    def __init__(self, mlp: nn.Module, make_linear):
        super().__init__()
        self.intermediate_size = mlp.gate_proj.out_features
        self.gate_up_proj = make_linear(*_fused(mlp.gate_proj, mlp.up_proj))
        self.down_proj = make_linear(*_fused(mlp.down_proj))
        self.act_fn = mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., hidden] -> [..., hidden]
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


def _fused(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = torch.cat([lin.weight.detach() for lin in linears])
    if all(lin.bias is None for lin in linears):
        return weight, None
    return weight, torch.cat([lin.bias.detach() if lin.bias is not None else weight.new_zeros(lin.out_features)
                              for lin in linears])


class Int8Matrix(nn.Module):
    """One int8 [V, H] matrix with per-row scales, held once for a tied embedding and lm_head."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        w_int8, scale = quantize_per_row(weight)
        self.register_buffer("weight_int8", w_int8.to(weight.device))  # [V, H]
        self.register_buffer("scale", scale.to(weight.device))  # [V] float32


class Int8Embedding(nn.Module):
    """Embedding lookup from int8 rows: gather, then scale each row (only the gathered rows are dequantized)."""

    def __init__(self, matrix: Int8Matrix, dtype: torch.dtype):
        super().__init__()
        self.matrix, self.dtype = matrix, dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [...]  ->  [..., H]
        m = self.matrix
        rows = F.embedding(input_ids, m.weight_int8).to(torch.float32)  # [..., H]
        return (rows * F.embedding(input_ids, m.scale[:, None])).to(self.dtype)


class Int8TiedLMHead(nn.Module):
    """lm_head over the shared int8 matrix. `int_mm` (CPU): activations quantized per token (symmetric int8), an
    int8 x int8 -> int32 matmul, then both scales; `weight_only`: dequantize inside the matmul."""

    def __init__(self, matrix: Int8Matrix, kernel: str):
        super().__init__()
        self.matrix, self.kernel = matrix, kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., H]  ->  logits [..., V]
        m = self.matrix
        if self.kernel == "weight_only":
            return F.linear(x, m.weight_int8.to(x.dtype)) * m.scale.to(x.dtype)
        flat = x.reshape(-1, x.shape[-1]).float()  # [M, H]
        x_scale = (flat.abs().amax(dim=1, keepdim=True) / _INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
        x_int8 = torch.round(flat / x_scale).to(torch.int8)  # [M, H], |values| <= 127 by construction
        logits = torch._int_mm(x_int8, m.weight_int8.t()).float() * x_scale * m.scale  # [M, V]
        return logits.view(*x.shape[:-1], -1).to(x.dtype)


def quantize_model(model, *, kernel: str) -> None:
    """Swap every nn.Linear of the decoder layers and lm_head (and the embedding table) for int8 modules, in place.

    0. fbgemm (activations quantized too): SmoothQuant first (smooth_activations).
    1. Attention: q, k and v fused into one int8 projection `qkv_proj` (one matmul, one activation quantization),
       with q_proj, k_proj and v_proj left as slices of it; o_proj int8.
    2. MLP: gate and up fused (Int8GatedMLP), down int8.
    3. Tied embedding and lm_head: one shared Int8Matrix behind both. Untied: lm_head as the other linears, the
       embedding table an Int8Matrix of its own.
    The float weights are dropped with the modules they belonged to.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    make_linear = _linear_maker(kernel)
    if kernel in ("fbgemm", "split"):
        smooth_activations(model)
    body = model.model
    for layer in body.layers:
        attn = layer.self_attn
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        attn.qkv_proj = make_linear(*_fused(*projections))
        start = 0
        for name, projection in zip(("q_proj", "k_proj", "v_proj"), projections):
            setattr(attn, name, OutputSlice(attn.qkv_proj, start, start + projection.out_features))
            start += projection.out_features
        attn.o_proj = make_linear(*_fused(attn.o_proj))
        layer.mlp = Int8GatedMLP(layer.mlp, make_linear)
        assert not any(isinstance(m, nn.Linear) for m in layer.modules()), "a float linear was left in the layer"
    embed = body.embed_tokens
    dtype = embed.weight.dtype
    tied = model.lm_head.weight is embed.weight
    matrix = Int8Matrix(embed.weight)
    body.embed_tokens = Int8Embedding(matrix, dtype)
    if tied and kernel in ("matvec", "split"):  # the kernel reads the shared matrix as it is (a prompt's last token)
        model.lm_head = MatVecInt8Linear(int8_linear.load()[0], matrix.weight_int8, matrix.scale)
    elif tied:
        model.lm_head = Int8TiedLMHead(matrix, "int_mm" if kernel == "fbgemm" else "weight_only")
    else:
        model.lm_head = make_linear(*_fused(model.lm_head))
    # Hugging Face would re-tie (or re-init) lm_head to a float embedding if asked; nothing here asks it again.
    model.config.tie_word_embeddings = False


def _linear_maker(kernel: str):
    """(weight [N, K], bias [N] or None) -> the kernel's int8 linear."""
    if kernel == "fbgemm":
        return FbgemmInt8Linear
    if kernel == "weight_only":
        return WeightOnlyInt8Linear
    library, reason = int8_linear.load()
    if library is None:
        raise RuntimeError(f"int8 kernel matvec cannot run here: {reason}")

    def make(weight: torch.Tensor, bias: torch.Tensor | None = None) -> MatVecInt8Linear:
        w_int8, scale = quantize_per_row(weight)
        if kernel == "split":
            return SplitInt8Linear(library, w_int8.cpu(), scale.cpu(), bias, FbgemmInt8Linear(weight, bias))
        return MatVecInt8Linear(library, w_int8.cpu(), scale.cpu(), bias)
    return make


def weight_bytes(model) -> int:
    """Bytes of the weights the model holds: every parameter and buffer storage once (tied ones once), plus what
    fbgemm keeps for its prepacked linears (opaque to torch, accounted by layout)."""
    seen, total = set(), 0
    for tensor in (*model.parameters(), *model.buffers()):
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.device)
        if key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total + sum(m.num_packed_bytes for m in model.modules() if isinstance(m, FbgemmInt8Linear))
