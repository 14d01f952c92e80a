"""The capacity page's profiles in words and plots: fitted curves written out with units and 3 significant digits,
the figures of measured points and fitted curves, and the live points against those curves (with
controlplane.capacity.selectors.profile_checks). Pure: profiles and points in, text and figure dicts out."""
from __future__ import annotations

import math

from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve

_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def duration_text(seconds: float) -> str:
    """Seconds in the unit that keeps the number readable, 3 significant digits: '3.9 s', '12.3 ms', '4.1 µs'."""
    if seconds == 0 or not math.isfinite(seconds):
        return f"{seconds:g} s"
    for size, unit in _UNITS:
        if abs(seconds) >= size or unit == "ns":
            return f"{seconds / size:.3g} {unit}"
    raise AssertionError("unreachable: ns is the last unit")


def _sum(terms: list[tuple[float, str]]) -> str:
    """'12 ms + 0.31 ms/token'; zero terms left out (a constant 0 is written when nothing else is left)."""
    kept = [duration_text(value) + suffix for value, suffix in terms if value]
    return " + ".join(kept) if kept else "0 s"


def fit_lines(fits: dict) -> list[tuple[str, str]]:
    """A profile's fits as [(stage, text)], e.g. ("prefill", "one prompt of n tokens ≈ 12 ms + 0.31 ms/token·n")."""
    lines = []
    if "prefill" in fits:
        f = PrefillCurve(**fits["prefill"])
        lines.append(("prefill", "one prompt of n tokens ≈ " + _sum([(f.a, ""), (f.b, "/token·n"),
                                                                    (f.c, "/token²·n²")])))
    if "decode" in fits:
        f = DecodeCurve(**fits["decode"])
        lines.append(("decode", "a step of B sequences of context L ≈ " + _sum([(f.a, ""), (f.b, "·B"),
                                                                               (f.c, "·B·L")])))
    if "kv_transfer" in fits:
        lines.append(("KV transfer", duration_text(fits["kv_transfer"]["seconds_per_token"]) + "/prompt token"))
    if "overhead" in fits:
        lines.append(("overhead", duration_text(fits["overhead"]["request_s"]) + " per request"))
    return lines


def check_text(check: dict) -> str:
    """A check of controlplane.capacity.selectors.profile_checks in words."""
    point = check["point"]
    if check["stage"] == "prefill":
        what = f"P50 time to first token of {point['batch_tokens']}-token prompts"
    else:
        what = f"P50 inter-token latency at {point['batch']:g} sequences of context {point['context']}"
    when = "in the last 5 minutes" if check["current"] else "in the newest live point stored"
    if check["ratio"] is None:
        return f"Live {what} {when} is {duration_text(check['live_s'])}; the {check['role']} profile's fit " \
               f"predicts nothing (0 s)."
    ratio = check["ratio"]
    factor = f"{ratio:.2g}× the fit" if ratio >= 1 else f"1/{1 / ratio:.2g} of the fit"
    return (f"Live {what} {when} is {duration_text(check['live_s'])}; the {check['role']} profile "
            f"({check['node_class']}) predicts {duration_text(check['fitted_s'])}: {factor}.")


def _markers(name: str, xs, ys, *, symbol: str, size: int = 7, text=None) -> dict:
    trace = {"type": "scatter", "mode": "markers", "name": name, "x": xs, "y": ys,
             "marker": {"symbol": symbol, "size": size}}
    if text is not None:
        trace["text"] = text
    return trace


def profile_figures(profiles, *, live_now: dict | None = None) -> dict:
    """{"prefill": [traces], "decode": [traces]} for plotly (y in ms): synthetic and stored live points apart, the
    fitted curves, and the live points of the last minutes (`live_now`, selectors.live_points) with the decode fit at
    their context."""
    live_now = live_now or {"prefill": [], "decode": []}
    figures = {"prefill": [], "decode": []}
    for profile in profiles:
        points = profile.points or {}
        fits = profile.fits or {}
        label = f"{profile.role} · {profile.node_class}"
        prefill = points.get("prefill") or []
        for source in ("synthetic", "live"):
            chosen = [p for p in prefill if p.get("source", "synthetic") == source]
            if chosen:
                figures["prefill"].append(_markers(f"{label} {source}", [p["batch_tokens"] for p in chosen],
                                                   [p["latency_s"] * 1000 for p in chosen],
                                                   symbol="circle" if source == "synthetic" else "diamond"))
        if "prefill" in fits and prefill:
            curve = PrefillCurve(**fits["prefill"])
            top = max([p["batch_tokens"] for p in prefill + live_now["prefill"]])
            xs = [round(top * i / 20) for i in range(21)]
            # One prompt of x tokens (a batch of shorter prompts costs less: attention is per prompt).
            figures["prefill"].append({"type": "scatter", "mode": "lines", "name": f"{label} fit, one prompt",
                                       "x": xs, "y": [curve.step_seconds(x) * 1000 for x in xs]})
        decode = points.get("decode") or []
        for source in ("synthetic", "live"):
            chosen = [p for p in decode if p.get("source", "synthetic") == source]
            if chosen:
                figures["decode"].append(_markers(f"{label} {source}", [p["batch"] for p in chosen],
                                                  [p["step_s"] * 1000 for p in chosen],
                                                  symbol="circle" if source == "synthetic" else "diamond",
                                                  text=[f"context {p['context']}" for p in chosen]))
        if "decode" in fits and decode:
            curve = DecodeCurve(**fits["decode"])
            top = max([p["batch"] for p in decode + live_now["decode"]])
            contexts = sorted({p["context"] for p in decode if p.get("source") != "live"})
            contexts += [p["context"] for p in live_now["decode"] if p["context"] not in contexts]
            for context in contexts:
                xs = [1 + (top - 1) * i / 10 for i in range(11)]
                figures["decode"].append({"type": "scatter", "mode": "lines", "name": f"{label} fit, context {context}",
                                          "x": xs, "y": [curve.step_seconds(x, context) * 1000 for x in xs]})
    if figures["prefill"] and live_now["prefill"]:
        figures["prefill"].append(_markers("live now (P50 TTFT)", [p["batch_tokens"] for p in live_now["prefill"]],
                                           [p["latency_s"] * 1000 for p in live_now["prefill"]],
                                           symbol="star", size=13))
    if figures["decode"] and live_now["decode"]:
        figures["decode"].append(_markers("live now (P50 ITL)", [p["batch"] for p in live_now["decode"]],
                                          [p["step_s"] * 1000 for p in live_now["decode"]], symbol="star", size=13,
                                          text=[f"context {p['context']}" for p in live_now["decode"]]))
    return figures
