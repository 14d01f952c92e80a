"""Comments explain; docs hold the measurements. No comment or docstring (of bench/, controlplane/, dashboards/,
inference/, tandem_chaostoolkit/, the Makefile and .ci/run) carries a date, a CPU or GPU model (the host a figure came
from), or a measured figure: a speed ratio ("1.5x"), a time that was approximated, reported or is fractional ("~5 s",
"took 90 s", "0.05 s", "75-138 ms"), a throughput or bandwidth ("25 tok/s", "12 GB/s"), a percentage of a run ("~10 %",
"6-10 % faster", "32 % of each poll's time"), or figures right after "measured". Those go stale with the next run or
host; they live in docs/performance.md, and a comment says why and points to its section by name ("see
docs/performance.md, 'Batched decode'").

What stays allowed, because the code defines or branches on it: instruction sets (AVX2, AVX-512, AMX, VNNI) and CPU
vendors (gemm.py picks MKL or oneDNN by cpu_vendor()); the limits, defaults, goals and sizes the code or a bench sets
("at most 64 MiB", "default 8", "32 tokens", "a 30 s timeout", "90 % of the KV blocks", "P99 <= 2x unloaded": a figure
right after a limit word); products of sizes ("2 x parameters x tokens", with spaces); quoted text (a format's example,
"'1.20 s'", or an error message)."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("inference", "controlplane", "dashboards", "bench", "tandem_chaostoolkit")
SKIPPED = ("migrations", "__pycache__", "_built")
SHELL_FILES = ("Makefile", ".ci/run")

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_YEAR = r"(?:19|20)\d\d"
_N = r"(?<![\w.])\d+(?:[.,]\d+)*"  # a number on its own: not the 16 of bfloat16, the 99 of P99 or the 2 of SmolLM2
_RANGE = rf"{_N}(?:\s?(?:-|–|to)\s?[+-]?\d+(?:[.,]\d+)*)?"
_ABOUT = r"(?:~|≈|\babout|\baround|\broughly|\bnearly|\balmost)"
_REPORTED = r"(?i:\b(?:took|takes|take|taking|measured|measuring|spent|spends)\b)[:,]?"
_WORDS = r"(?:\s+[^\s;.(]+){0,3}?\s+"  # up to three words between a verb and its figure
_TIME = r"(?:ns|µs|us|ms|s|sec|secs|seconds?|min|mins|minutes?|h|hours?)\b"
_RATE = r"(?:[kM]?tok/s|tokens/s|tokens per second|[KMGT]i?B/s|[GTP]FLOP/s|[GT]FLOPS|[GT]OP/s|req/s|requests/s)"

# (what the line carries, pattern, whether a limit word just before the figure makes it a limit instead).
PATTERNS = (
    ("a date", re.compile(rf"\b{_YEAR}-[01]\d(?:-[0-3]\d)?\b"), False),
    ("a date", re.compile(rf"\b(?:\d{{1,2}} )?{_MONTH} (?:\d{{1,2}}, )?{_YEAR}\b"), False),
    # Model and microarchitecture names. Not the vendors (Intel, AMD, Arm): the code branches on those, as on the
    # instruction sets (AVX2, AVX-512, AMX, VNNI), e.g. gemm.py's MKL-or-oneDNN choice by cpu_vendor().
    ("a CPU model", re.compile(
        r"(?i)\b(?:EPYC|Xeon|Ryzen|Threadripper|Opteron|Athlon|Pentium|Celeron|Zen ?[1-6]|Core i[3579]|"
        r"(?:Sapphire|Emerald|Granite) Rapids|(?:Ice|Cascade|Cooper|Sky|Alder|Raptor|Meteor) ?Lake|"
        r"Graviton\d*|Neoverse|Ampere Altra|Apple M[1-4])\b"), False),
    ("a CPU model", re.compile(r"\b(?:Naples|Genoa|Milan|Turin|Bergamo)\b"), False),
    ("a GPU model as a host", re.compile(r"\b(?:[ABHV]100|H200|[BG]200|A10G?|L40S?|RTX ?\d{4})\b"), False),
    ("a speed ratio", re.compile(rf"{_RANGE}[x×](?!\w)"), True),
    ("an approximate time", re.compile(rf"{_ABOUT}\s?{_RANGE}\s?{_TIME}"), False),
    ("a reported time", re.compile(rf"{_REPORTED}{_WORDS}[~≈(]?{_RANGE}\s?{_TIME}"), True),
    ("a measured time", re.compile(rf"(?:{_N}\.\d+|{_N}\s?(?:-|–)\s?\d+(?:\.\d+)?)\s?{_TIME}"), True),
    ("a throughput or bandwidth", re.compile(rf"{_RANGE}\s?{_RATE}"), True),
    ("a measured percentage", re.compile(
        rf"(?:{_ABOUT}\s?{_N}|{_N}\s?(?:-|–|to)\s?[+-]?\d+(?:\.\d+)?)\s?%"), True),
    ("a measured percentage", re.compile(
        rf"{_N}\s?%\s?(?:faster|slower|lower|higher|(?:of (?:its|the|each|a) (?:\S+ ){{0,2}}?(?:time|peak|rate)))"),
        True),
    ("a reported percentage", re.compile(rf"{_REPORTED}{_WORDS}[~≈(]?{_N}\s?%"), True),
    ("a measured figure", re.compile(rf"(?i)\bmeasur(?:ed|ing)\b[:,]?{_WORDS}[~≈(\[]?{_N}"), False),
)
# Just before a figure, these make it a limit, a default or a goal the code or the bench sets, not a result.
_LIMIT = re.compile(
    r"(?i)(?:\b(?:at most|at least|up to|within|every|default|defaults to|timeout|limit|goal|than|past|above|below)"
    r"|<=|>=|≤|≥|<(?![-=])|(?<![-=])>)\s*$")
_BY_DEFAULT = re.compile(r"[^.;,()]*\bby default\b")
# Quoted text is an example of a format or a quote from elsewhere (an error message, NVML's answer), not a claim.
_QUOTED = re.compile(r"(?<!\w)'[^'\n]*'(?!\w)|\"[^\"\n]*\"")


def _is_limit(text: str, match: re.Match) -> bool:
    figure = match.start() + re.search(r"\d", match.group(0)).start()
    return bool(_LIMIT.search(text[:figure].rstrip("~≈(+ ")) or _BY_DEFAULT.match(text, match.end()))


def lab_notes(text: str) -> list[str]:
    """What in `text` is a date, a CPU or GPU model, or a measured figure, each with the words that show it."""
    text = _QUOTED.sub("''", text.replace('"""', " ").replace("'''", " "))
    notes = []
    for what, pattern, limits in PATTERNS:
        for match in pattern.finditer(text):
            if not (limits and _is_limit(text, match)):
                notes.append(f"{what} ({match.group(0).strip()!r})")
                break
    return notes


