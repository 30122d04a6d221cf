"""Prometheus metrics mirroring vLLM's, fed by the engine's own stats.

vLLM calls :class:`EngineStatLogger.record` after every engine step with the
scheduler's stats (running/waiting, KV-cache usage, prefix-cache queries/hits)
and the step's iteration stats (first-token and inter-token latencies, tokens,
finished requests with their queue/prefill/decode times). Nothing here is
re-estimated: each series is vLLM's number under an ``llmesh_inference_`` name
(vLLM's ``vllm:time_to_first_token_seconds`` is
``llmesh_inference_time_to_first_token_seconds`` and so on). vLLM's own Prometheus logger does not
run beside it (:func:`stat_logger_factory`), so ``/metrics`` has no ``vllm:*`` series.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
_LABELS = ("model",)

TIME_TO_FIRST_TOKEN = Histogram(
    "llmesh_inference_time_to_first_token_seconds",
    "Time from arrival to the first generated token (vLLM time_to_first_token_seconds).",
    _LABELS,
    buckets=_LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "llmesh_inference_inter_token_latency_seconds",
    "Time between two generated tokens of one request (vLLM inter_token_latency_seconds).",
    _LABELS,
    buckets=_ITL_BUCKETS,
)
E2E_LATENCY = Histogram(
    "llmesh_inference_e2e_request_latency_seconds",
    "Arrival to finish of finished requests (vLLM e2e_request_latency_seconds).",
    _LABELS,
    buckets=_LATENCY_BUCKETS,
)
QUEUE_TIME = Histogram(
    "llmesh_inference_request_queue_time_seconds",
    "Time finished requests waited before first being scheduled.",
    _LABELS,
    buckets=_LATENCY_BUCKETS,
)
PREFILL_TIME = Histogram(
    "llmesh_inference_request_prefill_time_seconds",
    "Time finished requests spent in prefill.",
    _LABELS,
    buckets=_LATENCY_BUCKETS,
)
DECODE_TIME = Histogram(
    "llmesh_inference_request_decode_time_seconds",
    "Time finished requests spent decoding.",
    _LABELS,
    buckets=_LATENCY_BUCKETS,
)
PROMPT_TOKENS = Counter(
    "llmesh_inference_prompt_tokens", "Prompt tokens processed (cached ones included).", _LABELS
)
CACHED_PROMPT_TOKENS = Counter(
    "llmesh_inference_prompt_tokens_cached", "Prompt tokens served from the prefix cache.", _LABELS
)
GENERATION_TOKENS = Counter("llmesh_inference_generation_tokens", "Tokens generated.", _LABELS)
PROMPT_CHARS = Counter(
    "llmesh_inference_prompt_chars",
    "Characters of rendered prompt text between special tokens, by source: remembered (ids known from "
    "an earlier prompt, not tokenized again: prompt_tokens.py) or tokenized.",
    ("model", "source"),
)
REQUEST_SUCCESS = Counter(
    "llmesh_inference_request_success", "Finished requests by finish reason.", ("model", "finished_reason")
)
PREEMPTIONS = Counter("llmesh_inference_num_preemptions", "Requests preempted by the scheduler.", _LABELS)
RUNNING = Gauge("llmesh_inference_num_requests_running", "Requests in the running batch.", _LABELS)
WAITING = Gauge("llmesh_inference_num_requests_waiting", "Requests waiting to be scheduled.", _LABELS)
KV_CACHE_USAGE = Gauge("llmesh_inference_kv_cache_usage_perc", "KV-cache usage (1 = full).", _LABELS)
WARM_UP = Gauge(
    "llmesh_inference_warm_up_seconds",
    "How long rendering one chat took at start, before the replica served (VllmEngine.warm_up); "
    "0 when it failed.",
    _LABELS,
)
KV_BLOCK_TOKENS = Gauge(
    "llmesh_inference_kv_cache_block_tokens",
    "Tokens per KV-cache block, the prefix cache's unit (LLMESH_INFERENCE_BLOCK_SIZE).",
    _LABELS,
)
KV_BLOCKS = Gauge("llmesh_inference_kv_cache_blocks", "KV-cache blocks the engine allocated.", _LABELS)
PREFIX_CACHE_QUERIES = Counter(
    "llmesh_inference_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", _LABELS
)
PREFIX_CACHE_HITS = Counter(
    "llmesh_inference_prefix_cache_hits", "Prompt tokens found in the prefix cache.", _LABELS
)
ADMISSION_REJECTIONS = Counter(
    "llmesh_inference_admission_rejections",
    "Requests refused with RESOURCE_EXHAUSTED because the engine's queue was full.",
    _LABELS,
)


class SchedulerSnapshot:
    """The scheduler's last reported load (read by GetModelInfo)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    # Engine steps that produced outputs so far (streams align their messages on it:
    # services/inference/coalesce.py).
    steps: int = 0


