from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response

from controlplane.api.serializers import ActionSerializer
from controlplane.api.views.base import READ_ERRORS, ApiView, id_or_404
from controlplane.models import ActionKind, ActionStatus, ActorType
from controlplane.selectors import MAX_ID, action_get, action_list


class ActionPagination(PageNumberPagination):
    # The audit log grows without bound; every other list is bounded by the size of the fleet.
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class ActionFilter(serializers.Serializer):
    deployment = serializers.CharField(required=False, max_length=63)
    actor = serializers.CharField(required=False, max_length=150)
    actor_type = serializers.ChoiceField(choices=ActorType.choices, required=False)
    kind = serializers.ChoiceField(choices=ActionKind.choices, required=False)
    status = serializers.ChoiceField(choices=ActionStatus.choices, required=False)
    worker = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID)


class ActionListView(ApiView):
    pagination_class = ActionPagination

    @extend_schema(parameters=[ActionFilter], responses={200: ActionSerializer(many=True), **READ_ERRORS},
                   description="The audit log, newest first, paginated (`page`, `page_size` ≤ 500); filters: "
                               "deployment name (kept after a delete), actor, actor_type, kind, status, worker. "
                               "Viewer.")
    def get(self, request):
        filters = ActionFilter(data=request.query_params)
        filters.is_valid(raise_exception=True)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(action_list(**filters.validated_data), request, view=self)
        return paginator.get_paginated_response(ActionSerializer(page, many=True).data)


class ActionDetailView(ApiView):
    @extend_schema(responses={200: ActionSerializer, **READ_ERRORS},
                   description="One action: poll it after a write to see its outcome. Viewer.")
    def get(self, request, action_id: int):
        return Response(ActionSerializer(action_get(id_or_404(action_id, "action"))).data)
