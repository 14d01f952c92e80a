"""The admission queue's order (inference/gateway/fair_queue.py) is pure: no asyncio, no clock, no I/O, so that it is
tested one decision at a time; admission.py wraps it with the event loop."""
from tests.test_import_graph import ROOT, _imported_names

PURE = {"__future__", "collections", "dataclasses"}


def test_the_fair_queue_imports_nothing_but_pure_helpers():
    assert set(_imported_names(ROOT / "inference/gateway/fair_queue.py")) <= PURE
