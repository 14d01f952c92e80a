"""Incremental detokenization releases exactly the full decode, never half a character nor the start of a stop."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from inference.worker.detokenize import IncrementalDetokenizer

TEXT = "Hello, wörld! Ünïcode 日本語 text 🎉🎉 and  two  spaces,\nnew lines\n\nand code: def f(x): return x"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def stream(tokenizer, token_ids, context, stop=(), emitted_text=""):
    detok = IncrementalDetokenizer(tokenizer, context, stop, emitted_text=emitted_text)
    deltas = []
    for t in token_ids:
        delta = detok.add(t)
        deltas.append(delta.text)
        if delta.stopped:
            return deltas, True
    deltas.append(detok.flush())
    return deltas, False


def test_the_deltas_concatenate_to_the_full_decode_and_never_hold_a_replacement_char(tokenizer):
    prompt = tokenizer.encode("The prompt says:")
    ids = tokenizer.encode(TEXT)
    deltas, stopped = stream(tokenizer, ids, prompt)
    assert not stopped
    assert "".join(deltas) == tokenizer.decode(ids) == TEXT
    assert not any("\ufffd" in d for d in deltas)
    # Some multi-byte character really spanned tokens, so the hold-back path ran: an empty delta mid-stream.
    assert "" in deltas[:-1]


def test_a_stop_string_trims_the_text_and_finishes(tokenizer):
    ids = tokenizer.encode(TEXT)
    deltas, stopped = stream(tokenizer, ids, [], stop=["\n\n", "日本"])
    assert stopped
    assert "".join(deltas) == "Hello, wörld! Ünïcode "


def test_the_start_of_a_stop_string_is_never_streamed(tokenizer):
    ids = tokenizer.encode(TEXT)
    stop = "two  spaces,\nnew lines"
    deltas, stopped = stream(tokenizer, ids, [], stop=[stop])
    assert stopped and "".join(deltas) == TEXT[:TEXT.index(stop)]
    # Each released prefix is a prefix of the final text: nothing was streamed and then taken back.
    released = ""
    for d in deltas:
        released += d
        assert "two" not in released


def test_a_stop_string_that_never_completes_is_released_at_the_end(tokenizer):
    ids = tokenizer.encode("abc two  spac")
    deltas, stopped = stream(tokenizer, ids, [], stop=["two  spaces"])
    assert not stopped and "".join(deltas) == "abc two  spac"


def test_a_decode_worker_continues_after_the_first_token_with_the_same_text(tokenizer):
    prompt = tokenizer.encode("Q:")
    ids = tokenizer.encode(TEXT)
    whole, _ = stream(tokenizer, ids, prompt)
    first_text = tokenizer.decode(ids[:1])
    rest, _ = stream(tokenizer, ids[1:], prompt + ids[:1], emitted_text=first_text)
    assert first_text + "".join(rest) == "".join(whole)


def test_a_stop_string_spanning_the_first_token_is_found_on_the_decode_worker(tokenizer):
    ids = tokenizer.encode("Hello world")
    first_text = tokenizer.decode(ids[:1])
    stop = first_text[-1] + tokenizer.decode(ids[1:2])[:1]
    deltas, stopped = stream(tokenizer, ids[1:], ids[:1], stop=[stop], emitted_text=first_text)
    assert stopped and "".join(deltas) == ""



@pytest.mark.parametrize("stop", [(), ("new lines",)])
def test_a_resumed_request_replays_its_tokens_and_releases_only_the_rest_at_every_seam(tokenizer, stop):
    # What a worker does with resume_token_ids: the text of the first k tokens was sent by a worker that died, also
    # where k splits a multi-byte character or sits inside a held-back stop-string prefix.
    prompt = tokenizer.encode("Q:")
    ids = tokenizer.encode(TEXT)
    whole, stopped = stream(tokenizer, ids, prompt, stop=stop)
    num_tokens = len(whole) if stopped else len(ids)
    for k in range(1, num_tokens):
        died = IncrementalDetokenizer(tokenizer, prompt, stop)
        sent = "".join(died.add(t).text for t in ids[:k])
        resumed = IncrementalDetokenizer(tokenizer, prompt, stop)
        for t in ids[:k]:
            resumed.add(t)
        rest = ""
        for t in ids[k:num_tokens]:
            rest += resumed.add(t).text
        if not stopped:
            rest += resumed.flush()
        assert sent + rest == "".join(whole), k
