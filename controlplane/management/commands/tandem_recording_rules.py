"""`manage.py tandem_recording_rules [--output FILE]`: the Prometheus recording rules that the `prometheus` metrics
backend reads (controlplane/observability/recording_rules.py), for Prometheus' `rule_files`. Rates and quantiles
are over TANDEM_SCRAPE_WINDOW_S and the rules are evaluated every TANDEM_SCRAPE_INTERVAL_S: run it again after
changing either. `promtool check rules FILE` checks the file.

    python manage.py tandem_recording_rules --output /etc/prometheus/rules/tandem.yml
"""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from controlplane.observability.recording_rules import rules_file


class Command(BaseCommand):
    help = "Print (or write) the Prometheus recording rules Tandem reads with TANDEM_METRICS_BACKEND=prometheus."

    def add_arguments(self, parser):
        parser.add_argument("--output", help="write the rules to this file instead of stdout")

    def handle(self, *args, output: str | None = None, **options):
        text = rules_file(window_s=settings.TANDEM_SCRAPE_WINDOW_S, interval_s=settings.TANDEM_SCRAPE_INTERVAL_S)
        if output:
            Path(output).write_text(text)
            self.stderr.write(f"wrote {output}")
        else:
            self.stdout.write(text, ending="")
