"""The REST API answers its paths with or without the trailing slash.

Django's APPEND_SLASH answers `GET /api/v1/deployments/demo` with a 301 to `.../demo/`, which curl without `-L`
prints as nothing, and refuses to redirect a POST at all. Under /api/ a path without its slash whose slashed form
is a route is served as that route, in place: the same answer either way.
"""
from __future__ import annotations

from django.urls import Resolver404, resolve


class ApiTrailingSlash:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        path = request.path_info
        if path.startswith("/api/") and not path.endswith("/"):
            try:
                resolve(path)
            except Resolver404:
                try:
                    resolve(path + "/")
                except Resolver404:
                    pass
                else:
                    request.path_info = path + "/"
                    request.path = request.path + "/"
        return self.get_response(request)
