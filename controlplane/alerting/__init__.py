"""Alert rules over the scraped series, alert instances and their transitions, silences, notification channels and
deliveries (webhooks out), the Alertmanager receiver (webhook in), the Prometheus rule export and default rules."""
