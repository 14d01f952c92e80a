"""The per-pool autoscaler: an actor that reads the stored series and writes desired replicas.

- hpa.py: Kubernetes HPA's algorithm for one pool (pure arithmetic, no Django).
- autoscaler.py: one evaluation pass over many pools; reads the observability app's series, applies hpa.decide and
  scales through `pool_scale`; a manual scale pauses that pool's autoscaler (the rule is in its docstring).
- advice.py: advisory mode's rows (ScaleAdvice): recorded by the pass instead of a scale, applied by an operator.
- budget.py: a deployment's budget of workers in all, which caps growth in both modes.
- models.py: the policy table (AutoscalingPolicy), one row per pool; a deployment's mode and budget
  (DeploymentAutoscaling); the advice (ScaleAdvice); all written by this package alone.
- selectors.py, services.py: a deployment's switch, mode and budget and each pool's policy, read (the API's GET) and
  changed (the API's PUT and the dashboard's switch); the advice as the API and the page list it.
- api.py, urls.py: GET/PUT /api/v1/deployments/{name}/autoscaling, GET .../autoscaling/advice and
  POST .../autoscaling/advice/{id}/apply.
- tasks.py, apps.py: the Celery task `autoscaling.autoscale_cycle`, run by beat every TANDEM_SCRAPE_INTERVAL_S on
  the periodic queue.
"""
