"""The replica search: replicas per pool for a traffic profile and latency objectives, in both layouts, with
predicted P99s, utilisation, headroom and cost. Pure; the plan service (services/plans.py) feeds it stage models
from the stored profiles.

1. For each layout, the fewest replicas whose simulation (simulation.py) meets both objectives with a stable queue:
   disaggregated sizes the prefill pool on TTFT first (decode never holds prefill back: a decode worker queues the
   KV it receives), then the decode pool on ITL with that prefill pool; colocated sizes one pool on both. Feasibility
   is taken as monotone in replicas, so each search is a doubling then a bisection (a dozen simulations at most).
2. A layout is infeasible when even one replica idle misses an objective (e.g. one decode step at batch 1 is slower
   than the ITL objective): more replicas cannot help, and the plan says so.
3. Headroom: how much more traffic the planned replicas carry within the objectives (bisection on the rate
   multiplier); cost per hour = Σ replicas × price of their node class; cost per million tokens counts prompt and
   output tokens served.
4. Recommendation: the cheaper feasible layout per hour (a tie goes to colocated: fewer moving parts).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.capacity.sizing.simulation import Result, StageModel, Traffic, simulate

MAX_REPLICAS = 256
LAYOUTS = ("disaggregated", "colocated")


@dataclass(frozen=True, slots=True)
class Objectives:
    ttft_p99_s: float
    itl_p99_s: float

    def __post_init__(self) -> None:
        for name in ("ttft_p99_s", "itl_p99_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, not {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Prices:
    """Price of one worker-hour per pool (its node class), in the operator's currency."""

    prefill: float = 1.0
    decode: float = 1.0
    colocated: float = 1.0


@dataclass(slots=True)
class LayoutPlan:
    layout: str
    feasible: bool
    replicas: dict[str, int]
    reason: str = ""
    predicted: dict = field(default_factory=dict)  # ttft/itl p50/p99, throughput, utilisation
    headroom: float | None = None  # extra traffic share the plan carries within the objectives (0.25 = +25%)
    cost_per_hour: float | None = None
    cost_per_million_tokens: float | None = None

    def as_dict(self) -> dict:
        return {"layout": self.layout, "feasible": self.feasible, "replicas": self.replicas, "reason": self.reason,
                "predicted": self.predicted, "headroom": self.headroom, "cost_per_hour": self.cost_per_hour,
                "cost_per_million_tokens": self.cost_per_million_tokens}


def _meets(result: Result, objectives: Objectives, *, ttft: bool = True, itl: bool = True) -> bool:
    return result.stable and (not ttft or result.ttft_p99_s <= objectives.ttft_p99_s) and \
        (not itl or result.itl_p99_s <= objectives.itl_p99_s)


def _smallest(ok, low: int = 1) -> int | None:
    """The smallest n ≥ low with ok(n), for ok monotone; None when even MAX_REPLICAS fails."""
    high = low
    while not ok(high):
        if high >= MAX_REPLICAS:
            return None
        low, high = high + 1, min(MAX_REPLICAS, high * 2)
    while low < high:
        middle = (low + high) // 2
        if ok(middle):
            high = middle
        else:
            low = middle + 1
    return high


def _floor_check(model: StageModel, traffic: Traffic, objectives: Objectives, layout: str) -> str:
    """Why no number of replicas can meet the objectives (an idle replica's latencies), or ''."""
    context = traffic.prompt_tokens_mean + traffic.output_tokens_mean / 2
    step = model.decode.step_seconds(1, context)
    if step > objectives.itl_p99_s:
        return (f"one decode step at batch 1 takes {step * 1000:.1f} ms (context {context:.0f}), above the ITL "
                f"objective of {objectives.itl_p99_s * 1000:.1f} ms: no number of replicas meets it")
    prefill = model.prefill.step_seconds(traffic.prompt_tokens_mean) + (
        model.kv_transfer_s if layout == "disaggregated" else 0.0)
    if prefill > objectives.ttft_p99_s:
        return (f"prefill of a mean prompt ({traffic.prompt_tokens_mean:.0f} tokens) alone takes "
                f"{prefill * 1000:.1f} ms, above the TTFT objective of {objectives.ttft_p99_s * 1000:.1f} ms")
    return ""


