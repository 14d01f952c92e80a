"""A client's request body, refused by its length before it is read where it cannot be served: past
--max-body-bytes (413), or longer than any prompt that fits a ready group's context (400 context_length_exceeded).

Parsing a body costs the gateway's CPU, which every other client's requests share: a flood of megabyte prompts that
no worker could take would otherwise slow everyone down before each one is refused.
"""
from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from inference.gateway.openai_protocol import ApiError
from inference.gateway.routing import Router

# A prompt character takes at most 6 bytes in JSON (\uXXXX); the other fields (messages' roles, a logit bias, stop
# strings) fit in the slack.
JSON_BYTES_PER_CHAR, BODY_FIELDS_SLACK_BYTES = 6, 256 << 10


def useful_body_bytes(routers: Iterable[Router]) -> int | None:
    """The longest body a request that fits some ready group's context can have: its prompt's characters (as the
    workers' /health bounds them), each escaped at worst, plus the slack. None where a ready group says no bound.
    A shared gateway reads the body before it knows the deployment: the bound is that of all its deployments."""
    limits = [group.max_prompt_chars() for router in routers for group in router.groups if group.is_complete]
    if not limits or None in limits:
        return None
    return max(limits) * JSON_BYTES_PER_CHAR + BODY_FIELDS_SLACK_BYTES


# A body refused by its length is never read, and the answer closes the connection (the server runs with no
# lingering: __main__.py), so the client sends its next request on a new one.
CLOSE = {"Connection": "close"}


async def read_body(request: web.Request, max_body_bytes: int, routers: Iterable[Router]) -> bytes:
    too_large = ApiError(413, f"the request body exceeds {max_body_bytes} bytes", param=None,
                         code="request_too_large", headers=CLOSE)
    length = request.content_length
    if length is not None and length > max_body_bytes:
        raise too_large
    useful = useful_body_bytes(routers)
    if useful is not None and length is not None and length > useful:
        raise ApiError(400, f"the request body has {length} bytes; no prompt that fits this model's context takes "
                            f"more than {useful}", param=None, code="context_length_exceeded", headers=CLOSE)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:  # a chunked body past client_max_size
        raise too_large from None
