"""All device code of the engine, put together: the model, its kernel plan, the paged KV cache, and one forward per
step.

The runner loads a Hugging Face causal LM, decides once which kernels run it (kernel_plan.py), prepares the weights
for them (INT8, the weight layout, packed copies), sizes the KV pool (kv_pool.py), and runs each step: its inputs
(step_inputs.py) through the lean forward (lean_decode.py, its decode layers in one C call where they run) or the
reference forward over the model's own modules (reference_forward.py), then the LM head and the sampler.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from inference.engine.compilation import compile_decode, padded_batch_size, pads_decode_batch
from inference.engine.config import Config
from inference.engine.fusion import transpose_weights
from inference.engine.interleave import Pause
from inference.engine.kernel_plan import KernelPlan, matvec_info, plan_kernels
from inference.engine.kernels.decode_layers import bind as bind_decode_layers
from inference.engine.kv_pool import KVPool
from inference.engine.lean_decode import LeanDecoder, norm_lm_head, unsupported_reason as lean_unsupported_reason
from inference.engine.model_loading import eos_token_ids, load_model, model_shape, resolve_max_model_len
from inference.engine.packed_weights import WeightPacker, packed_bytes
from inference.engine.precision import TORCH_DTYPES, choose_dtypes
from inference.engine.quantization import quantize_model, weight_bytes
from inference.engine.reference_forward import ReferenceForward
from inference.engine.sampler import Sampler
from inference.engine.sequence import Sequence
from inference.engine.speculation_forward import SpecDecoder
from inference.engine.step_inputs import StepInputs, prefill_chunks
from inference.engine.step_ops import count_decode_step_ops
from inference.roles import Role


class ModelRunner:
    def __init__(self, config: Config):
        """1. Precision (precision.choose_dtypes: the dtype that runs, the KV cache's), then the model.
        2. The kernel plan, decided once (kernel_plan.plan_kernels), and the weights prepared for it.
        3. The KV pool, the forwards, a compiled decode step where asked (a warm-up that fails leaves an eager
           engine, planned as such), the decode layers bound to the model."""
        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {config.device} was asked for, but this torch build or host has no CUDA")
        # The dtype that runs (config.dtype, "auto" resolved) and the KV cache's, which the KV handoff uses too; a KV
        # dtype that does not suit is refused before the load.
        choice, kv_choice = choose_dtypes(config.dtype, config.kv_cache_dtype, config.model, self.device,
                                          allow_slow_float16=config.allow_slow_float16,
                                          quantization=config.quantization)
        self.dtype_name, self.dtype_reason = choice.name, choice.reason
        self.dtype = TORCH_DTYPES[self.dtype_name]
        self.kv_dtype_name, self.kv_dtype_reason = kv_choice.name, kv_choice.reason
        self.kv_dtype = TORCH_DTYPES[self.kv_dtype_name]
        self.model = model = load_model(config.model, self.dtype, self.device)
        self.shape = shape = model_shape(model.config)
        self.vocab_size = shape.vocab_size
        self.eos_token_ids = eos_token_ids(model)

        plan = self._plan(config)
        if plan.int8_kernel:
            quantize_model(model, kernel=plan.int8_kernel)
        if plan.weight_layout == "transposed":
            transpose_weights(model)
        self.packer = WeightPacker() if plan.packs_weights else None
        self.norm_lm_head = norm_lm_head(model, plan.matvec, self.packer)  # [B, hidden] -> logits [B, V]

        self.pool = pool = KVPool(config, shape, self.kv_dtype, self.kv_dtype_name, self.device,
                                  configured_max_model_len=resolve_max_model_len(model.config, config.max_model_len),
                                  padded=pads_decode_batch(config, self.device))
        self.k_cache, self.v_cache, self.num_blocks = pool.k_cache, pool.v_cache, pool.num_blocks
        # The block padding rows of a compiled CUDA step write into (compilation.py), None where nothing is padded.
        self.scratch_block = pool.scratch_block
        self.inputs = StepInputs(pool, self.device)
        self.sampler = Sampler(self.device)
        self.reference = ReferenceForward(model, pool, self.dtype)
        self._forward = self.reference.forward
        self._compiled_decode_forward = None
        self.compile_info: dict = {"enabled": False, "backend": None, "mode": None, "warmup_s": 0.0, "fallback": None,
                                   "num_warmup_steps": 0, "pads_batch": False}
        if config.compile and config.role is Role.PREFILL:
            self.compile_info["fallback"] = "a prefill engine runs no decode step: nothing to compile"
        elif config.compile:
            self._compiled_decode_forward, self.compile_info = compile_decode(self._forward, pool)
            if self._compiled_decode_forward is None and plan.compiled_decode:
                plan = self._plan(replace(config, compile=False))
        self.plan: KernelPlan = plan
        # The lean forward (lean_decode.py): fewer ops per step, the same values as the reference.
        self.lean_decoder = LeanDecoder(model, plan, self.packer, pool, self.dtype) if plan.lean else None
        self.weight_bytes = weight_bytes(model) + packed_bytes(self.packer)  # as held now, packed copies too
        fused, self.fused_decode_reason = bind_decode_layers(
            plan, model, pool.k_cache, pool.v_cache, dtype=self.dtype, num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim)
        if self.lean_decoder is not None:
            self.lean_decoder.fused = fused
        # /info's `matvec`: the kernels and why (kernel_plan.matvec_info).
        self.matvec_info = matvec_info(plan, self.fused_decode_reason, self.packer)
        # Whether a step can stop between layers for a prefill (interleave.py): the lean forward's can, so a decode
        # step that is not compiled, and prefill and mixed steps where lean_prefill is on.
        self.can_pause = self.lean_decoder is not None and self._compiled_decode_forward is None
        # Tensor ops of one single-stream decode step (step_ops.py); a prefill engine runs none.
        eager = self.lean_decoder.forward if self.lean_decoder else self._forward
        self.decode_step_ops = (count_decode_step_ops(eager, self.norm_lm_head, pool, plan)
                                if config.role is not Role.PREFILL else None)

    def _plan(self, config: Config) -> KernelPlan:
        reason = lean_unsupported_reason(self.model) if config.lean_decode else None
        return plan_kernels(config, self.device, dtype=self.dtype, kv_dtype=self.kv_dtype,
                            head_dim=self.shape.head_dim, lean_reason=reason)

    @property
    def int8_kernel(self) -> str | None:
        return self.plan.int8_kernel  # quantization.KERNELS, or None for float weights

    def spec_decoder(self, num_draft_layers: int | None) -> SpecDecoder:
        """The forwards of speculative decode steps over this runner's parts (speculation_forward.py)."""
        return SpecDecoder(inputs=self.inputs, forward=self._forward, head=self.norm_lm_head, sampler=self.sampler,
                           plan=self.plan, decode=functools.partial(self.run, is_prefill=False),
                           num_draft_layers=num_draft_layers)

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool, pause: Pause | None = None) -> list[int | None]:
        """One step: each sequence's scheduled tokens (a whole prompt, a prefill chunk, or its one decode token) in
        one forward. A prefill step lists its prefill chunks first, then any decodes (a mixed chunked step). `pause`:
        the step may stop between layers for a prefill (interleave.py; the lean forward's steps only).

        Returns, per sequence, the sampled token id, or None for a chunk that does not reach the end of its tokens.
        """
        if is_prefill:
            num_prefill = sum(1 for seq in seqs if seq.is_prefilling)
            assert all(seq.is_prefilling for seq in seqs[:num_prefill]), "prefill chunks come before decodes"
            prefill, decode = seqs[:num_prefill], seqs[num_prefill:]
        else:
            self.pool.import_kv(seqs)
            prefill, decode = [], seqs
        input_ids, positions, slot_mapping, attention = self._prepare(prefill, decode)
        if prefill:  # the lean forward where it is built and on for prefill (exact), else the reference
            forward = self.lean_decoder.forward if self.lean_decoder and self.config.lean_prefill else self._forward
        else:
            forward = self._compiled_decode_forward or (self.lean_decoder.forward if self.lean_decoder
                                                        else self._forward)
        if pause is not None and self.lean_decoder is not None and forward == self.lean_decoder.forward:
            forward = functools.partial(forward, pause=pause)
        else:
            pause = None
        hidden = forward(input_ids, positions, slot_mapping, attention)  # [T, hidden]
        # Logits only at the last position of each sequence that samples (decodes, and chunks that end a prompt).
        sampling = [seq for seq in seqs if seq.samples_next_token]
        if len(sampling) != hidden.shape[0]:
            last_rows, row = [], 0
            for seq in seqs:
                row += seq.num_scheduled_tokens
                if seq.samples_next_token:
                    last_rows.append(row - 1)
            hidden = hidden.index_select(0, self.inputs.tensor(last_rows))  # [B, hidden]
        token_ids = iter(self._sample(hidden, sampling, pause) if sampling else [])
        if is_prefill and self.config.role is Role.PREFILL:
            self.pool.export_kv([seq for seq in prefill if seq.samples_next_token])
        return [next(token_ids) if seq.samples_next_token else None for seq in seqs]

    def _prepare(self, prefill: list[Sequence], decode: list[Sequence]):
        """input_ids, positions, slot_mapping ([T] each) and the attention of a step (step_inputs.py), with the rows
        that pad a compiled CUDA decode step's batch to its bucket (compilation.padded_batch_size)."""
        compiled = self._compiled_decode_forward is not None
        num_padding = 0
        if not prefill and decode and self.scratch_block is not None and compiled:
            num_padding = padded_batch_size(len(decode)) - len(decode)
        return self.inputs.prepare(prefill_chunks(prefill), decode, self.plan, num_padding=num_padding,
                                   pad_tables=compiled)

    def _sample(self, hidden: torch.Tensor, sampling: list[Sequence], pause: Pause | None) -> list[int]:
        """The LM head and the sampler over the step's sampling rows. A step that may pause looks at the arrivals
        flag after its last layer, between the head's parts (where Tandem's kernel runs it) and before sampling: the
        tail of a decode step (a sizeable share of a small model's step of a few streams) is no longer a stretch that
        an arrival waits out."""
        if pause is None:
            return self.sampler(self.norm_lm_head(hidden).float(), sampling)
        pause.check()
        logits = self.norm_lm_head(hidden, pause).float()
        pause.check()
        return self.sampler(logits, sampling)
