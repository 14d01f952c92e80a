"""Prometheus metrics shared by the workers and the gateway (names from docs/design.md "Metric names").

Each process builds one `TandemMetrics` with its own `CollectorRegistry` (never the global one, so that tests can
build several in one interpreter), labelled with its `role` and `model`. Every series carries those two labels, so
that a scraper can merge the text of many processes without relabelling.

Types:
- histograms: tandem_time_to_first_token_seconds, tandem_inter_token_latency_seconds,
  tandem_e2e_request_latency_seconds, tandem_kv_transfer_seconds, tandem_batch_tokens_per_step (tokens one engine
  step feeds the model, prefill and decode together: how full chunked prefill keeps its steps) (a histogram rather than a summary so that
  quantiles can be aggregated across workers)
- gauges: tandem_requests_running, tandem_requests_waiting, tandem_kv_cache_usage_ratio, and on workers the info
  metric tandem_worker_info{dtype, dtype_requested, revision, quantization} = 1 once the model is loaded,
  tandem_worker_kernel{kernel, origin} = 1 per C kernel (origin installed, cached, first_use, missing or not
  loaded: inference.engine.kernels.build), and
  tandem_model_weight_bytes (what the loaded weights take, after any quantization), and
  tandem_prefill_roofline_ratio / tandem_decode_roofline_ratio (each stage's efficiency against its host's roofline,
  inference.roofline; absent where the worker has no host figures or the stage has not run); prefix caching:
  tandem_prefix_cache_blocks (KV blocks keyed by their prefix, in use or evictable) and tandem_prefix_cache_hit_ratio
  (hit / queried tokens since the worker started; a dashboard over a window uses the counters' rates instead)
- counters: tandem_prompt_tokens_total, tandem_generation_tokens_total, tandem_prefill_tokens_computed_total,
  tandem_kv_transfer_bytes_total, tandem_request_success_total{finished_reason}, tandem_request_errors_total{kind},
  tandem_prefix_cache_queried_tokens_total (prompt tokens looked up in the prefix cache at admission) and
  tandem_prefix_cache_hit_tokens_total (those found cached: prefill tokens saved),
  and on workers tandem_spec_decode_proposed_tokens_total / tandem_spec_decode_accepted_tokens_total (speculative
  drafts verified and kept; 0 without speculation) with the gauge tandem_spec_decode_acceptance_ratio (accepted /
  proposed since start; a dashboard takes the ratio of the counters' rates instead)
- the gateway's per-request series (latency histograms, token counters, successes, errors) also carry `revision`,
  the revision that served ("" before one was picked); a worker's are as listed
- GPU gauges per device, label `gpu`, from NVML only where it initialises (see `inference.gpu`), and
  tandem_gpu_memory_fragmentation_bytes from torch once a worker computes on a CUDA device (`watch_devices`)

prometheus_client's metric objects are thread-safe, so the engine-loop thread and the asyncio thread may both update.
"""
from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

# Latency buckets: from a fast CPU/GPU step (ms) up to a long request on a loaded CPU host (minutes). TTFT's are no
# more than 1.5x apart from 50 ms up to 2.5 s, where interactive objectives sit: a P99 read from them (chaos
# hypotheses at a multiple of a baseline, SLO alerts) must not jump by a whole bucket when a few requests cross an
# edge (with one bucket from a quarter to half a second, a tiny model's P99 read far above what its clients saw).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0,
                10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
BATCH_TOKENS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
KV_TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST
BASE_LABELS = ("role", "model")


