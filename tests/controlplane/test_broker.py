"""The local `filesystem://` broker: a consumer never sees a half-written message (kombu's own transport creates
the file before writing it, and a worker that reads it empty dies on a JSONDecodeError)."""
from __future__ import annotations

import logging
from queue import Empty

import pytest
from kombu import Connection
from kombu.utils.json import dumps as real_dumps

from controlplane.lib import broker


@pytest.fixture
def channel(tmp_path):
    folder = tmp_path / "queue"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "store_processed": False,
               "control_folder": str(tmp_path / "control")}
    with Connection(transport=broker.Transport, transport_options=options) as connection:
        yield connection.default_channel


def test_a_message_is_invisible_to_consumers_until_it_is_completely_written(channel, monkeypatch):
    seen_while_writing = []

    def dumps_while_a_consumer_polls(payload):
        # The moment kombu's transport has an empty file in the queue folder.
        try:
            seen_while_writing.append(channel._get("control"))
        except Empty:
            seen_while_writing.append(None)
        return real_dumps(payload)

    monkeypatch.setattr(broker, "dumps", dumps_while_a_consumer_polls)
    channel._put("control", {"body": "reconcile"})
    assert seen_while_writing == [None]
    assert channel._get("control") == {"body": "reconcile"}
    with pytest.raises(Empty):
        channel._get("control")


def test_messages_of_a_dotted_queue_reach_only_that_queue(channel):
    channel._put("node.local", {"n": 1})
    with pytest.raises(Empty):
        channel._get("control")
    assert channel._get("node.local") == {"n": 1}


def test_the_celery_app_uses_it_without_the_no_hostname_warning(caplog, settings):
    from controlplane.celery import app

    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        pytest.skip("only for the embedded filesystem broker (CELERY_BROKER_URL points elsewhere)")

    with caplog.at_level(logging.WARNING, logger="kombu.connection"), app.connection_for_write() as connection:
        assert isinstance(connection.transport, broker.Transport)
        connection.as_uri()
        connection.info()
    assert "No hostname" not in caplog.text
