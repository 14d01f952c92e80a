"""What a served page loads from elsewhere: nothing may come from a CDN or any other host.

A substring test for "cdn" fails at random: CSRF tokens and asset hashes are random letters and sometimes spell it."""
from __future__ import annotations

import re

_ASSET = re.compile(r'<(?:script|link|img|iframe)\b[^>]*?\b(?:src|href)="([^"]*)"', re.IGNORECASE)


def foreign_assets(html: str) -> list[str]:
    """The scripts, stylesheets, images and frames of `html` that do not come from this server."""
    return [url for url in _ASSET.findall(html) if re.match(r"(?:[a-z][a-z0-9+.-]*:)?//", url, re.IGNORECASE)]
