"""The local broker (`filesystem://`, one machine) with atomic message files.

kombu's filesystem transport creates a message file, then writes it; a consumer that lists the folder in between
takes the empty file and its worker dies on a JSONDecodeError ("Unrecoverable error"), losing the message. Seen
under `make run` after ~10 minutes. Here a message is written under a name no consumer picks up (`.part`), then
renamed into place, which is atomic on POSIX: a consumer sees a complete message or none.
"""
from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put `payload` onto `queue` (same file name scheme as kombu's, so its _get reads it)."""
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
