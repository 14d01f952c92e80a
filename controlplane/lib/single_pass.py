"""At most one pass of each periodic kind at a time, across the threads and processes of the control workers.

Beat sends a pass of each kind every interval and each message lives one interval. When a pass takes longer than
the interval (a thousand workers on a loaded host), the next one would start beside it: two scrapes, two reconciles
walking the same deployments and queueing on each other's row locks, each slower for the other. A pass that finds
its kind running is dropped instead, and the running one is the pass of that interval.

Within a process a lock per kind; across processes, on PostgreSQL, a session advisory lock (pg_try_advisory_lock),
which the database releases by itself if the holder's connection dies. SQLite runs one machine's stack, where the
lock per process is what there is.
"""
from __future__ import annotations

import logging
import threading
import zlib
from contextlib import contextmanager
from typing import Iterator

from django.db import DatabaseError, connection

log = logging.getLogger(__name__)

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _process_lock(kind: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(kind, threading.Lock())


def advisory_key(kind: str) -> int:
    """A stable 32-bit key per kind (PostgreSQL's advisory locks take a bigint)."""
    return zlib.crc32(f"tandem.single_pass.{kind}".encode())


@contextmanager
def single_pass(kind: str) -> Iterator[bool]:
    """`with single_pass("scrape") as mine:` -- mine is False while another pass of the kind runs (skip the work)."""
    lock = _process_lock(kind)
    if not lock.acquire(blocking=False):
        log.info("a %s pass is still running in this process: this one is dropped", kind)
        yield False
        return
    try:
        if connection.vendor != "postgresql":
            yield True
            return
        key = advisory_key(kind)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
            mine = bool(cursor.fetchone()[0])
        if not mine:
            log.info("a %s pass is still running in another process: this one is dropped", kind)
            yield False
            return
        try:
            yield True
        finally:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
            except DatabaseError:
                pass  # the connection broke: its session, and the lock with it, is gone
    finally:
        lock.release()
