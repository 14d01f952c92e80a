"""Every write of the replay app's tables: imports, the recorded trace's settings and rows, pruning."""
from __future__ import annotations

import re
import zlib
from datetime import datetime, timedelta, timezone as dt_timezone

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.errors import conflict, invalid
from controlplane.models import Deployment
from controlplane.replay.formats import Parsed, TraceFormatError, parse
from controlplane.replay.models import RECORDED, Trace, TraceCursor, TraceRequest

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
FIELDS = ("at_s", "tenant", "priority", "prompt_tokens", "prompt_estimated", "completion_tokens", "max_tokens",
          "block_tokens", "hashes", "ttft_s", "e2e_s", "outcome", "revision")
BATCH = 2000


def trace_import(deployment: Deployment, *, name: str, fmt: str, text: str, actor: str = "") -> Trace:
    """Store a trace file as a new trace of the deployment, whole or not at all: a bad row is a 400 naming its line
    and field, a name in use a 409."""
    if not isinstance(name, str) or not NAME.match(name) or name == RECORDED:
        raise invalid(f"name must be 1-63 letters, digits, '.', '_' or '-' (not {RECORDED!r}), not {name!r}",
                      field="name")
    try:
        parsed = parse(text, fmt)
    except TraceFormatError as exc:
        raise invalid(str(exc), field=exc.field, line=exc.line) from None
    if len(parsed.rows) > settings.TANDEM_TRACE_IMPORT_MAX_REQUESTS:
        raise invalid(f"the file holds {len(parsed.rows)} requests; an import takes at most "
                      f"{settings.TANDEM_TRACE_IMPORT_MAX_REQUESTS} (TANDEM_TRACE_IMPORT_MAX_REQUESTS)", field="file")
    try:
        with transaction.atomic():
            trace = Trace.objects.create(deployment=deployment, name=name, format=fmt, recording=False,
                                         start=_start(parsed), created_by=actor[:150])
            _add(trace, parsed.rows)
    except IntegrityError:
        raise conflict(f"deployment {deployment.name} already has a trace named {name!r}: delete it first, or "
                       "import under another name") from None
    return trace


def _start(parsed: Parsed) -> datetime:
    return datetime.fromtimestamp(parsed.start, tz=dt_timezone.utc) if parsed.start else timezone.now()


def _add(trace: Trace, rows: list[dict]) -> None:
    for i in range(0, len(rows), BATCH):
        TraceRequest.objects.bulk_create([TraceRequest(trace=trace, **{k: row.get(k, _DEFAULTS.get(k))
                                                                         for k in FIELDS if k in row or k in _DEFAULTS})
                                          for row in rows[i:i + BATCH]])


_DEFAULTS = {"tenant": "", "priority": "", "prompt_estimated": False, "max_tokens": None, "block_tokens": 0,
             "hashes": [], "ttft_s": None, "e2e_s": None, "outcome": "", "revision": None}


def trace_delete(trace: Trace) -> None:
    trace.delete()


def recorded_trace(deployment: Deployment) -> Trace:
    """The deployment's recorded trace (created empty, recording, when first asked for)."""
    trace, _ = Trace.objects.get_or_create(deployment=deployment, name=RECORDED,
                                           defaults={"start": timezone.now(), "format": "tandem"})
    return trace


def recording_set(trace: Trace, *, sample: float | None = None, recording: bool | None = None) -> Trace:
    if trace.name != RECORDED:
        raise invalid("only the recorded trace records: an imported trace is fixed", field="name")
    if sample is not None:
        if not 0 <= sample <= 1:
            raise invalid(f"sample must be within 0..1, not {sample}", field="sample")
        trace.sample = sample
    if recording is not None:
        trace.recording = recording
    trace.save(update_fields=["sample", "recording"])
    return trace


def sampled(sample: float, started: float, seq: int) -> bool:
    """Whether a gateway record is kept at `sample`: a hash of the record's identity, so a pull that reads it again
    decides alike."""
    if sample >= 1:
        return True
    return zlib.crc32(f"{started:.6f}/{seq}".encode()) / 0xFFFFFFFF < sample


def store_page(trace: Trace, gateway_id: int, page: dict) -> int:
    """Store what one /trace page holds beyond the gateway's cursor of the trace's deployment, and move the cursor,
    in one transaction. Returns the records stored."""
    started, records = float(page["started"]), page["records"]
    with transaction.atomic():
        cursor, _ = TraceCursor.objects.select_for_update().get_or_create(
            gateway_id=gateway_id, deployment_id=trace.deployment_id, defaults={"started": started, "last": 0})
        if abs(cursor.started - started) > 1e-6:  # the gateway restarted: its numbers start again at 1
            cursor.started, cursor.last = started, 0
        fresh = [r for r in records if r["seq"] > cursor.last]
        if fresh and fresh[0]["seq"] > cursor.last + 1:
            cursor.lost += fresh[0]["seq"] - cursor.last - 1
        start = trace.start.timestamp()
        rows = []
        for record in fresh:
            if trace.recording and sampled(trace.sample, started, record["seq"]):
                rows.append({**{key: record.get(key) for key in FIELDS if key in record},
                             "at_s": record["t"] - start, "priority": record.get("class") or "",
                             "tenant": (record.get("tenant") or "")[:63],
                             "revision": _int_or_none(record.get("revision"))})
        _add(trace, rows)
        if fresh:
            cursor.last = fresh[-1]["seq"]
        cursor.save()
    return len(rows)


def _int_or_none(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def cursor_position(gateway_id: int, deployment_id: int) -> tuple[float | None, int]:
    row = (TraceCursor.objects.filter(gateway_id=gateway_id, deployment_id=deployment_id)
           .values_list("started", "last").first())
    return (row[0], row[1]) if row else (None, 0)


def prune(*, now: datetime | None = None, live_gateways: set[int] | None = None) -> int:
    """Recorded requests past TANDEM_TRACE_RETENTION_S, beyond TANDEM_TRACE_MAX_REQUESTS per recorded trace (the
    oldest first), and cursors of gateways that are gone. Imported traces stay until deleted."""
    now = now or timezone.now()
    removed = 0
    for trace in Trace.objects.filter(name=RECORDED):
        cutoff = (now - timedelta(seconds=settings.TANDEM_TRACE_RETENTION_S) - trace.start).total_seconds()
        removed += TraceRequest.objects.filter(trace=trace, at_s__lt=cutoff).delete()[0]
        keep = settings.TANDEM_TRACE_MAX_REQUESTS
        edge = (TraceRequest.objects.filter(trace=trace).order_by("-at_s")
                .values_list("at_s", flat=True)[keep:keep + 1].first())
        if edge is not None:
            removed += TraceRequest.objects.filter(trace=trace, at_s__lte=edge).delete()[0]
    if live_gateways is not None:
        TraceCursor.objects.exclude(gateway_id__in=live_gateways).delete()
    return removed
