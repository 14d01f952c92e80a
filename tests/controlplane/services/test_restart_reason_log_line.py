"""Which line of a dead process's log its restart reason quotes: the last WARNING, ERROR or CRITICAL record (by the
level the log format writes), or the last line of a Python traceback, or a Python warning; never an INFO or DEBUG
record, and nothing when the log has none of those."""
from __future__ import annotations

from controlplane.services.restarts import WorkerFailure, last_problem

WORKER = "2026-11-30 12:00:0{s},123 decode[4242] {level} inference.worker.server: {message}"
GATEWAY = "2026-11-30 12:00:0{s},123 {level} tandem.gateway: {message}"


def test_an_info_line_is_never_quoted_even_when_it_names_an_error():
    tail = "\n".join([WORKER.format(s=1, level="INFO", message="ready on port 41001 (0 errors while loading)"),
                      WORKER.format(s=2, level="DEBUG", message="Traceback-free Error counters: 0")])
    assert last_problem(tail) == ""


def test_the_last_warning_or_error_record_is_quoted_with_its_kind():
    warning = WORKER.format(s=1, level="WARNING", message="Token indices sequence length is longer (2100 > 2048)")
    error = GATEWAY.format(s=2, level="ERROR", message="worker 17 refused the connection")
    assert last_problem("\n".join([warning, WORKER.format(s=2, level="INFO", message="ready")])) == \
        f"last warning in its log: {warning}"
    assert last_problem("\n".join([warning, error, GATEWAY.format(s=3, level="INFO", message="ok")])) == \
        f"last error in its log: {error}"
    assert last_problem("CRITICAL:root:out of memory") == "last error in its log: CRITICAL:root:out of memory"


def test_a_traceback_is_quoted_by_its_last_line_also_after_a_chained_one():
    tail = "\n".join([
        WORKER.format(s=1, level="INFO", message="loading weights"),
        "Traceback (most recent call last):",
        '  File "/srv/inference/worker/loader.py", line 20, in load',
        "    raise KeyError(name)",
        "KeyError: 'lm_head.weight'",
        "During handling of the above exception, another exception occurred:",
        "Traceback (most recent call last):",
        '  File "/srv/inference/worker/__main__.py", line 12, in <module>',
        "    main()",
        "RuntimeError: the checkpoint has no lm_head",
    ])
    assert last_problem(tail) == "last error in its log: RuntimeError: the checkpoint has no lm_head"


def test_a_logged_exception_is_quoted_by_its_exception_line_not_by_its_frames():
    record = WORKER.format(s=1, level="ERROR", message="step failed")
    tail = "\n".join([record, "Traceback (most recent call last):", '  File "x.py", line 1, in f', "    g()",
                      "ValueError: bad shape"])
    assert last_problem(tail) == "last error in its log: ValueError: bad shape"


def test_a_python_warning_printed_without_a_level_counts_as_a_warning():
    line = "/srv/.venv/lib/transformers/modeling_utils.py:1234: UserWarning: loading GGUF in bfloat16"
    tail = "\n".join([line, "  warnings.warn(", WORKER.format(s=1, level="INFO", message="ready")])
    assert last_problem(tail) == f"last warning in its log: {line}"


def test_lines_without_a_level_are_not_quoted():
    assert last_problem("Loading weights: done\nSome library chatter about an Error we cannot rank") == ""


def test_a_reason_says_how_the_process_ended():
    def reason(exit_code):
        return WorkerFailure.exited(worker_id=1, pid=2, exit_code=exit_code, log_tail="").reason

    assert reason(-9) == "process killed by signal 9 (SIGKILL)"
    assert reason(-7) == "process killed by signal 7 (SIGBUS)"
    assert reason(0) == "process exited with code 0"
    assert reason(1) == "process exited with code 1"
    assert reason(None) == "process ended; exit status unknown (started by an earlier agent)"
