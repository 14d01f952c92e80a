"""What the debug page (DJANGO_DEBUG=1) and error reports may show of the settings.

Django's SafeExceptionReporterFilter masks settings whose names look secret (…KEY, …TOKEN, …PASS…); a password
inside a URL setting (DATABASE_URL, CELERY_BROKER_URL, a result backend) passes under an innocent name, as does a
DSN whose user part is the key (https://KEY@host). This filter masks by pattern too: the password of every
URL-shaped setting value, and the user part of one without a password.
"""
from __future__ import annotations

import re

from django.views.debug import SafeExceptionReporterFilter

# scheme://user:password@host → the password; also scheme://:password@host (Redis).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)(?P<password>[^@\s]+)(?P<at>@)")
# scheme://KEY@host, a DSN whose user part is the secret (Sentry's, many webhook URLs): the whole user part.
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s]+)(?P<at>@)")


def mask_url_password(text: str, mask: str = SafeExceptionReporterFilter.cleansed_substitute) -> str:
    """Every URL's password, and the user part of a URL that has no password (it may be the key itself)."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{mask}{m['at']}", text)
    return _URL_USERINFO.sub(lambda m: f"{m['head']}{mask}{m['at']}", text)


class CredentialFilter(SafeExceptionReporterFilter):
    def cleanse_setting(self, key, value):
        value = super().cleanse_setting(key, value)
        if isinstance(value, str):  # str() too: a lazy setting value passes isinstance but is no str for re
            return mask_url_password(str(value), self.cleansed_substitute)
        return value
