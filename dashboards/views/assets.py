"""plotly.js, served by the control plane itself (never a CDN: the dashboard must work on an air-gapped control
plane). The pages draw scatter traces, shapes and annotations only, so they get plotly's basic partial bundle
(vendored from the npm package plotly.js-basic-dist-min, dashboards/vendor/: 1.2 MB against the full bundle's
4.8 MB, its license beside it), gzipped once per process for a browser that accepts it. The URL carries the
version, so browsers may cache it for a year.
"""
from __future__ import annotations

from django.http import Http404, HttpResponse
from django.views.decorators.http import require_GET

from dashboards.plotly_bundle import PLOTLY_JS, bundle, plotly_version


@require_GET
def plotly_js(request, version: str):
    if version != plotly_version() or not PLOTLY_JS.is_file():
        raise Http404(f"plotly.js {version} is not served here (vendored: {plotly_version()})")
    raw, compressed = bundle()
    accepts_gzip = "gzip" in request.headers.get("Accept-Encoding", "")
    response = HttpResponse(compressed if accepts_gzip else raw, content_type="text/javascript; charset=utf-8")
    if accepts_gzip:
        response["Content-Encoding"] = "gzip"
    response["Vary"] = "Accept-Encoding"
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    return response