def python_comments(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every docstring or string-literal statement of a Python file."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for number in range(node.lineno, node.end_lineno + 1):
                found.append((number, lines[number - 1]))
    return found


def c_like_comments(text: str, line_comments: bool = True) -> list[tuple[int, str]]:
    """(line, text) of each line of the // and /* */ comments of C, JavaScript or (without //) CSS; string literals
    are skipped so that a URL in one is no comment."""
    found = []
    i, line = 0, 1
    while i < len(text):
        char = text[i]
        if char == "\n":
            line += 1
            i += 1
        elif char in "\"'`":
            end = i + 1
            while end < len(text) and text[end] != char:
                end += 2 if text[end] == "\\" else 1
            line += text.count("\n", i, end + 1)
            i = end + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = len(text) if end < 0 else end + 2
            for offset, piece in enumerate(text[i:end].split("\n")):
                found.append((line + offset, piece))
            line += text.count("\n", i, end)
            i = end
        elif line_comments and text.startswith("//", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            found.append((line, text[i:end]))
            i = end
        else:
            i += 1
    return found


def shell_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of the # comments of a Makefile or a shell script: whole lines and trailing ' # ...'."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        match = re.search(r"(?:^|\s)(#(?:\s.*|$))", line)
        if match:
            found.append((number, match.group(1)))
    return found


def source_files() -> list[Path]:
    files = [ROOT / name for name in SHELL_FILES]
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".c", ".h", ".js", ".css") and not _skipped(path):
                files.append(path)
    return files


def _skipped(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return any(part in SKIPPED for part in parts) or parts[:2] == ("dashboards", "vendor")


def comments(path: Path) -> list[tuple[int, str]]:
    if path.suffix == ".py":
        return python_comments(path)
    if path.suffix in (".c", ".h", ".js"):
        return c_like_comments(path.read_text())
    if path.suffix == ".css":
        return c_like_comments(path.read_text(), line_comments=False)
    return shell_comments(path.read_text())


def findings() -> list[str]:
    found = []
    for path in source_files():
        relative = path.relative_to(ROOT).as_posix()
        seen = set()
        for number, text in comments(path):
            if (number, text) in seen:
                continue
            seen.add((number, text))
            notes = lab_notes(text)
            if notes:
                found.append(f"{relative}:{number}: {'; '.join(notes)}: {text.strip()}")
    return found


def test_a_lab_note_is_caught_and_a_limit_is_not():
    for note in (
        "AMX tiles beat oneDNN 1.5x at batch 8 (2026-12-05)",
        "on an AMD EPYC with AVX2 only 2.5x fbgemm's single-stream rate",
        "decode at 0.80x of llama.cpp's, 1.2-1.3x faster a step",
        "the slowest file takes ~90 s on a quiet machine",
        "one pass: 0.05 s",
        "412 tok/s at batch 32; 38 GB/s of a plain read's 46",
        "a bfloat16 step spent 11 % of its time in these loops",
        "measured on 2 cores: one after the other",
        "Zen 4 has no AMX",
        "compile: minutes of warm-up on an H200, in Dec 2026",
    ):
        assert lab_notes(note), note
    for limit in (
        "at most 64 MiB of KV per worker; default 8 sequences",
        "32 tokens per chunk, 4 KiB pages, a 30 s timeout, then 3 tries",
        "alert above 90 % of the KV blocks; 10% of the traffic for 5 minutes",
        "AVX2, AVX-512, AMX and VNNI kernels; MKL on an Intel CPU, oneDNN elsewhere",
        "TTFT P99 at most 1.5x its value before the fault; a timeout past 0.5 s",
        "FLOPs: 2 x parameters x tokens; a [49,152 x 576] head; a 0x7f mask",
        "3 significant digits: '3.9 s', '12.3 ms', '42.0 tokens/s'",
    ):
        assert not lab_notes(limit), limit


def test_comments_carry_no_dates_cpu_names_or_measurements():
    found = findings()
    assert not found, (
        f"{len(found)} comment line(s) carry a date, a CPU name or a measured figure: say why, and point to the doc "
        "section that holds the figures (e.g. see docs/performance.md, 'Batched decode'):\n" + "\n".join(found)
    )