def _predicted(result: Result) -> dict:
    return {"ttft_p99_s": result.ttft_p99_s, "itl_p99_s": result.itl_p99_s, "ttft_p50_s": result.ttft_p50_s,
            "itl_p50_s": result.itl_p50_s, "throughput_rps": result.throughput_rps,
            "output_tokens_per_s": result.output_tokens_per_s, "utilisation": result.utilisation,
            "stable": result.stable}


def plan_layout(layout: str, *, models: dict[str, StageModel], traffic: Traffic, objectives: Objectives,
                prices: Prices, num_requests: int = 600, headroom: bool = True) -> LayoutPlan:
    """Size one layout. `models`: {"prefill", "decode"} for disaggregated, {"colocated"} for colocated."""
    model = models["colocated"] if layout == "colocated" else models["decode"]
    run_args = {"num_requests": num_requests}
    if layout == "disaggregated":
        prefill_model = models["prefill"]
        why = _floor_check(prefill_model, traffic, objectives, layout)
        why = why if why.startswith("prefill") else _floor_check(model, traffic, objectives, layout)
        if why:
            return LayoutPlan(layout, False, {}, why)
        joint = disaggregated_model(prefill_model, model)
        # Prefill first with a decode pool that never holds anything up (it only gates ITL, not TTFT).
        num_prefill = _smallest(lambda n: _meets(simulate(joint, traffic, layout=layout, prefill_replicas=n,
                                                          decode_replicas=MAX_REPLICAS, **run_args),
                                                 objectives, itl=False))
        if num_prefill is None:
            return LayoutPlan(layout, False, {}, f"TTFT P99 not met with {MAX_REPLICAS} prefill replicas")
        num_decode = _smallest(lambda n: _meets(simulate(joint, traffic, layout=layout, prefill_replicas=num_prefill,
                                                         decode_replicas=n, **run_args), objectives))
        if num_decode is None:
            return LayoutPlan(layout, False, {}, f"ITL P99 not met with {MAX_REPLICAS} decode replicas")
        replicas = {"prefill": num_prefill, "decode": num_decode}

        def run(t: Traffic) -> Result:
            return simulate(joint, t, layout=layout, prefill_replicas=num_prefill, decode_replicas=num_decode,
                            **run_args)
        cost = num_prefill * prices.prefill + num_decode * prices.decode
    else:
        why = _floor_check(model, traffic, objectives, layout)
        if why:
            return LayoutPlan(layout, False, {}, why)
        num = _smallest(lambda n: _meets(simulate(model, traffic, layout=layout, decode_replicas=n, **run_args),
                                         objectives))
        if num is None:
            return LayoutPlan(layout, False, {}, f"objectives not met with {MAX_REPLICAS} colocated replicas")
        replicas = {"colocated": num}

        def run(t: Traffic) -> Result:
            return simulate(model, t, layout=layout, decode_replicas=num, **run_args)
        cost = num * prices.colocated
    result = run(traffic)
    tokens_per_hour = traffic.requests_per_s * (traffic.prompt_tokens_mean + traffic.output_tokens_mean) * 3600
    plan = LayoutPlan(layout, True, replicas, predicted=_predicted(result), cost_per_hour=cost,
                      cost_per_million_tokens=cost / tokens_per_hour * 1e6)
    if headroom:
        plan.headroom = _headroom(run, traffic, objectives)
    return plan


def _headroom(run, traffic: Traffic, objectives: Objectives, *, steps: int = 6) -> float:
    """The largest extra share of traffic (up to +300%) the plan still carries within the objectives."""
    low, high = 1.0, 4.0
    if _meets(run(traffic.scaled(rate=high)), objectives):
        return high - 1.0
    for _ in range(steps):
        middle = (low + high) / 2
        if _meets(run(traffic.scaled(rate=middle)), objectives):
            low = middle
        else:
            high = middle
    return round(low - 1.0, 3)


