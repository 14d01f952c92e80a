from django.urls import path

from controlplane.alerting.api import advice, views

urlpatterns = [
    path("alert-rules/", views.RuleListView.as_view(), name="alert-rule-list"),
    path("alert-rules/export", views.RuleExportView.as_view(), name="alert-rule-export"),
    path("alert-rules/<int:rule_id>/", views.RuleDetailView.as_view(), name="alert-rule-detail"),
    path("alert-rules/<int:rule_id>/advice", advice.RuleAdviceListView.as_view(), name="alert-rule-advice"),
    path("alert-rules/<int:rule_id>/advice/<int:advice_id>/apply", advice.RuleAdviceApplyView.as_view(),
         name="alert-rule-advice-apply"),
    path("alerts/", views.AlertListView.as_view(), name="alert-list"),
    path("alerts/<int:alert_id>/", views.AlertDetailView.as_view(), name="alert-detail"),
    path("silences/", views.SilenceListView.as_view(), name="silence-list"),
    path("silences/<int:silence_id>/", views.SilenceDetailView.as_view(), name="silence-detail"),
    path("channels/", views.ChannelListView.as_view(), name="channel-list"),
    path("channels/<int:channel_id>/", views.ChannelDetailView.as_view(), name="channel-detail"),
    path("deliveries/", views.DeliveryListView.as_view(), name="delivery-list"),
    path("webhooks/alertmanager", views.AlertmanagerWebhookView.as_view(), name="alertmanager-webhook"),
    path("webhooks/alertmanager/", views.AlertmanagerWebhookView.as_view(schema=None)),
]
