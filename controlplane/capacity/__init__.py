"""Capacity: stage profiles, the planner, per-pool schedules and predictive floors, in two halves.

The pure half, `sizing/` (no Django, nothing of the project outside it; tests/test_import_graph.py keeps it so):
- curves.py: the fitted prefill and decode step curves; calibration.py: from measured points to fits and to the
  simulation's StageModel, and a live point against its fit; simulation.py: one layout serving a traffic profile;
  search.py: replicas per pool for objectives, headroom and cost; windows.py: cron windows in a time zone.

The half that reads and writes rows:
- models.py: Profile, ProfileJob, PoolSchedule, PredictiveScaling, written by this package alone.
- selectors.py: reads shared by the API, the capacity and deployment pages and the services (profiles, profile
  jobs, schedule rows, the traffic and live points of the scraped series).
- services/: the writes, one module per thing written: profile_jobs.py (queue, claim and run a profile job),
  profiles.py (store a run's points, add live ones), plans.py (a plan against the fleet, its apply),
  schedules.py (schedules, predictive settings), bounds.py (the autoscaler's bounds at an instant).
- load_driver.py: the profile run's HTTP load against its own workers (no Django; the profile job stores its points).
- export.py: stored profiles as one simulated-worker profile (`tandem_profile --export`); the fits are copied as
  stored, in the stage-cost format both sides read (inference/stage_costs.py).
- api.py, urls.py: the REST API; tasks.py, apps.py: the profile task and the periodic live refinement.
"""
