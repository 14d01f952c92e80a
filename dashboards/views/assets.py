"""plotly.js, served by the control plane itself (never a CDN: the dashboard must work on an air-gapped control
plane). The pages draw scatter traces, shapes and annotations only, so they get plotly's basic partial bundle
(vendored from the npm package plotly.js-basic-dist-min, dashboards/vendor/: 1.2 MB against the full bundle's
4.8 MB, its license beside it), gzipped once per process for a browser that accepts it. The URL carries the
version, so browsers may cache it for a year.
"""
from __future__ import annotations

import gzip
import re
from functools import lru_cache
from pathlib import Path

from django.http import Http404, HttpResponse
from django.views.decorators.http import require_GET

PLOTLY_JS = Path(__file__).resolve().parent.parent / "vendor" / "plotly-basic.min.js"


@lru_cache(maxsize=1)
def plotly_version() -> str:
    """The vendored bundle's version, from its header (`plotly.js (basic - minified) v4.1.1`)."""
    with PLOTLY_JS.open(encoding="utf-8") as bundle:
        match = re.search(r"\bv(\d+\.\d+\.\d+)", bundle.read(400))
    return match.group(1) if match else "unknown"


@lru_cache(maxsize=1)
def _bundle() -> tuple[bytes, bytes]:
    raw = PLOTLY_JS.read_bytes()
    return raw, gzip.compress(raw, compresslevel=9, mtime=0)


@require_GET
def plotly_js(request, version: str):
    if version != plotly_version() or not PLOTLY_JS.is_file():
        raise Http404(f"plotly.js {version} is not served here (vendored: {plotly_version()})")
    raw, compressed = _bundle()
    accepts_gzip = "gzip" in request.headers.get("Accept-Encoding", "")
    response = HttpResponse(compressed if accepts_gzip else raw, content_type="text/javascript; charset=utf-8")
    if accepts_gzip:
        response["Content-Encoding"] = "gzip"
    response["Vary"] = "Accept-Encoding"
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    return response
