"""The requests the real engine holds, from admission to their last event, on the engine's thread (engine_loop.py).

Admission hands a request to the engine, or rejects it alone (the engine's ValueError); each step's outputs become
the requests' events, detokenized, with stop strings seen across tokens; a request that cannot go on fails alone, and
a broken engine fails them all. Tokens, first-token and inter-token times are counted here, as they are emitted.

A resumed request (docs/contracts.md, `resume_token_ids`: the gateway continues a request whose worker died) carries
the tokens generated before after its prompt. They are replayed through the detokenizer, so that it releases exactly
the text the client has not received yet, and count against max_tokens and as completion tokens; a replay that
already ends the request (a stop string, EOS, max_tokens) finishes it without the engine.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from inference.metrics import TandemMetrics
from inference.roles import Role
from inference.worker.detokenize import IncrementalDetokenizer
from inference.worker.engine_request import EngineRequest, Event

log = logging.getLogger(__name__)


class OpenRequests:
    """The engine's open requests by id. `on_freed` runs when a request's blocks are freed before its last event (a
    stop string), so that the stats a client scrapes after "done" never show them in use."""

    def __init__(self, engine, metrics: TandemMetrics, *, role: Role, on_freed: Callable[[], None]) -> None:
        self.engine, self.metrics, self.role, self.on_freed = engine, metrics, role, on_freed
        self._open: dict[str, EngineRequest] = {}

    def admit(self, req: EngineRequest) -> None:
        """Hand a request to the engine; the engine's ValueError (it checks the request too) rejects it alone."""
        engine = self.engine
        try:
            if req.request_id in self._open:
                raise ValueError(f"request_id {req.request_id!r} is already running on this worker")
            detok = IncrementalDetokenizer(engine.tokenizer, req.prompt_token_ids[:req.num_prompt_tokens], req.stop)
            finish_reason = self._replay(detok, req)
            if finish_reason is not None:
                self._finish_replayed(req, detok, finish_reason)
                return
            # The engine's prompt holds the resumed tokens; its budget is what is left of the request's.
            params = replace(req.params, max_tokens=req.params.max_tokens - req.num_resumed_tokens)
            if req.first_token_id is None:
                engine.add_request(req.request_id, req.prompt_token_ids, params,
                                   num_resumed_tokens=req.num_resumed_tokens, cache_salt=req.cache_salt,
                                   priority=req.priority, itl_target_s=req.itl_target_s)
            else:
                # Replay the prefill worker's first token through an identical detokenizer, so that this one
                # releases exactly the text the prefill worker did not (and sees stop strings spanning it).
                detok.add(req.first_token_id)
                engine.add_prefilled(req.request_id, req.prompt_token_ids, req.first_token_id, params, *req.kv,
                                     num_resumed_tokens=req.num_resumed_tokens, cache_salt=req.cache_salt,
                                     priority=req.priority, itl_target_s=req.itl_target_s)
                req.kv = None  # the engine holds it now; drop our reference
        except ValueError as exc:
            req.emit(Event("rejected", message=str(exc)))
            return
        except Exception as exc:  # an engine bug on admission fails this request, not the loop
            log.exception("admitting %s failed", req.request_id)
            engine.abort(req.request_id)
            self.metrics.count_error("engine")
            req.emit(Event("error", message=f"the engine failed to admit the request: {exc}", kind="engine"))
            return
        req.detok, req.num_completion_tokens = detok, req.num_resumed_tokens
        if req.first_token_id is not None:
            req.num_completion_tokens += 1
            req.last_token_at = time.monotonic()
        self._open[req.request_id] = req
        self.metrics.prompt_tokens.inc(req.num_prompt_tokens)
        req.emit(Event("admitted", num_prompt_tokens=req.num_prompt_tokens))

    def _replay(self, detok: IncrementalDetokenizer, req: EngineRequest) -> str | None:
        """Feed a resumed request's earlier tokens to its detokenizer (their text was sent already); return the
        finish reason if they already end the request, else None."""
        resumed = req.prompt_token_ids[req.num_prompt_tokens:]
        for token_id in resumed:
            if detok.add(token_id).stopped:
                return "stop"
        if resumed and not req.params.ignore_eos and resumed[-1] in self.engine.model_runner.eos_token_ids:
            return "stop"
        if resumed and len(resumed) >= req.params.max_tokens:
            return "length"
        return None

    def _finish_replayed(self, req: EngineRequest, detok: IncrementalDetokenizer, finish_reason: str) -> None:
        """A resumed request whose old worker died between its last token and its finish: release what that worker
        held back and finish, as it would have."""
        text = detok.flush()
        self.metrics.prompt_tokens.inc(req.num_prompt_tokens)
        self.metrics.count_success(finish_reason)
        req.emit(Event("admitted", num_prompt_tokens=req.num_prompt_tokens))
        counts = dict(num_prompt_tokens=req.num_prompt_tokens, num_completion_tokens=req.num_resumed_tokens)
        if self.role is Role.PREFILL:  # the prefill handler answers "finished" with no first token
            req.emit(Event("token", token_ids=[], text=text, finish_reason=finish_reason, **counts))
        else:
            req.emit(Event("done", text=text, finish_reason=finish_reason, **counts))

    def abort(self, request_id: str) -> None:
        """Its handler went away: the engine forgets it (one that already ended needs nothing)."""
        if self._open.pop(request_id, None) is not None:
            self.engine.abort(request_id)

    def deliver_all(self, outputs) -> None:
        """A step's outputs, as events to their requests."""
        for out in outputs:
            try:
                self._deliver(out)
            except Exception as exc:  # detokenizing one request went wrong: fail that request alone
                log.exception("delivering %s failed", out.request_id)
                self._fail_one(out.request_id, f"worker error while detokenizing: {exc}")

    def _deliver(self, out) -> None:
        req = self._open.get(out.request_id)
        if req is None:  # aborted by its handler; the engine's "abort" output needs no answer
            return
        now = time.monotonic()
        text, stopped = "", False
        token_ids = []
        for token_id in out.new_token_ids:
            token_ids.append(token_id)
            delta = req.detok.add(token_id)
            text += delta.text
            if delta.stopped:
                stopped = True
                break
        finish_reason = "stop" if stopped else (out.finish_reason if out.finished else None)
        if finish_reason is not None and not stopped:
            text += req.detok.flush()
        self._observe_tokens(req, len(token_ids), now)
        if stopped and out.finish_reason is None:
            # A stop string: free the blocks now, not at max_tokens, and before the client hears "done", so that
            # a scrape after it never sees them in use.
            self.engine.abort(req.request_id)
            self.on_freed()
        if token_ids:
            is_handoff = self.role is Role.PREFILL and finish_reason is None
            req.emit(Event("token", token_ids=token_ids, text=text, kv=out.kv if is_handoff else None,
                           finish_reason=finish_reason if self.role is Role.PREFILL else None,
                           num_prompt_tokens=req.num_prompt_tokens,
                           num_completion_tokens=req.num_completion_tokens))
            if is_handoff:  # the engine forgot this request: its K/V now travels with the event
                del self._open[req.request_id]
                return
        if finish_reason is None:
            return
        del self._open[req.request_id]
        if finish_reason == "abort":
            req.emit(Event("error", message="the request was aborted", kind="abort"))
            return
        self.metrics.count_success(finish_reason)
        self.metrics.e2e_request_latency.observe(now - req.arrival)
        if self.role is not Role.PREFILL:
            req.emit(Event("done", text=text if not token_ids else "", finish_reason=finish_reason,
                           num_prompt_tokens=req.num_prompt_tokens,
                           num_completion_tokens=req.num_completion_tokens))

    def _observe_tokens(self, req: EngineRequest, num_tokens: int, now: float) -> None:
        if not num_tokens:
            return
        self.metrics.generation_tokens.inc(num_tokens)
        if req.last_token_at is None:
            self.metrics.time_to_first_token.observe(now - req.arrival)
        else:
            self.metrics.inter_token_latency.observe(now - req.last_token_at)
        req.num_completion_tokens += num_tokens
        req.last_token_at = now

    def fail_all(self, kind: str, message: str, *, abort: bool) -> None:
        """Every open request gets an error event (`abort`: the engine forgets each first)."""
        for request_id, req in list(self._open.items()):
            if abort:
                try:
                    self.engine.abort(request_id)
                except Exception:  # the engine is already in trouble; the request fails either way
                    log.exception("abort of %s failed", request_id)
            req.emit(Event("error", message=message, kind=kind))
            self.metrics.count_error(kind)
        self._open.clear()

    def _fail_one(self, request_id: str, message: str) -> None:
        req = self._open.pop(request_id, None)
        if req is None:
            return
        self.engine.abort(request_id)
        self.metrics.count_error("engine")
        req.emit(Event("error", message=message, kind="engine"))

