"""Trace files an operator imports, and the one Tandem exports. No Django.

- `tandem`: JSON Lines, one gateway record per line (inference/gateway/trace_log.py): `t` (Unix seconds) or `at_s`
  (seconds from the trace's start), `prompt_tokens`, `completion_tokens`, and optionally `tenant`, `class`,
  `max_tokens`, `block_tokens`, `hashes`, `ttft_s`, `e2e_s`, `outcome`, `prompt_estimated`, `revision`.
- `azure`: the Azure LLM inference trace (CSV with the header TIMESTAMP,ContextTokens,GeneratedTokens; timestamps
  as `YYYY-MM-DD hh:mm:ss.fffffff`, UTC).
- `mooncake`: Mooncake's JSON Lines (`timestamp` in milliseconds from the trace's start, `input_length`,
  `output_length`, `hash_ids`: one id per block of MOONCAKE_BLOCK_TOKENS prompt tokens).

A row that does not parse is a TraceFormatError naming its line and field; the caller stores nothing of a file that
has one. Rows are returned in arrival order, times as seconds from the first arrival.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone

MOONCAKE_BLOCK_TOKENS = 512
MAX_TOKENS_PER_REQUEST = 10_000_000
MAX_HASHES = 4096
OUTCOMES = ("ok", "shed", "incomplete", "error", "")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceFormatError(ValueError):
    def __init__(self, line: int, field: str, message: str) -> None:
        super().__init__(f"line {line}: {field}: {message}")
        self.line, self.field, self.message = line, field, message


@dataclass(slots=True)
class Parsed:
    start: float  # Unix seconds of the first arrival (0 where the format has no clock: Mooncake)
    rows: list[dict]  # model fields of TraceRequest, at_s from `start`


def _count(value, line: int, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TraceFormatError(line, field, f"must be a whole number, not {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise TraceFormatError(line, field, f"must be a whole number, not {value!r}") from None
    if not math.isfinite(number) or number != int(number) or not minimum <= number <= MAX_TOKENS_PER_REQUEST:
        raise TraceFormatError(line, field, f"must be a whole number within {minimum}..{MAX_TOKENS_PER_REQUEST}, "
                                            f"not {value!r}")
    return int(number)


def _seconds(value, line: int, field: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise TraceFormatError(line, field, f"must be a number of seconds >= 0, not {value!r}")
    return float(value)


def _text(value, line: int, field: str, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise TraceFormatError(line, field, f"must be a string of at most {limit} characters")
    return value


def _hashes(value, line: int, field: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_HASHES or not all(
            isinstance(h, (str, int)) and not isinstance(h, bool) for h in value):
        raise TraceFormatError(line, field, f"must be a list of at most {MAX_HASHES} ids (strings or integers)")
    return [str(h) for h in value]


def _json_lines(text: str):
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise TraceFormatError(number, "(line)", f"not JSON: {exc}") from None
        if not isinstance(row, dict):
            raise TraceFormatError(number, "(line)", "must be a JSON object")
        yield number, row


def parse_tandem(text: str) -> Parsed:
    rows, clock, absolute = [], [], None
    for number, row in _json_lines(text):
        if ("t" in row) == ("at_s" in row):
            raise TraceFormatError(number, "t", "give either t (Unix seconds) or at_s (seconds from the start)")
        if absolute is None:
            absolute = "t" in row
        elif absolute != ("t" in row):
            raise TraceFormatError(number, "t" if absolute else "at_s", "every line must give the same one of t "
                                                                         "and at_s")
        clock.append(_seconds(row.get("t", row.get("at_s")), number, "t" if "t" in row else "at_s"))
        outcome = row.get("outcome") or ""
        if outcome not in OUTCOMES:
            raise TraceFormatError(number, "outcome", f"must be one of {', '.join(o for o in OUTCOMES if o)}")
        revision = row.get("revision")
        rows.append({
            "tenant": _text(row.get("tenant"), number, "tenant", 63),
            "priority": _text(row.get("class"), number, "class", 16),
            "prompt_tokens": _count(row.get("prompt_tokens"), number, "prompt_tokens", minimum=1),
            "prompt_estimated": bool(row.get("prompt_estimated", False)),
            "completion_tokens": _count(row.get("completion_tokens"), number, "completion_tokens"),
            "max_tokens": None if row.get("max_tokens") is None else _count(row["max_tokens"], number, "max_tokens"),
            "block_tokens": _count(row.get("block_tokens", 0), number, "block_tokens"),
            "hashes": _hashes(row.get("hashes"), number, "hashes"),
            "ttft_s": _seconds(row.get("ttft_s"), number, "ttft_s", optional=True),
            "e2e_s": _seconds(row.get("e2e_s"), number, "e2e_s", optional=True),
            "outcome": outcome,
            "revision": None if revision is None else _count(str(revision), number, "revision"),
        })
        if rows[-1]["hashes"] and not rows[-1]["block_tokens"]:
            raise TraceFormatError(number, "block_tokens", "must be at least 1 where hashes are given")
    return _ordered(clock, rows, absolute=bool(absolute))


def parse_azure(text: str) -> Parsed:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header[:3]) != AZURE_COLUMNS:
        raise TraceFormatError(1, "(header)", f"must be {','.join(AZURE_COLUMNS)}, not {','.join(header or [])!r}")
    rows, clock = [], []
    for number, fields in enumerate(reader, start=2):
        if not fields or not "".join(fields).strip():
            continue
        if len(fields) < 3:
            raise TraceFormatError(number, "(row)", f"needs {len(AZURE_COLUMNS)} fields, has {len(fields)}")
        clock.append(_azure_time(fields[0].strip(), number))
        rows.append({"prompt_tokens": _count(fields[1].strip(), number, "ContextTokens", minimum=1),
                     "completion_tokens": _count(fields[2].strip(), number, "GeneratedTokens")})
    return _ordered(clock, rows, absolute=True)


def _azure_time(value: str, line: int) -> float:
    day, _, fraction = value.partition(".")
    try:
        moment = datetime.strptime(day, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
        if fraction and not fraction.isdigit():
            raise ValueError(fraction)
    except ValueError:
        raise TraceFormatError(line, "TIMESTAMP", f"must look like 2023-11-16 18:15:46.6805900, not {value!r}") \
            from None
    return moment.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def parse_mooncake(text: str) -> Parsed:
    rows, clock = [], []
    for number, row in _json_lines(text):
        stamp = row.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp) or stamp < 0:
            raise TraceFormatError(number, "timestamp", f"must be milliseconds >= 0, not {stamp!r}")
        clock.append(stamp / 1000.0)
        hashes = _hashes(row.get("hash_ids"), number, "hash_ids")
        rows.append({"prompt_tokens": _count(row.get("input_length"), number, "input_length", minimum=1),
                     "completion_tokens": _count(row.get("output_length"), number, "output_length"),
                     "hashes": hashes, "block_tokens": MOONCAKE_BLOCK_TOKENS if hashes else 0})
    return _ordered(clock, rows, absolute=False)


PARSERS = {"tandem": parse_tandem, "azure": parse_azure, "mooncake": parse_mooncake}


def parse(text: str, fmt: str) -> Parsed:
    if fmt not in PARSERS:
        raise TraceFormatError(0, "format", f"must be one of {', '.join(PARSERS)}, not {fmt!r}")
    parsed = PARSERS[fmt](text)
    if not parsed.rows:
        raise TraceFormatError(0, "(file)", "holds no request")
    return parsed


def _ordered(clock: list[float], rows: list[dict], *, absolute: bool) -> Parsed:
    if not rows:
        return Parsed(0.0, [])
    first = min(clock)
    for at, row in zip(clock, rows):
        row["at_s"] = round(at - first, 6)
    rows.sort(key=lambda row: row["at_s"])
    return Parsed(first if absolute else 0.0, rows)


EXPORT_FIELDS = ("at_s", "tenant", "priority", "prompt_tokens", "prompt_estimated", "completion_tokens",
                 "max_tokens", "block_tokens", "hashes", "ttft_s", "e2e_s", "outcome", "revision")


def export_line(row: dict, start: float) -> str:
    """One request in the `tandem` format (what parse_tandem reads back)."""
    out = {("class" if key == "priority" else key): row[key] for key in EXPORT_FIELDS if key != "at_s"}
    out["t"] = round(start + row["at_s"], 6)
    return json.dumps(out, separators=(",", ":"))
