"""plotly.js as this project vendors it (dashboards/vendor/, from the npm package plotly.js-basic-dist-min, its
license beside it): the file, its version (which the pages' URL carries) and its bytes, gzipped once per process.
Served by views/assets.py; the version is read by the template tag that writes the pages' script URL."""
from __future__ import annotations

import gzip
import re
from functools import lru_cache
from pathlib import Path

PLOTLY_JS = Path(__file__).resolve().parent / "vendor" / "plotly-basic.min.js"


@lru_cache(maxsize=1)
def plotly_version() -> str:
    """The vendored bundle's version, from its header (`plotly.js (basic - minified) v4.1.1`)."""
    with PLOTLY_JS.open(encoding="utf-8") as header:
        match = re.search(r"\bv(\d+\.\d+\.\d+)", header.read(400))
    return match.group(1) if match else "unknown"


@lru_cache(maxsize=1)
def bundle() -> tuple[bytes, bytes]:
    raw = PLOTLY_JS.read_bytes()
    return raw, gzip.compress(raw, compresslevel=9, mtime=0)
