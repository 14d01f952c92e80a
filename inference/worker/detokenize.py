"""Incremental detokenization and stop strings, in the worker that produces the tokens (docs/contracts.md).

Decoding one token at a time is wrong for two reasons, both handled here the way vLLM does:
- a byte-level BPE token can hold part of a UTF-8 character; its text is held back (empty delta) until the character
  completes, rather than emitted as U+FFFD;
- tokenizers that merge a leading space into the next word need the previous tokens as context, so each delta is
  the difference of two decodes over a short sliding window (prefix_offset..read_offset).

Stop strings: after every token the text is searched for each stop string (only the tail that could contain a new
match); on a match the text is cut before it and the sequence finishes. While running, the last
len(longest stop) - 1 characters are held back, so that a streaming client never receives the start of a stop string
that a later token completes: the streamed text always equals the final text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Prompt tokens used as decoding context for the first generated tokens (enough for any merge of a leading space).
CONTEXT_TOKENS = 6
REPLACEMENT_CHAR = "\ufffd"


@dataclass(slots=True)
class Delta:
    text: str  # newly releasable text (may be empty)
    stopped: bool  # a stop string matched: the sequence must finish with finish_reason "stop"


class TextDecoder(Protocol):
    """What the engine side asks of a request's text: this module's detokenizer, or the simulated engine's words."""

    def add(self, token_id: int) -> Delta: ...

    def flush(self) -> str: ...


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text deltas, and watches for its stop strings.

    `context_token_ids`: tokens before the first one passed to `add` (the prompt; on a decode worker, the prompt and
    the first token). `emitted_text`: text of generated tokens already sent by someone else (the prefill worker's
    first token), which stop strings may still span.
    """

    def __init__(self, tokenizer, context_token_ids: list[int], stop: list[str] | tuple[str, ...] = (),
                 emitted_text: str = ""):
        self.tokenizer = tokenizer
        self.token_ids = list(context_token_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.token_ids)
        self.stop = [s for s in stop if s]
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1
        self.text = emitted_text  # all decoded text of generated tokens so far (trimmed at a stop string)
        self.num_emitted = len(emitted_text)  # characters of self.text already released to the client
        self.stopped = False

    def add(self, token_id: int) -> Delta:
        """Append one generated token; return the text that may be released now."""
        assert not self.stopped, "no tokens after a stop string"
        self.token_ids.append(token_id)
        prefix = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT_CHAR):
            new_text = full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            search_from = max(0, len(self.text) - self.hold_back)
            self.text += new_text
            if self._cut_at_stop(search_from):
                return Delta(self._release(len(self.text)), stopped=True)
        return Delta(self._release(len(self.text) - self.hold_back), stopped=False)

    def flush(self) -> str:
        """The sequence finished (length, EOS, abort): release what was held back, incomplete bytes included."""
        if not self.stopped and self.read_offset < len(self.token_ids):
            # A trailing partial character: emit what the tokenizer makes of it rather than drop tokens silently.
            prefix = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
            full = self._decode(self.token_ids[self.prefix_offset:])
            self.text += full[len(prefix):]
            self.read_offset = len(self.token_ids)
        return self._release(len(self.text))

    def _cut_at_stop(self, search_from: int) -> bool:
        cut = None
        for s in self.stop:
            i = self.text.find(s, search_from)
            if i != -1 and (cut is None or i < cut):
                cut = i
        if cut is None:
            return False
        # A stop string that began inside text already sent (the prefill's first token) cannot be unsent.
        self.text = self.text[:max(cut, self.num_emitted)]
        self.stopped = True
        return True

    def _release(self, upto: int) -> str:
        if upto <= self.num_emitted:
            return ""
        out = self.text[self.num_emitted:upto]
        self.num_emitted = upto
        return out

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
