"""A request's prefill between the layers of the step under way, so that its first token does not wait for the step.

A colocated CPU worker serving several streams runs a step every few dozen milliseconds, a mixed step with a resumed
stream's chunk more; a request that arrived during one waited, before this, for the step to end and then for its own
prefill (alone, or as a chunk of the next mixed step, which costs about a decode step more): a short request beside
running streams saw its time to first token grow well past its unloaded value (bench/engine/arrival_ttft.py; the
figures: docs/performance.md, "A quiet request's path, traced"). Now the engine loop raises `Arrivals` when it queues a
request (or an abort, which may make room for one); the step looks at it between layers (decode_layers.c reads the flag
itself in a step whose layers run in one C call, the lean forward in Python in the others), then after its last
layer, between parts of the LM head (matvec.PAUSE_ROWS) and before sampling (ModelRunner._sample), and where it is
raised, the step pauses: the engine loop takes the new commands, the engine prefills what can start now
(step_pause.StepPause.prefill_between: the waiting requests, best band first, then the tenant holding fewest sequences,
one tenant's per prefill, whose whole prompt fits what is left of the step's budget, up to the sequences the running
batch frees by the aborts that came in), their first tokens go out at once, and the step goes on from the layer where it
stopped. No step's work is thrown away, and the paused step's values are the same as without the pause: its K/V slots
and hidden states are its own, and the prefill writes only the new sequences' blocks.

What it costs: the running streams' next token waits for the prefill, as it did when the prefill went first at the
step's end. The budget is the paused step's, however many pauses it takes: in chunked mode the chunk beside decodes
(`prefill_chunk_size`), so a stream never waits for more prompt tokens in one step than in a mixed step; without
chunks the prefill token budget. A prefill between layers is a pass over the weights of its own where a mixed step
shares the decodes' pass: the long streams' tokens/s drop a little under a steady trickle of short requests
(docs/performance.md, "A quiet request's path, traced").

An aborted sequence that is part of the paused step stays in it until the step ends (its K/V slots are being
written); its blocks are freed then, and the prefill may take its place in the running batch meanwhile. The pause
nests: a prefill between layers pauses on the same flag, so a request arriving during it that outranks it (a better
band, or a tenant holding fewer sequences) is prefilled between that prefill's layers (StepPause.prefill_between),
within what is left of the paused step's budget; its sequences are in flight like the paused step's until the step
ends.

In chunked mode the same prefill runs at a step's start (step_pause.StepPause.prefill_first) when requests are already
queued beside running streams: one that came in the previous step's tail, after its last layer, would otherwise ride the
next mixed step, whose first token waits for every stream's decode too.
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
    """What a step's forward looks at between layers: the flag, and what to run when it is raised (the engine's: it
    lowers the flag, then calls the engine loop, which may prefill between the layers)."""

    arrivals: Arrivals
    between: Callable[[], None]

    def check(self) -> None:
        if self.arrivals:
            self.between()
