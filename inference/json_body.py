"""JSON from outside the process (a client's body, a KV header), loaded with bounds and refused with what is wrong.

Two things `json.loads` accepts would otherwise surface later as a 500:
- nesting: it recurses once per level, so 5,000 `[` raise RecursionError. No body of ours nests deeper than a handful
  of levels; MAX_JSON_DEPTH is the control plane's bound (`controlplane/api/parsers.py`).
- lone UTF-16 surrogates: JSON can spell `"\\ud800"`, which Python keeps as a str that no UTF-8 encoder and no
  tokenizer accepts. Paired surrogates are joined into one code point by the parser; only lone ones remain, and no
  text has a use for them.
Size is bounded before this, by whoever reads the body (the gateway's and the worker's --max-body-bytes).
"""
from __future__ import annotations

import json
import re

# No request of this project nests deeper than a handful of levels; 32 leaves room and keeps every walk shallow.
MAX_JSON_DEPTH = 32
_SURROGATE = re.compile("[\ud800-\udfff]")
# Where a surrogate can come from: a \uD800-\uDFFF escape, or one encoded in the bytes themselves (json.loads decodes
# bytes with "surrogatepass"). Pairs match too (an escaped emoji); the walk then tells them apart.
_SURROGATE_SOURCE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS_TO_PARENS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{]}")


class JSONBodyError(ValueError):
    """Refused JSON: `param` is where (`messages[0].content`, None for the body itself), `code` what kind."""

    def __init__(self, message: str, *, param: str | None, code: str) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def loads(raw: bytes | str, *, max_depth: int = MAX_JSON_DEPTH):
    """Parse `raw`; raise JSONBodyError past `max_depth` levels or for a string (or key) that is not valid text,
    ValueError (json's own) when it is not JSON at all.

    Both checks read the raw text at C speed (this runs on an event loop) and walk the parsed value only to name
    the field that holds a surrogate.
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        raise _too_deep(max_depth) from None
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") > max_depth and _nests_deeper(data, max_depth):
        raise _too_deep(max_depth)
    if _SURROGATE_SOURCE.search(data):
        check_text(value)
    return value


def _nests_deeper(data: bytes, max_depth: int) -> bool:
    """Whether valid JSON `data` nests containers deeper than `max_depth`: with strings removed and brackets kept,
    each pass that deletes every innermost "()" peels exactly one level."""
    brackets = _STRING.sub(b"", data).translate(_BRACKETS_TO_PARENS, _NOT_BRACKETS)
    for _ in range(max_depth):
        brackets = brackets.replace(b"()", b"")
        if not brackets:
            return False
    return True


def check_text(value) -> None:
    """Raise JSONBodyError naming the first string or key of parsed JSON that holds a lone surrogate; walked
    without recursion, depth first in document order."""
    if isinstance(value, str):
        _check_text(value, None)
        return
    # (container, path); a path is (parent path, key or index), formatted only when something is wrong.
    todo: list[tuple[object, tuple | None]] = [(value, None)]
    while todo:
        value, path = todo.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        children = []
        for key, child in items:
            if isinstance(key, str):
                _check_text(key, (path, key))
            if isinstance(child, str):
                _check_text(child, (path, key))
            elif isinstance(child, (dict, list)):
                children.append((child, (path, key)))
        todo.extend(reversed(children))


def _check_text(text: str, path: tuple | None) -> None:
    if not text.isascii() and _SURROGATE.search(text):
        raise _not_text(path)


def format_path(path: tuple | None) -> str | None:
    """(((None, "messages"), 0), "content") -> "messages[0].content"; None -> None (the body itself)."""
    parts = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key.encode('ascii', 'backslashreplace').decode()}")
    return "".join(reversed(parts)).lstrip(".") or None


def _too_deep(max_depth: int) -> JSONBodyError:
    return JSONBodyError(f"the JSON body nests deeper than {max_depth} levels", param=None, code="json_too_deep")


def _not_text(path: tuple | None) -> JSONBodyError:
    param = format_path(path)
    where = f"'{param}'" if param else "the body"
    return JSONBodyError(f"{where} holds a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode text",
                         param=param, code="invalid_unicode")
