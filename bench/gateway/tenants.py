"""Tenants sharing a saturated fleet: the gateway's admission queue with fair queuing (VTC), with and without
preemption, against the behaviour before admission, measured in the same run on the same simulated worker
(`--simulate`, no model: the numbers are about scheduling), or with `--model` on one real worker (float32, 1 thread).

One simulated colocated worker runs at most --slots sequences at once (its --max-num-seqs). Two tenants (of class
standard but in the priority scenario) reach it through a stand-in control plane, by one of three gateways started
side by side:
- `before`: the behaviour before admission slots came from the workers: 256 slots per worker
  (--worker-capacity-headroom 256, capped by the default --max-outstanding-per-worker 256), so every request goes
  straight to the worker, which queues what it cannot run in arrival order;
- `admission`: the gateway admits the worker's max_num_seqs (from its /health) + the default headroom, holds the
  backlog in its admission queue and dispatches it by virtual token counter, shedding what waits past its class's
  deadline, but never preempts (--max-preemptions 0): a waiting request waits for a running one to end;
- `preemption`: no flags at all (the defaults): admission as above, and a waiting request that outranks a running one
  (its tenant's counter lower by --preempt-margin) preempts it; the preempted stream resumes later
  (--headroom N passes --worker-capacity-headroom N to both instead).

Three scenarios (--scenarios), each run through every gateway:
- isolation: tenant `noisy` keeps --noisy-streams long requests in flight (closed loop, 4x the slots by default);
  tenant `quiet` sends one short streamed request every --quiet-interval s. Reported: quiet's TTFT and end-to-end
  latency P50/P99 (and unloaded, before the noise starts), and each tenant's share of the completion tokens served.
- fairness: both tenants keep long requests in flight, noisy ten times as many as quiet, so both stay backlogged.
  Reported: each tenant's share of completion tokens (goal of the issue: within 20 % of each other).
- priority: as isolation, but `quiet` is of class interactive and `noisy` of class batch (the control plane hands the
  gateways the new classes first; they take them at their next membership poll). Reported as isolation, against
  quiet's unloaded TTFT as an interactive tenant (goal of the issue: P99 <= 2x unloaded).
- overload: `noisy` alone, of class interactive (deadline 10 s), sends streamed long requests at random (Poisson)
  arrivals, first at the fleet's capacity (requests/s, measured before through `admission` with a closed loop of its
  slots), then at twice it. Goodput: requests per second whose first token came within the class's deadline. Goal of the
  issue: goodput at twice the capacity >= 0.9x goodput at the capacity ("no collapse"). In arrival order every request
  of an overloaded queue waits about the deadline (`before`: the worker's FIFO, without bound); the gateway's admission
  dispatches newest first in an overloaded band (inference/gateway/admission.py).
`--baseline-src DIR` adds a gateway `baseline`, with the defaults as `preemption`, that runs the gateway code of
another checkout (e.g. `git archive HEAD | tar -x -C DIR`), to the priority and overload scenarios: a change to
preemption measured beside the code before it, in one run. `--worker-baseline-flags=--no-interleave-prefill` (with
`=`: the value starts with dashes) adds `worker_baseline` to the isolation and priority scenarios: a gateway with the
defaults in front of a second worker started with those flags (idle while the others run), its own stand-in control
plane: a change to the worker measured beside it, in one run; `--worker-baseline-src DIR` runs that second worker from
another checkout's code (a change to the worker's code measured beside the code before it).

    python bench/gateway/tenants.py                       # several minutes
    python bench/gateway/tenants.py --duration 10 --slots 4 --scenarios priority
    python bench/gateway/tenants.py --model tiny     # a real tiny-model worker instead of the simulated one
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gateway.tenant_load import KEYS, capacity, headroom, overload, scenario, unloaded  # noqa: E402
from bench.lib.common import emit, environment, model_dir  # noqa: E402
from inference.gateway.admission import DEFAULT_HEADROOM  # noqa: E402

SCENARIOS = ("isolation", "fairness", "priority", "overload")
# Each tenant's class while a scenario runs.
CLASSES = {"isolation": {"quiet": "standard", "noisy": "standard"},
           "fairness": {"quiet": "standard", "noisy": "standard"},
           "priority": {"quiet": "interactive", "noisy": "batch"},
           "overload": {"quiet": "interactive", "noisy": "interactive"}}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="smollm2-cpu", help="simulated worker profile (tiny-cpu, smollm2-cpu)")
    p.add_argument("--model", default=None,
                   help="a real colocated worker instead of the simulated one: tiny, smollm2 or a model folder "
                        "(float32, 1 thread)")
    p.add_argument("--slots", type=int, default=8, help="sequences the worker runs at once")
    p.add_argument("--duration", type=float, default=25.0, help="seconds measured per scenario and gateway")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before measuring")
    p.add_argument("--noisy-streams", type=int, default=None, help="noisy's requests in flight (default 4x slots)")
    p.add_argument("--long-tokens", type=int, default=64, help="max_tokens of a long request")
    p.add_argument("--short-tokens", type=int, default=16, help="max_tokens of quiet's short request")
    p.add_argument("--quiet-interval", type=float, default=1.0)
    p.add_argument("--headroom", type=int, default=None,
                   help="`admission` and `preemption` gateways: pass --worker-capacity-headroom N (default: none, "
                        f"the gateway's own default, {DEFAULT_HEADROOM})")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of " + ", ".join(SCENARIOS))
    p.add_argument("--baseline-src", type=Path, default=None,
                   help="a checkout whose gateway code runs as gateway `baseline` (priority, overload scenarios)")
    p.add_argument("--modes", default=None,
                   help="comma-separated gateways to measure, of before, admission, preemption, baseline, "
                        "worker_baseline (default: all that the other flags start; admission is always started: "
                        "the overload scenario measures capacity through it)")
    p.add_argument("--worker-baseline-flags", default=None,
                   help="a second worker with these extra flags, behind a gateway with the defaults "
                        "(`worker_baseline`; isolation and priority scenarios)")
    p.add_argument("--worker-baseline-src", type=Path, default=None,
                   help="a checkout whose worker code runs as that second worker (with --worker-baseline-flags, "
                        "'' for none): a change to the worker measured beside the code before it")
    args = p.parse_args(argv)
    args.scenarios = [name for name in args.scenarios.split(",") if name]
    if args.modes is not None:
        args.modes = [name for name in args.modes.split(",") if name]
        if unknown := set(args.modes) - {"before", "admission", "preemption", "baseline", "worker_baseline"}:
            p.error(f"unknown modes {sorted(unknown)}")
    if unknown := set(args.scenarios) - set(SCENARIOS):
        p.error(f"unknown scenarios {sorted(unknown)}: give some of {', '.join(SCENARIOS)}")
    if args.baseline_src is not None and not (args.baseline_src / "inference" / "gateway").is_dir():
        p.error(f"--baseline-src {args.baseline_src}: no inference/gateway/ there")
    if args.worker_baseline_src is not None:
        if not (args.worker_baseline_src / "inference" / "worker").is_dir():
            p.error(f"--worker-baseline-src {args.worker_baseline_src}: no inference/worker/ there")
        args.worker_baseline_flags = args.worker_baseline_flags or ""
    return args


def _tenant(name: str, priority_class: str) -> dict:
    return {"class": priority_class, "limits": {}, "allowed": True,
            "keys": [{"hash": hashlib.sha256(KEYS[name].encode()).hexdigest(), "expires_at": None}]}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _preemptions(url: str) -> int:
    """Preemptions the gateway counted so far, all tenants together (/metrics)."""
    import requests

    text = requests.get(url + "/metrics", timeout=10).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("tandem_gateway_preemptions_total{")))


def _set_classes(control_planes, gateways: dict[str, str], classes: dict[str, str]) -> None:
    """Hand the gateways the tenants' classes, and wait until each admits every tenant as its new class (its
    queue-wait series by class, /metrics; a class a tenant had before would pass at once: the scenarios give each
    tenant a class new to it): they poll the control plane every couple of seconds."""
    import requests

    for control_plane in control_planes:
        control_plane.endpoints["tenants"] = {name: _tenant(name, classes[name]) for name in KEYS}
    deadline = time.monotonic() + 60
    for url in gateways.values():
        for tenant, priority_class in classes.items():
            while True:
                requests.post(url + "/v1/completions", json={"model": "demo", "prompt": "one", "max_tokens": 1},
                              headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=30)
                lines = requests.get(url + "/metrics", timeout=10).text.splitlines()
                if any(line.startswith("tandem_gateway_queue_wait_seconds_count{")
                       and f'class="{priority_class}"' in line and f'tenant="{tenant}"' in line for line in lines):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not take the classes {classes} within 60 s")
                time.sleep(0.5)


def _loaded_vs_unloaded(result: dict, unloaded_ttft: float | None) -> None:
    result["quiet_ttft_p50_vs_unloaded"] = _ratio(result["quiet_ttft_p50_s"], unloaded_ttft)
    result["quiet_ttft_p99_vs_unloaded"] = _ratio(result["quiet_ttft_p99_s"], unloaded_ttft)


def run(args) -> dict:
    from tests.inference.gateway.support import TOKEN, ControlPlane
    from tests.procs import free_port, start, wait_http

    log_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-tenants-"))
    procs = []
    control_planes = []
    try:
        engine = (["--simulate", args.profile, "--model", "/models/sim-model"] if args.model is None else
                  ["--model", str(model_dir(args.model)), "--dtype", "float32", "--threads", "1",
                   "--kv-cache-bytes", "256M"])

        def fleet(name: str, extra: list[str], src: Path | None = None):
            """A worker (with `extra` flags; the code of checkout `src`) and a stand-in control plane naming it."""
            port = free_port()
            worker = start(name, ["-m", "inference.worker", "--role", "colocated", *engine, "--port", str(port),
                                  "--max-num-seqs", str(args.slots), *extra], log_dir,
                           **({"cwd": src.resolve()} if src else {}))
            procs.append(worker)
            worker_url = f"http://127.0.0.1:{port}"
            wait_http(worker, worker_url + "/health", timeout=60)
            control_plane = ControlPlane()
            control_planes.append(control_plane)
            control_plane.start()
            control_plane.endpoints.update({"groups": [{"revision": 1, "prefill": [], "decode": [],
                                                        "colocated": [worker_url]}], "requires_key": True,
                                            "tenants": {name: _tenant(name, "standard") for name in KEYS}})
            return control_plane

        control_plane = fleet("colocated", [])
        gateways = {}
        defaults = [] if args.headroom is None else ["--worker-capacity-headroom", str(args.headroom)]
        modes = [("before", ["--worker-capacity-headroom", "256"], None, control_plane),
                 ("admission", [*defaults, "--max-preemptions", "0"], None, control_plane),
                 ("preemption", defaults, None, control_plane)]
        if args.baseline_src is not None and {"priority", "overload"} & set(args.scenarios):
            modes.append(("baseline", defaults, args.baseline_src.resolve(), control_plane))
        if args.worker_baseline_flags is not None and {"isolation", "priority"} & set(args.scenarios):
            modes.append(("worker_baseline", defaults, None,
                          fleet("colocated-baseline", shlex.split(args.worker_baseline_flags),
                                args.worker_baseline_src)))
        for mode, flags, src, plane in modes:
            gw_port = free_port()
            proc = start(f"gateway-{mode}", ["-m", "inference.gateway", "--port", str(gw_port), "--control-plane",
                                             plane.url, "--deployment", "demo", "--token", TOKEN, *flags],
                         log_dir, **({"cwd": src} if src else {}))
            procs.append(proc)
            gateways[mode] = f"http://127.0.0.1:{gw_port}"
            wait_http(proc, gateways[mode] + "/health", timeout=60)
        results, classes = {}, None
        for name in args.scenarios:
            if CLASSES[name] != classes:  # and before the first scenario: the gateways learn the tenants
                _set_classes(control_planes, gateways, CLASSES[name])
                classes = CLASSES[name]
            if name == "priority":
                results["unloaded_interactive_quiet"] = asyncio.run(unloaded(gateways["preemption"], args))
            elif name != "overload" and "unloaded_quiet" not in results:
                results["unloaded_quiet"] = asyncio.run(unloaded(gateways["preemption"], args))
            # Alternate the order so that drift on a shared machine does not favour one gateway.
            order = [mode for mode in ("before", "admission", "preemption", "baseline", "worker_baseline")
                     if mode in gateways and (args.modes is None or mode in args.modes)]
            order = order if name != "fairness" else order[::-1]
            results[name] = {}
            if name == "overload":
                rate = asyncio.run(capacity(gateways["admission"], args))
                results[name]["capacity_rps"] = round(rate, 2)
                for mode in (m for m in order if m != "worker_baseline"):
                    at_1x, at_2x = (asyncio.run(overload(gateways[mode], args, factor * rate)) for factor in (1, 2))
                    results[name][mode] = {"1x": at_1x, "2x": at_2x, "goodput_2x_vs_1x": _ratio(
                        at_2x["goodput_rps"], at_1x["goodput_rps"])}
                continue
            for mode in order:
                if (mode == "baseline" and name != "priority"
                        or mode == "worker_baseline" and name not in ("isolation", "priority")):
                    continue
                before = _preemptions(gateways[mode])
                results[name][mode] = asyncio.run(scenario(gateways[mode], name, args))
                results[name][mode]["preemptions"] = _preemptions(gateways[mode]) - before
    finally:
        for proc in reversed(procs):
            proc.stop()
        for control_plane in control_planes:
            control_plane.stop()
    goals = {}
    for name, factor in (("isolation", 1.5), ("priority", 2.0)):
        unloaded_ttft = results.get("unloaded_quiet" if name == "isolation" else "unloaded_interactive_quiet",
                                    {}).get("ttft_p50_s")
        for mode, result in results.get(name, {}).items():
            _loaded_vs_unloaded(result, unloaded_ttft)
            if mode != "before" and result["quiet_ttft_p99_s"] and unloaded_ttft:
                goals[f"{name}: quiet TTFT P99 <= {factor:g}x unloaded ({mode})"] = (
                    result["quiet_ttft_p99_s"] <= factor * unloaded_ttft)
    for mode, result in results.get("fairness", {}).items():
        shares = result["token_share"]
        if mode != "before":
            goals[f"fairness: token shares within 20% of each other ({mode})"] = (
                min(shares.values()) >= 0.8 * max(shares.values()))
    for mode, result in results.get("overload", {}).items():
        if mode not in ("before", "capacity_rps") and result["goodput_2x_vs_1x"] is not None:
            goals[f"overload: goodput at 2x >= 0.9x at 1x ({mode})"] = result["goodput_2x_vs_1x"] >= 0.9
    iso = results.get("isolation", {})
    worker = {"simulated": args.profile} if args.model is None else {"model": args.model, "dtype": "float32"}
    return {"benchmark": "gateway_tenants", "worker": worker, "slots": args.slots, "headroom": headroom(args),
            "noisy_streams": args.noisy_streams or 4 * args.slots, "long_tokens": args.long_tokens,
            "short_tokens": args.short_tokens, "duration_s": args.duration, **results,
            "speedup_quiet_e2e_p50": _ratio(iso.get("before", {}).get("quiet_e2e_p50_s"),
                                            iso.get("preemption", {}).get("quiet_e2e_p50_s")),
            "goals": goals, "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