class RequestSeries:
    """What one request observes, bound to one set of label values (role, model and the request labels)."""

    __slots__ = ("time_to_first_token", "inter_token_latency", "e2e_request_latency", "prompt_tokens",
                 "generation_tokens", "_metrics", "_labels")

    def __init__(self, metrics: "TandemMetrics", labels: dict[str, str]) -> None:
        self._metrics, self._labels = metrics, labels
        self.time_to_first_token = metrics._ttft.labels(**labels)
        self.inter_token_latency = metrics._itl.labels(**labels)
        self.e2e_request_latency = metrics._e2e.labels(**labels)
        self.prompt_tokens = metrics._prompt_tokens.labels(**labels)
        self.generation_tokens = metrics._generation_tokens.labels(**labels)

    def count_success(self, finished_reason: str) -> None:
        self._metrics._success.labels(**self._labels, finished_reason=finished_reason).inc()

    def count_error(self, kind: str) -> None:
        self._metrics._errors.labels(**self._labels, kind=kind).inc()


class TandemMetrics:
    """All tandem_* series of one process, bound to its role and model.

    `role` is "prefill", "decode", "colocated" or "gateway"; `model` the model folder name (workers) or the served
    model name (gateway). `gpu=True` adds the NVML collector (absent series where NVML does not initialise).
    `request_labels`: more labels on the per-request series (latencies, token counters, successes, errors), bound
    per request with `requests(...)`; the gateway's is `revision`, the revision that served the request.
    """

    def __init__(self, *, role: str, model: str, registry: CollectorRegistry | None = None,
                 process: bool = True, gpu: bool = True, request_labels: tuple[str, ...] = ()):
        # The *_created series double the scrape size and no dashboard or rule reads them (process-wide switch).
        disable_created_metrics()
        self.role, self.model = role, model
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        if process:
            # The process collector's CPU and memory series stand in for GPU series on a CPU host.
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
        labels = {"role": role, "model": model}

        def histogram(name, doc, buckets):
            return Histogram(name, doc, BASE_LABELS, buckets=buckets, registry=r).labels(**labels)

        def gauge(name, doc):
            return Gauge(name, doc, BASE_LABELS, registry=r).labels(**labels)

        def counter(name, doc):
            # prometheus_client appends _total itself; pass the base name.
            return Counter(name.removesuffix("_total"), doc, BASE_LABELS, registry=r).labels(**labels)

        # The per-request series carry `request_labels` after role and model (the gateway's `revision`); `requests()`
        # binds them. The attributes below are the series with every request label "" (a worker has none, so they are
        # its only series).
        request_label_names = (*BASE_LABELS, *request_labels)
        self.request_labels = tuple(request_labels)
        self._ttft = Histogram("tandem_time_to_first_token_seconds", "Seconds from request arrival to its first token.",
                               request_label_names, buckets=TTFT_BUCKETS, registry=r)
        self._itl = Histogram("tandem_inter_token_latency_seconds", "Seconds between consecutive tokens of one request.",
                              request_label_names, buckets=ITL_BUCKETS, registry=r)
        self._e2e = Histogram("tandem_e2e_request_latency_seconds", "Seconds from request arrival to its last token.",
                              request_label_names, buckets=E2E_BUCKETS, registry=r)
        self._prompt_tokens = Counter("tandem_prompt_tokens", "Prompt tokens of admitted requests.",
                                      request_label_names, registry=r)
        self._generation_tokens = Counter("tandem_generation_tokens", "Tokens generated and emitted.",
                                          request_label_names, registry=r)
        self._success = Counter("tandem_request_success", "Requests that finished normally.",
                                (*request_label_names, "finished_reason"), registry=r)
        self._errors = Counter("tandem_request_errors", "Requests that failed, by kind.",
                               (*request_label_names, "kind"), registry=r)
        self._request_series: dict[tuple[str, ...], RequestSeries] = {}
        unlabelled = self.requests(**{name: "" for name in request_labels})
        self.time_to_first_token = unlabelled.time_to_first_token
        self.inter_token_latency = unlabelled.inter_token_latency
        self.e2e_request_latency = unlabelled.e2e_request_latency
        self.prompt_tokens = unlabelled.prompt_tokens
        self.generation_tokens = unlabelled.generation_tokens
        self._unlabelled = unlabelled
        self.kv_transfer_seconds = histogram(
            "tandem_kv_transfer_seconds",
            "Seconds to move one request's KV cache (prefill: serialize + push; decode: receive + parse).",
            KV_TRANSFER_BUCKETS)

        self.batch_tokens_per_step = histogram(
            "tandem_batch_tokens_per_step",
            "Tokens fed to the model in one engine step, prefill and decode tokens together.", BATCH_TOKENS_BUCKETS)

        self.requests_running = gauge("tandem_requests_running", "Requests in the running batch.")
        self.requests_waiting = gauge("tandem_requests_waiting", "Requests admitted but waiting to run.")
        self.kv_cache_usage = gauge("tandem_kv_cache_usage_ratio", "Used KV cache blocks / total blocks (0..1).")
        self.batch_limit = gauge("tandem_batch_limit", "Sequences the worker runs at once now: its max_num_seqs, or "
                                 "fewer where its requests' ITL objective bounds the decode batch.")

        self.prefill_tokens_computed = counter(
            "tandem_prefill_tokens_computed_total", "Prompt tokens this process ran a prefill forward pass over.")
        self.kv_transfer_bytes = counter(
            "tandem_kv_transfer_bytes_total", "KV cache payload bytes sent (prefill) or received (decode).")

        self.spec_proposed_tokens = counter(
            "tandem_spec_decode_proposed_tokens_total", "Speculative draft tokens fed to a verify forward.")
        self.spec_accepted_tokens = counter(
            "tandem_spec_decode_accepted_tokens_total", "Speculative draft tokens the verify forward accepted.")
        self.spec_acceptance = gauge("tandem_spec_decode_acceptance_ratio",
                                     "Accepted / proposed speculative draft tokens since the worker started (0..1).")

        self._worker_info = Gauge("tandem_worker_info", "Always 1 on a loaded worker; its labels say what it runs.",
                                  (*BASE_LABELS, "dtype", "dtype_requested", "revision", "quantization"), registry=r)
        self._kernels = Gauge("tandem_worker_kernel", "Always 1 per C kernel; origin: installed (built at install), "
                              "cached or first_use (compiled by a worker), missing, not loaded.",
                              (*BASE_LABELS, "kernel", "origin"), registry=r)
        self.model_weight_bytes = gauge("tandem_model_weight_bytes",
                                        "Bytes the loaded model's weights take (after any quantization).")
        # Unbound until the stage has run a step against a known host figure (inference.roofline): a worker that
        # cannot say exports no series, rather than a 0 that reads as "far below its roofline".
        self._roofline = {stage: Gauge(f"tandem_{stage}_roofline_ratio", doc, BASE_LABELS, registry=r)
                          for stage, doc in (
                              ("prefill", "Prefill matmul FLOP/s (2 x parameters x tokens) / the host's matmul peak "
                                          "for this worker's threads and precision, over the last minute of prefill."),
                              ("decode", "Weight bytes per decode step / (step time x the host's read bandwidth for "
                                         "this worker's threads), over the last minute of decode."))}

        self.prefix_cache_queried_tokens = counter(
            "tandem_prefix_cache_queried_tokens_total", "Prompt tokens looked up in the prefix cache at admission.")
        self.prefix_cache_hit_tokens = counter(
            "tandem_prefix_cache_hit_tokens_total",
            "Prompt tokens found in the prefix cache at admission (prefill tokens saved).")
        self.prefix_cache_hit_ratio = gauge("tandem_prefix_cache_hit_ratio",
                                            "Prefix cache hit tokens / queried tokens since start (0..1).")
        self.prefix_cache_blocks = gauge("tandem_prefix_cache_blocks",
                                         "KV blocks keyed by their prefix (in use or evictable).")
        # The engine counts these since start (its stats key -> counter); each counter advances by what is new.
        self._engine_totals = {"prefix_cache_queried_tokens": self.prefix_cache_queried_tokens,
                               "prefix_cache_hit_tokens": self.prefix_cache_hit_tokens,
                               "num_spec_proposed_tokens": self.spec_proposed_tokens,
                               "num_spec_accepted_tokens": self.spec_accepted_tokens}
        self._engine_totals_seen = dict.fromkeys(self._engine_totals, 0)

        self.gpu_collector = None
        if gpu:
            from inference.gpu import NvmlCollector

            self.gpu_collector = NvmlCollector(role=role, model=model)
            r.register(self.gpu_collector)

    def set_worker_info(self, *, dtype: str, dtype_requested: str, revision: str, quantization: str = "none") -> None:
        """Publish what the loaded worker runs (dtype after `auto` is resolved, what was asked, its weights'
        quantization), Prometheus' info-metric idiom: a gauge of 1 whose labels carry the facts."""
        self._worker_info.labels(role=self.role, model=self.model, dtype=dtype, dtype_requested=dtype_requested,
                                 revision=revision, quantization=quantization).set(1)

    def set_kernels(self, kernels: dict[str, dict]) -> None:
        """tandem_worker_kernel{kernel, origin}: where each C kernel this worker runs came from (build.status())."""
        for kernel, state in kernels.items():
            self._kernels.labels(role=self.role, model=self.model, kernel=kernel, origin=state["origin"]).set(1)

    def set_roofline(self, stage: str, value: float | None) -> None:
        """tandem_<stage>_roofline_ratio: the stage's efficiency against its host's roofline (None: not known)."""
        if value is not None:
            self._roofline[stage].labels(role=self.role, model=self.model).set(value)

    def watch_devices(self, devices: list[str], *, visible_devices: str | None = None) -> None:
        """Export torch's allocator slack of the CUDA devices among `devices` (called once the model is loaded, so
        that a CPU worker never imports torch.cuda for it). `visible_devices` is the process' CUDA_VISIBLE_DEVICES."""
        from inference.gpu import TorchMemoryCollector

        if any(device.startswith("cuda") for device in devices):
            self.registry.register(TorchMemoryCollector(role=self.role, model=self.model, devices=devices,
                                                        visible_devices=visible_devices))

    def requests(self, **values: str) -> RequestSeries:
        """The per-request series bound to these request-label values (all of `request_labels`, by name)."""
        key = tuple(values[name] for name in self.request_labels)
        series = self._request_series.get(key)
        if series is None:
            series = self._request_series[key] = RequestSeries(self, {"role": self.role, "model": self.model,
                                                                     **values})
        return series

    def count_success(self, finished_reason: str) -> None:
        self._unlabelled.count_success(finished_reason)

    def count_error(self, kind: str) -> None:
        self._unlabelled.count_error(kind)

    def set_engine_stats(self, stats: dict) -> None:
        """Copy the engine's `stats()` dict into the gauges (called by the engine-loop thread after each step)."""
        self.requests_running.set(stats.get("num_running", 0))
        self.requests_waiting.set(stats.get("num_waiting", 0))
        self.kv_cache_usage.set(stats.get("kv_usage", 0.0))
        if stats.get("batch_limit") is not None:
            self.batch_limit.set(stats["batch_limit"])
        seen = self._engine_totals_seen
        for key, counter in self._engine_totals.items():
            total = stats.get(key, 0)
            if total > seen[key]:
                counter.inc(total - seen[key])
                seen[key] = total
        queried = seen["prefix_cache_queried_tokens"]
        self.prefix_cache_hit_ratio.set(seen["prefix_cache_hit_tokens"] / queried if queried else 0.0)
        self.prefix_cache_blocks.set(stats.get("prefix_cache_blocks", 0))
        if seen["num_spec_proposed_tokens"]:
            self.spec_acceptance.set(seen["num_spec_accepted_tokens"] / seen["num_spec_proposed_tokens"])

    def render(self) -> bytes:
        """The Prometheus text exposition of this process (serve it with CONTENT_TYPE)."""
        return generate_latest(self.registry)
