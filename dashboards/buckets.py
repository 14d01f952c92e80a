"""The largest latency a stored quantile can say. The workers' latency histograms end at a last finite bucket
(inference.metrics: TTFT at 80 s, ITL at 5 s, end-to-end at 320 s); a quantile whose rank falls in the +Inf bucket
is stored as that bound (observability.quantiles.histogram_quantile, as Prometheus does), so a 110 s TTFT is stored
as 80 s. The pages write such a value as "> 80 s" instead of a number it is not."""
from __future__ import annotations

from inference.metrics import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS

_TOPS = {"ttft": TTFT_BUCKETS[-1], "itl": ITL_BUCKETS[-1], "e2e": E2E_BUCKETS[-1]}


def histogram_top(metric: str) -> float | None:
    """The last finite bucket bound behind a stored latency quantile ("ttft_p99_seconds" → 80.0), else None."""
    prefix, _, rest = metric.partition("_")
    if prefix in _TOPS and rest.startswith("p") and rest.endswith("_seconds"):
        return float(_TOPS[prefix])
    return None


def above_top(value: float | None, metric: str) -> bool:
    """Whether a stored quantile sits at its histogram's top: the latency was more than that, by how much unknown."""
    top = histogram_top(metric)
    return top is not None and value is not None and value >= top