def stat_logger_factory(model: str, snapshot: SchedulerSnapshot) -> Any:
    """A vLLM stat logger class bound to ``model`` (vLLM instantiates it with its config).

    vLLM adds its own Prometheus logger (``vllm:*`` series, the same numbers as these) unless one
    of the loggers it is given is one: this logger passes for it, so each engine step is recorded
    once, not twice (BENCHMARKS.md, "mesh: this stop's builds beside 239a2fd, …": "The inference
    front end records each engine step once").
    """
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class EngineStatLogger(PrometheusStatLogger):
        # PrometheusStatLogger.__init__ is not called: it would register the vllm:* series.
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
            self.engine_indexes = engine_indexes or [0]
            self._series = Series(model)

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                record_scheduler(self._series, scheduler_stats, snapshot)
            if iteration_stats is not None:
                snapshot.steps += 1
                record_iteration(self._series, iteration_stats)

        def record_admission_rejection(self, reason: str) -> None:
            return None  # the service counts its own (llmesh_inference_admission_rejections)

        def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
            return None

        def log_engine_initialized(self) -> None:
            return None

        def log(self) -> None:
            return None

    return EngineStatLogger


class Series:
    """The series of one model, their label values resolved once (every engine step records)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.running = RUNNING.labels(model)
        self.waiting = WAITING.labels(model)
        self.kv_cache_usage = KV_CACHE_USAGE.labels(model)
        self.prefix_queries = PREFIX_CACHE_QUERIES.labels(model)
        self.prefix_hits = PREFIX_CACHE_HITS.labels(model)
        self.prompt_tokens = PROMPT_TOKENS.labels(model)
        self.cached_prompt_tokens = CACHED_PROMPT_TOKENS.labels(model)
        self.generation_tokens = GENERATION_TOKENS.labels(model)
        self.preemptions = PREEMPTIONS.labels(model)
        self.ttft = TIME_TO_FIRST_TOKEN.labels(model)
        self.itl = INTER_TOKEN_LATENCY.labels(model)
        self.e2e = E2E_LATENCY.labels(model)
        self.queue_time = QUEUE_TIME.labels(model)
        self.prefill_time = PREFILL_TIME.labels(model)
        self.decode_time = DECODE_TIME.labels(model)


def record_scheduler(series: Series, stats: Any, snapshot: SchedulerSnapshot) -> None:
    snapshot.running = int(stats.num_running_reqs)
    snapshot.waiting = int(stats.num_waiting_reqs)
    snapshot.kv_cache_usage = float(stats.kv_cache_usage)
    series.running.set(snapshot.running)
    series.waiting.set(snapshot.waiting)
    series.kv_cache_usage.set(snapshot.kv_cache_usage)
    prefix = stats.prefix_cache_stats
    if prefix is not None and not prefix.reset:
        series.prefix_queries.inc(prefix.queries)
        series.prefix_hits.inc(prefix.hits)


def record_iteration(series: Series, stats: Any) -> None:
    series.prompt_tokens.inc(stats.prompt_token_stats.total)
    series.cached_prompt_tokens.inc(stats.prompt_token_stats.cached_tokens)
    series.generation_tokens.inc(stats.num_generation_tokens)
    series.preemptions.inc(stats.num_preempted_reqs)
    for value in stats.time_to_first_tokens_iter:
        series.ttft.observe(value)
    for value in stats.inter_token_latencies_iter:
        series.itl.observe(value)
    for done in stats.finished_requests:
        series.e2e.observe(done.e2e_latency)
        series.queue_time.observe(done.queued_time)
        series.prefill_time.observe(done.prefill_time)
        series.decode_time.observe(done.decode_time)
        reason = str(getattr(done.finish_reason, "name", done.finish_reason)).lower()
        REQUEST_SUCCESS.labels(series.model, reason).inc()
