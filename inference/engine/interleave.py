"""A request's prefill between a decode step's layers, so that its first token does not wait for the step.

A colocated engine's decode step of 8 SmolLM2 sequences on one CPU thread takes ~50-70 ms in float32; a request that
arrives during it waited, before this, for the step to end and then for its own prefill (alone, or as chunks of a
mixed step beside the decodes, which costs about a whole decode step): a quiet tenant's 5-token request measured 2x
its unloaded time to first token at P50 beside a flood, up to 3x at P99 (bench/gateway/tenants.py). Now the engine
loop raises `Arrivals` when it queues a request (or an abort, which may make room for one); the decode step looks at
it between layers (decode_layers.c reads the flag itself, the lean forward in Python), and where it is raised, the
step pauses: the engine loop takes the new commands, the engine prefills what can start now (LLMEngine.prefill_between:
the waiting requests, best band first, whose whole prompt fits the step budget, up to the sequences the running
batch frees by the aborts that came in), the first tokens go out at once, and the decode step goes on from the layer
where it stopped. No step's work is thrown away, and the decode step's values are the same as without the pause:
its K/V slots and its hidden states are its own, and the prefill writes only the new sequences' blocks.

What it costs: the running streams' next token waits for the prefill, as it did when the prefill went first at the
step's end; in chunked mode only a prompt that fits the chunk beside decodes (`prefill_chunk_size`) is prefilled
between layers, so a stream never waits for more than that chunk at once, as in a mixed step. A prefill between
layers is a pass over the weights of its own, where a mixed step shares the decodes' pass: throughput under a
steady stream of arrivals is measured in docs/performance.md.

An aborted sequence that is part of the paused step stays in it until the step ends (its K/V slots are being
written); its blocks are freed then, and the prefill may take its place in the running batch meanwhile.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass


class Arrivals:
    """A flag any thread raises when it hands the engine loop a command; a paused decode step lowers it. The C layer
    loop reads the int itself (`address`), without the GIL."""

    __slots__ = ("_flag", "address")

    def __init__(self) -> None:
        self._flag = ctypes.c_int32(0)
        self.address = ctypes.addressof(self._flag)

    def raise_(self) -> None:
        self._flag.value = 1

    def lower(self) -> None:
        self._flag.value = 0

    def __bool__(self) -> bool:
        return bool(self._flag.value)


@dataclass(slots=True)
class Pause:
    """What a decode step's forward looks at between layers: the flag, and what to run when it is raised (the
    engine's: it lowers the flag, then prefills between the layers)."""

    arrivals: Arrivals
    between: Callable[[], None]

    def check(self) -> None:
        if self.arrivals:
            self.between()
