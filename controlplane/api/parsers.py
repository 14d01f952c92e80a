"""DRF's parsers, refusing with a 400 what would otherwise reach the code as a 500: NUL characters anywhere in a
body, and JSON nested deeper than MAX_JSON_DEPTH (a 5,000-deep array made json.loads raise RecursionError).

PostgreSQL stores no U+0000 in text and no \\u0000 in jsonb: a NUL in a label value, a matcher, an annotation or a
dictionary key would otherwise reach the database and fail there as a 500 (SQLite stores it, so only production
would show it). No field of this API has a use for one. CharFields refuse it already; this covers JSON fields,
nested dictionaries and their keys, whatever view reads them.
"""
from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError

_JSON_NUL = "\\u0000"  # a form field's text that a JSONField decodes into a NUL
# No request of this API nests deeper than a handful of levels; 32 leaves room and keeps every walk shallow.
MAX_JSON_DEPTH = 32


def json_depth(data) -> int:
    """How deeply lists and objects nest in parsed JSON (a scalar: 0), walked without recursion."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        value, depth = todo.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in children)
    return deepest


def nul_path(data, path: str = "", *, json_text: bool = False) -> str | None:
    """Where the first NUL is ("labels.team", "alerts[0]"), "" for the body itself, None when there is none."""
    if isinstance(data, str):
        return path if "\x00" in data or (json_text and _JSON_NUL in data) else None
    if isinstance(data, dict):
        getlist = getattr(data, "getlist", None)  # a QueryDict: every value of a repeated form field
        for key in data:
            key_text = str(key)
            where = f"{path}.{key_text}" if path else key_text
            if "\x00" in key_text:
                return where
            values = getlist(key) if getlist is not None else [data[key]]
            for value in values:
                found = nul_path(value, where, json_text=json_text)
                if found is not None:
                    return found
        return None
    if isinstance(data, list):
        for index, item in enumerate(data):
            found = nul_path(item, f"{path}[{index}]", json_text=json_text)
            if found is not None:
                return found
    return None


def _refuse_nul(data, *, json_text: bool = False):
    where = nul_path(data, json_text=json_text)
    if where is not None:
        raise ParseError(f"{where or 'the body'} contains a NUL character (\\u0000), which no field accepts")
    return data


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels") from None
        if json_depth(data) > MAX_JSON_DEPTH:
            raise ParseError(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels")
        return _refuse_nul(data)


class FormParser(parsers.FormParser):
    # Form values are text, but a JSONField decodes its text: "\u0000" there would become a NUL.
    def parse(self, stream, media_type=None, parser_context=None):
        return _refuse_nul(super().parse(stream, media_type, parser_context), json_text=True)


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        result = super().parse(stream, media_type, parser_context)
        _refuse_nul(result.data, json_text=True)
        return result