def capacity_rps(run, traffic: Traffic, objectives: Objectives, *, steps: int = 7) -> float:
    """Requests/s the sized replicas carry within the objectives: the rate doubled until they are missed, then
    bisected (unbounded, unlike the plan's headroom, which stops at +300%)."""
    low, high = 0.0, traffic.requests_per_s
    while _meets(run(traffic.scaled(rate=high / traffic.requests_per_s)), objectives):
        low, high = high, high * 2
        if high > 1e6:
            return high
    for _ in range(steps):
        middle = (low + high) / 2
        if _meets(run(traffic.scaled(rate=middle / traffic.requests_per_s)), objectives):
            low = middle
        else:
            high = middle
    return low


def plan(*, models: dict[str, StageModel], traffic: Traffic, objectives: Objectives, prices: Prices,
         layouts: tuple[str, ...] = LAYOUTS, num_requests: int = 600, headroom: bool = True) -> dict:
    """Both layouts side by side and the recommendation: {"layouts": {name: LayoutPlan.as_dict()},
    "recommended": name | None, "why": text}."""
    plans = {layout: plan_layout(layout, models=models, traffic=traffic, objectives=objectives, prices=prices,
                                 num_requests=num_requests, headroom=headroom) for layout in layouts}
    feasible = [p for p in plans.values() if p.feasible]
    if not feasible:
        recommended, why = None, "no layout meets the objectives: " + "; ".join(
            f"{p.layout}: {p.reason}" for p in plans.values())
    else:
        best = min(feasible, key=lambda p: (round(p.cost_per_hour, 9), p.layout != "colocated"))
        recommended = best.layout
        others = [p for p in feasible if p is not best]
        why = (f"{best.layout} meets both objectives at {best.cost_per_hour:.2f}/hour"
               + (f", against {others[0].cost_per_hour:.2f}/hour for {others[0].layout}" if others else
                  "; " + "; ".join(f"{p.layout}: {p.reason}" for p in plans.values() if not p.feasible)))
    return {"layouts": {name: p.as_dict() for name, p in plans.items()}, "recommended": recommended, "why": why}


def replica_capacity_rps(role: str, *, models: dict[str, StageModel], traffic: Traffic, objectives: Objectives,
                         num_requests: int = 300) -> float:
    """Requests/s one replica of `role` carries within the objectives at the traffic's shape (capacity_rps), the
    other pool of a disaggregated layout never the bottleneck."""
    if role == "colocated":
        def run(t: Traffic) -> Result:
            return simulate(models["colocated"], t, layout="colocated", decode_replicas=1, num_requests=num_requests)
    else:
        joint = disaggregated_model(models["prefill"], models["decode"])
        many = 64  # the other pool never the bottleneck

        def run(t: Traffic) -> Result:
            return simulate(joint, t, layout="disaggregated", num_requests=num_requests,
                            prefill_replicas=1 if role == "prefill" else many,
                            decode_replicas=1 if role == "decode" else many)
    return capacity_rps(run, traffic, objectives)


def disaggregated_model(prefill: StageModel, decode: StageModel) -> StageModel:
    """Both pools of a disaggregated layout for the simulation: the KV transfer is the prefill side's cost (with its
    token budget); decode steps, batch limits and the request overhead come from the decode profile."""
    return StageModel(prefill=prefill.prefill, decode=decode.decode, max_num_seqs=decode.max_num_seqs,
                      max_batch_tokens=prefill.max_batch_tokens, kv_capacity_tokens=decode.kv_capacity_tokens,
                      kv_transfer_s=prefill.kv_transfer_s, request_overhead_s=decode.request_overhead_s)


def colocated_model(prefill: StageModel, decode: StageModel) -> StageModel:
    """A colocated worker of the same model and node class, from the disaggregated profiles: both curves, the decode
    batch limits, no KV push (used when the deployment has no colocated profile)."""
    return StageModel(prefill=prefill.prefill, decode=decode.decode, max_num_seqs=decode.max_num_seqs,
                      max_batch_tokens=prefill.max_batch_tokens, kv_capacity_tokens=decode.kv_capacity_tokens,
                      request_overhead_s=decode.request_overhead_s)
