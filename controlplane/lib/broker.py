"""The local broker (`filesystem://`, one machine) with atomic message files.

kombu's filesystem transport creates a message file, then writes it; a consumer that lists the folder in between
takes the empty file and its worker dies on a JSONDecodeError ("Unrecoverable error"), losing the message. Seen
under `make run` within minutes. Here a message is written under a name no consumer picks up (`.part`), then
renamed into place, which is atomic on POSIX: a consumer sees a complete message or none.

A frozen broker, for the chaos fault `broker_freeze` (controlplane.agent.control_faults): the folder has no server
process to SIGSTOP, so every put and get first passes a gate, a shared flock on `freeze.lock` beside the queue folder,
taken and dropped at once. Whoever holds that file's exclusive lock (the node agent carrying the fault, or an operator's
`flock var/broker/freeze.lock sleep 60`) makes every client of the folder wait, publishers and consumers alike, as a
SIGSTOPped Redis would; the kernel drops the lock when its holder exits, so a freeze never outlives its agent.
"""
from __future__ import annotations

import fcntl
import os
import uuid
from time import monotonic
from urllib.parse import urlsplit

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


FREEZE_LOCK = "freeze.lock"


def freeze_lock_path(data_folder: str) -> str:
    """The gate's file: beside the queue folder, where no consumer lists it."""
    return os.path.join(os.path.dirname(os.path.abspath(data_folder)), FREEZE_LOCK)


DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671, "pyamqp": 5672}


def broker_location(url: str, transport_options: dict | None = None) -> dict:
    """Where the broker of `url` (CELERY_BROKER_URL) is: {"scheme": "filesystem", "folder": F} (the queue folder)
    or {"scheme": S, "host": H, "port": P}; a URL of another kind has no port: {"scheme": S, "host": H}."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else url.lower()
    if scheme == "filesystem":
        return {"scheme": scheme, "folder": str((transport_options or {}).get("data_folder_in", ""))}
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = None
    return {"scheme": scheme, "host": host, **({"port": port} if port else {})}


class Channel(filesystem.Channel):
    _gate_fd: int | None = None

    def _gate(self) -> None:
        """Wait while someone holds the freeze lock exclusively (one flock per operation: microseconds)."""
        if self._gate_fd is None:
            self._gate_fd = os.open(freeze_lock_path(self.data_folder_in), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._gate_fd, fcntl.LOCK_SH)
        fcntl.flock(self._gate_fd, fcntl.LOCK_UN)

    def close(self):
        if self._gate_fd is not None:
            os.close(self._gate_fd)
            self._gate_fd = None
        super().close()

    def _get(self, queue):
        self._gate()
        return super()._get(queue)

    def _put(self, queue, payload, **kwargs):
        """Put `payload` onto `queue` (same file name scheme as kombu's, so its _get reads it)."""
        self._gate()
        filename = os.path.join(self.data_folder_out, f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg")
        partial = f"{filename}.part"  # "<ts>_<uuid>.<queue>.msg.part" never matches _get's "<queue>.msg"
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, filename)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {filename!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel

    @property
    def default_connection_params(self):
        # A folder needs no host: without this, every connection logs "No hostname was supplied".
        return {}
