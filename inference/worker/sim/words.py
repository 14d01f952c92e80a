"""The simulated worker's tokens: one per whitespace-separated word of a prompt, and generated ones that cycle through
a fixed vocabulary, so that text is easy to recognise (" sim tok alpha ...")."""
from __future__ import annotations

import zlib

from inference.worker.detokenize import Delta

WORDS = ("sim", "tok", "alpha", "beta", "gamma", "delta", "echo", "fox", "golf", "hotel", "india", "juliet")


def tokenize(text: str, vocab_size: int) -> list[int]:
    """A trivial tokenizer: one token per whitespace-separated word, its id a hash of the word."""
    return [zlib.crc32(word.encode()) % (vocab_size - 1) + 1 for word in text.split()]


def token_id(index: int, vocab_size: int) -> int:
    """The id of a request's index-th generated token: the words cycle."""
    return (index % len(WORDS)) % vocab_size


def token_text(token: int) -> str:
    return " " + WORDS[token % len(WORDS)]


class SimText:
    """A request's generated text (a TextDecoder, as the real detokenizer): each token's word, cut at a stop string.

    As OpenAI: the stop string and what follows are not returned. Text is never held back here, so a stop string
    that spans tokens cuts only the token that completes it."""

    def __init__(self, stop: list[str]):
        self.stop = [s for s in stop if s]
        self.text = ""

    def add(self, token_id: int) -> Delta:
        text = token_text(token_id)
        before = len(self.text)
        self.text += text
        cuts = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            self.text = self.text[:min(cuts)]
            return Delta(text[:max(0, min(cuts) - before)], stopped=True)
        return Delta(text, stopped=False)

    def flush(self) -> str:
        return ""
