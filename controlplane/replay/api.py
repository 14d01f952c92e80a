"""The REST API of request traces: /api/v1/deployments/{name}/traces...

- GET  traces: the deployment's traces (the recorded one, and imports) with their size and span. Viewer.
- POST traces/import?format=azure|mooncake|tandem&name=NAME: the body is the file (`curl --data-binary @file`);
  stored whole or not at all (a 400 names the bad line and field). Operator.
- GET  traces/{trace}: its summary (outcomes, tenants, mean sizes). Viewer.
- PATCH traces/recorded: {"sample": 0..1, "recording": bool}. Operator.
- DELETE traces/{trace}. Operator.
- GET  traces/{trace}/requests.jsonl?since=&until= (seconds from the trace's start): the requests, one JSON
  object a line, in the `tandem` import format. Viewer.
- GET / PUT change-gate: {"enabled", "window_s"}: the deployment's change gate (gate.py). Viewer / operator.
- POST what-if: {"trace", "since", "until", "change"}: the window replayed on the deployment as it stands and as
  changed (whatif.py), side by side. Viewer: it changes nothing.
"""
from __future__ import annotations

from django.conf import settings
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.response import Response
from rest_framework.settings import api_settings

from controlplane.api.views.base import ERRORS, OPERATE, READ, READ_ERRORS, ApiView, StrictSerializer
from controlplane.errors import invalid
from controlplane.replay.formats import PARSERS, export_line
from controlplane.replay.selectors import trace_detail, trace_get, trace_list, trace_window
from controlplane.replay.services import FIELDS, recording_set, trace_delete, trace_import
from controlplane.replay.gate import gate_of, gate_set
from controlplane.replay.whatif import what_if
from controlplane.selectors import deployment_get

EXPORT_BATCH = 5000


class TraceSerializer(serializers.Serializer):
    name = serializers.CharField()
    format = serializers.CharField()
    start = serializers.DateTimeField()
    requests = serializers.IntegerField()
    duration_s = serializers.FloatField()
    recording = serializers.BooleanField()
    sample = serializers.FloatField()


class RecordingSerializer(StrictSerializer):
    sample = serializers.FloatField(required=False, min_value=0.0, max_value=1.0)
    recording = serializers.BooleanField(required=False)


def _seconds(params, name: str) -> float | None:
    raw = params.get(name)
    if raw in (None, ""):
        return None
    try:
        return float(raw)
    except ValueError:
        raise invalid(f"{name} must be seconds from the trace's start, not {raw!r}", field=name) from None


class FileFormatParam(DefaultContentNegotiation):
    """`?format=` names the file's format here, not the answer's (DRF reads it as a renderer and would 404)."""

    class settings:
        URL_FORMAT_OVERRIDE = None
        FORMAT_SUFFIX_KWARG = api_settings.FORMAT_SUFFIX_KWARG


class TraceListView(ApiView):
    @extend_schema(responses={200: TraceSerializer(many=True), **READ_ERRORS})
    def get(self, request, name: str):
        return Response(trace_list(deployment_get(name)))


class TraceImportView(ApiView):
    write_permission = OPERATE
    content_negotiation_class = FileFormatParam

    @extend_schema(request={"text/plain": str}, responses={201: TraceSerializer, **ERRORS}, parameters=[
        OpenApiParameter("format", str, enum=list(PARSERS), required=True),
        OpenApiParameter("name", str, required=True, description="the new trace's name")],
        description="Import a trace file (the raw body). Operator.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        fmt = request.query_params.get("format")
        if fmt not in PARSERS:
            raise invalid(f"format must be one of {', '.join(PARSERS)}, not {fmt!r}", field="format")
        limit = settings.TANDEM_TRACE_IMPORT_MAX_BYTES
        length = request.META.get("CONTENT_LENGTH") or ""
        if not length.isdigit() or int(length) > limit:
            raise invalid(f"the body must be at most {limit} bytes (TANDEM_TRACE_IMPORT_MAX_BYTES), with a "
                          "Content-Length", field="file")
        try:
            text = request._request.read(int(length)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise invalid(f"the file is not UTF-8 (byte {exc.start})", field="file") from None
        trace = trace_import(deployment, name=request.query_params.get("name"), fmt=fmt, text=text,
                             actor=getattr(request.user, "username", ""))
        return Response(trace_detail(trace), status=201)


class TraceDetailView(ApiView):
    write_permission = OPERATE

    @extend_schema(responses={200: TraceSerializer, **READ_ERRORS})
    def get(self, request, name: str, trace: str):
        return Response(trace_detail(trace_get(deployment_get(name), trace)))

    @extend_schema(request=RecordingSerializer, responses={200: TraceSerializer, **ERRORS},
                   description="Sample or pause the recorded trace. Operator.")
    def patch(self, request, name: str, trace: str):
        row = trace_get(deployment_get(name), trace)
        data = RecordingSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(trace_detail(recording_set(row, **data.validated_data)))

    @extend_schema(responses={204: None, **ERRORS})
    def delete(self, request, name: str, trace: str):
        trace_delete(trace_get(deployment_get(name), trace))
        return Response(status=204)


class TraceRequestsView(ApiView):
    @extend_schema(responses={(200, "application/jsonl"): str, **READ_ERRORS}, parameters=[
        OpenApiParameter("since", float), OpenApiParameter("until", float)])
    def get(self, request, name: str, trace: str):
        row = trace_get(deployment_get(name), trace)
        rows = trace_window(row, since_s=_seconds(request.query_params, "since"),
                            until_s=_seconds(request.query_params, "until")).values_list(*FIELDS)
        start = row.start.timestamp()

        def lines():
            for item in rows.iterator(chunk_size=EXPORT_BATCH):
                yield export_line(dict(zip(FIELDS, item)), start) + "\n"

        response = StreamingHttpResponse(lines(), content_type="application/jsonl")
        response["Content-Disposition"] = f'attachment; filename="{name}-{row.name}.jsonl"'
        return response


class WhatIfSerializer(StrictSerializer):
    trace = serializers.CharField(default="recorded", max_length=63)
    since = serializers.FloatField(required=False, allow_null=True, default=None,
                                   help_text="seconds from the trace's start")
    until = serializers.FloatField(required=False, allow_null=True, default=None)
    change = serializers.DictField(default=dict, help_text="pools, autoscaling, admission, prefix_caching, routing, "
                                                           "traffic: what the change alters")


class WhatIfView(ApiView):
    write_permission = READ

    @extend_schema(request=WhatIfSerializer, responses={200: dict, **ERRORS},
                   description="Replay a window of a trace on the deployment as it stands and as changed. Viewer.")
    def post(self, request, name: str):
        deployment = deployment_get(name)
        data = WhatIfSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        body = data.validated_data
        return Response(what_if(deployment, trace_get(deployment, body["trace"]), change=body["change"],
                                since_s=body["since"], until_s=body["until"]))


class ChangeGateSerializer(StrictSerializer):
    enabled = serializers.BooleanField(required=False)
    window_s = serializers.IntegerField(required=False, help_text="the recorded traffic a change is replayed on")


class ChangeGateView(ApiView):
    write_permission = OPERATE

    @extend_schema(responses={200: ChangeGateSerializer, **READ_ERRORS})
    def get(self, request, name: str):
        return Response(gate_of(deployment_get(name)))

    @extend_schema(request=ChangeGateSerializer, responses={200: ChangeGateSerializer, **ERRORS},
                   description="Turn the deployment's change gate on or off; set the window it replays. Operator.")
    def put(self, request, name: str):
        deployment = deployment_get(name)
        data = ChangeGateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(gate_set(deployment, **data.validated_data))
