"""Where the worker tokenizes (inference/worker/model_engine.py): a short prompt on the event loop itself (no thread
hops), a long one on the tokenizer thread (the loop is never held by a big prompt), a short one on that thread too
while it is busy, and never two calls inside the tokenizer at once; the same token ids either way."""
from __future__ import annotations

import asyncio
import threading

import pytest
from transformers import AutoTokenizer

from inference.metrics import TandemMetrics
from inference.worker import model_engine
from inference.worker.config import parse_args
from inference.worker.model_engine import ModelEngine


class RecordingTokenizer:
    """The real tokenizer, recording on which thread each call ran and how many ran at once; `hold` keeps a call of
    a prompt starting with "hold" inside the tokenizer until it is set."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.threads: list[str] = []
        self.inside = self.most_inside = 0
        self.hold = threading.Event()
        self.held = threading.Event()
        self._count = threading.Lock()

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)

    def encode(self, text: str, **kwargs) -> list[int]:
        with self._count:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            self.threads.append(threading.current_thread().name)
            if text.startswith("hold"):
                self.held.set()
                assert self.hold.wait(30), "the test never let the held call go"
            return self._tokenizer.encode(text, **kwargs)
        finally:
            with self._count:
                self.inside -= 1


@pytest.fixture
def tokenizing(tiny_model_dir):
    config = parse_args(["--role", "colocated", "--model", str(tiny_model_dir), "--port", "1"])
    engine = ModelEngine(config, TandemMetrics(role="colocated", model="tiny"))
    real = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    engine.tokenizer = RecordingTokenizer(real)
    yield engine, real
    engine.tokenizer.hold.set()
    engine._tokenize_executor.shutdown(wait=True)


def test_a_short_prompt_is_tokenized_on_the_loop_and_a_long_one_on_the_tokenizer_thread(tokenizing):
    engine, real = tokenizing
    short, long = "one two three four", "word " * (model_engine.INLINE_TOKENIZE_CHARS // 5 + 1)
    chat = [{"role": "user", "content": "What is the capital of France?"}]

    async def main() -> tuple[list[int], list[int], list[int], str]:
        return (await engine.tokenize(short, None), await engine.tokenize(long, None),
                await engine.tokenize(None, chat), threading.current_thread().name)

    got_short, got_long, got_chat, loop_thread = asyncio.run(main())
    assert got_short == real.encode(short) and got_long == real.encode(long)
    assert got_chat == real.encode(real.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
                                   add_special_tokens=False)
    threads = engine.tokenizer.threads
    assert threads[0] == loop_thread and threads[2] == loop_thread, threads
    assert threads[1].startswith("tokenize"), threads


def test_while_the_tokenizer_thread_is_busy_a_short_prompt_waits_its_turn_there(tokenizing):
    engine, real = tokenizing
    tokenizer = engine.tokenizer
    held = "hold " + "word " * (model_engine.INLINE_TOKENIZE_CHARS // 5)

    async def main() -> tuple[list[int], list[int], bool]:
        first = asyncio.ensure_future(engine.tokenize(held, None))
        assert await asyncio.to_thread(tokenizer.held.wait, 30), "the long prompt reached the tokenizer"
        second = asyncio.ensure_future(engine.tokenize("one two", None))
        await asyncio.sleep(0)  # the short one has been handed over (not run on the loop: the thread holds the lock)
        waited = not second.done()
        tokenizer.hold.set()
        return await first, await second, waited

    got_long, got_short, waited = asyncio.run(main())
    assert waited, "the short prompt did not run beside the busy tokenizer thread"
    assert got_long == real.encode(held) and got_short == real.encode("one two")
    assert tokenizer.most_inside == 1, "two calls inside the tokenizer at once"
    assert all(name.startswith("tokenize") for name in tokenizer.threads), tokenizer.threads
