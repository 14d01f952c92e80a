"""The replay simulation of one deployment: a trace of requests through the gateway's admission and routing, the
engine's prefill and decode steps with the profile's step times, the prefix cache, and the pools' scaling. Pure: no
Django, no clock; values in, a ReplayResult out.

- model.py: the inputs (requests, layout, admission, objectives, scaling) and what a scaling policy observes;
- loop.py: `replay`, the event loop; admission.py: the gateway's queue; routing.py and prefix.py: which worker, and
  what its cache holds; stages.py: a worker's steps; state.py: requests in flight and workers; fleet.py: the pools
  and their changes of size; autoscaler.py: the real autoscaler's rule as a policy; stats.py: what is reported.
"""
from controlplane.replay.sim.loop import replay
from controlplane.replay.sim.model import (Admission, Layout, Objectives, Observation, PoolObservation, ReplayRequest,
                                           Scaling)
from controlplane.replay.sim.stats import ReplayResult

__all__ = ["Admission", "Layout", "Objectives", "Observation", "PoolObservation", "ReplayRequest", "ReplayResult",
           "Scaling", "replay"]
