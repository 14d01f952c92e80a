"""plotly.js, served from the installed plotly package (never a CDN: the dashboard must work on an air-gapped
control plane). The URL carries the version, so browsers may cache it for a year."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import plotly
from django.http import FileResponse, Http404
from django.views.decorators.http import require_GET

PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


@lru_cache(maxsize=1)
def plotly_version() -> str:
    from plotly.offline import get_plotlyjs_version

    return get_plotlyjs_version()


@require_GET
def plotly_js(request, version: str):
    if version != plotly_version() or not PLOTLY_JS.is_file():
        raise Http404(f"plotly.js {version} is not served here (installed: {plotly_version()})")
    response = FileResponse(PLOTLY_JS.open("rb"), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    return response
