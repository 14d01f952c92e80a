"""Observability: scrape, store, read and re-export the series of every worker and gateway.

- Scrape (store.py, scraper.py, exposition.py): every TANDEM_SCRAPE_INTERVAL_S (5 s) the Celery task
  `observability.scrape_cycle` fetches /metrics of every worker and gateway with status starting/ready/draining
  concurrently (at most TANDEM_SCRAPE_CONCURRENCY at once, TANDEM_SCRAPE_TIMEOUT_S each). A failed scrape stores
  up=0; health check stays the authority for restarts.
- Derive (derive.py, quantiles.py): rates and P50/P90/P99 over TANDEM_SCRAPE_WINDOW_S (30 s) of raw counters kept
  per target in ScrapeState, with Prometheus' histogram_quantile math and counter-reset handling. Series names and
  pool aggregation rules: catalog.py. Client vs server (5xx) error kinds: exposition.py.
- Store (models.py, rollup.py): one row per (target, scrape, metric); 1-minute rollups; retention raw 6 h,
  rollups 14 days (settings), pruned by `observability.rollup_and_prune` every minute. A gateway's request counters
  are also kept as scraped (gateway_counters.py), for windows shorter than the rate window: a chaos fault's.
- Read (series.py, the embedded store's reader): `metric_values` (one value per series over a window: alert rules,
  the fleet overview), `latest_pool_values` (the autoscaler) and `query_series_many` (points over a range: GET
  /api/v1/metrics/query in api.py, and the dashboard's charts).
- The backend seam (reader.py): alert rules, the autoscaler, chaos checks, rollout analysis, the pages' charts and
  values, the query API and the capacity planner read through `reader()`, the embedded store above or, with
  TANDEM_METRICS_BACKEND=prometheus, PromQL over Prometheus (promql.py) and the recording rules it needs
  (recording_rules.py; `manage.py tandem_recording_rules`). Tandem then does not scrape.
- Re-export: GET /metrics, the control plane's own series (telemetry.py, metrics_view.py).

The autoscaler, which acts on these series, is the package controlplane.autoscaling, with its policy table. The
per-revision series of a gateway (RevisionSample, read by the rollout page) are stored and pruned here.
"""
