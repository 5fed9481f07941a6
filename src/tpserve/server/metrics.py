"""Prometheus metrics of one server (its own registry: no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)

BOOT_GAUGES = {"boot_seconds": "Seconds from the engine's start to ready",
               "boot_load_seconds": "Of which loading (weights, cache, graphs)",
               "boot_warmup_seconds": "Of which the warm-up (every kernel shape compiled)",
               "kernels_after_ready": "Triton kernel specializations first met after ready (compiled or loaded)"}


class ServerMetrics:
    def __init__(self, stats_fn, *, skip_to_now: bool = False):
        """skip_to_now: the engine's running totals so far count nowhere (the warm-up's requests)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self._stats_fn = stats_fn
        self.running = Gauge("tpserve:num_requests_running", "Sequences running in the engine", registry=r)
        self.waiting = Gauge("tpserve:num_requests_waiting", "Sequences waiting to be scheduled", registry=r)
        self.cache_usage = Gauge("tpserve:kv_cache_usage_perc", "Fraction of cache blocks in use (0-1)",
                                 registry=r)
        self.slot_usage = Gauge("tpserve:kda_slot_usage_perc", "Fraction of KDA state slots in use (0-1)",
                                registry=r)
        self.preemptions = Gauge("tpserve:num_preemptions", "Sequences preempted so far", registry=r)
        self.ttft = Histogram("tpserve:time_to_first_token_seconds", "Time to first token", registry=r,
                              buckets=LATENCY_BUCKETS)
        self.itl = Histogram("tpserve:inter_token_latency_seconds", "Time between output tokens", registry=r,
                             buckets=LATENCY_BUCKETS)
        self.e2e = Histogram("tpserve:e2e_request_latency_seconds", "Request latency", registry=r,
                             buckets=LATENCY_BUCKETS)
        self.prompt_tokens = Counter("tpserve:prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("tpserve:generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter("tpserve:request_success", "Finished requests", ["finished_reason"], registry=r)
        # speculative decoding (vLLM's names), fed from the engine's running totals
        self.spec = {key: Counter(f"tpserve:{key}", text, registry=r) for key, text in (
            ("spec_decode_num_drafts", "Verify runs (a sequence-step with drafts)"),
            ("spec_decode_num_draft_tokens", "Drafted tokens verified"),
            ("spec_decode_num_accepted_tokens", "Drafted tokens accepted"))}
        # prefix caching (vLLM's names): prompt tokens looked up and found, the state checkpoints' size
        self.prefix = {key: Counter(f"tpserve:{key}", text, registry=r) for key, text in (
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache"),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache"))}
        self.prefix_gauges = {key: Gauge(f"tpserve:{key}", text, registry=r) for key, text in (
            ("prefix_state_checkpoints", "KDA state checkpoint slots of the prefix cache"),
            ("prefix_state_checkpoints_used", "KDA state checkpoint slots in use"),
            ("prefix_state_checkpoint_bytes", "Bytes of one KDA state checkpoint per rank"),
            ("prefix_state_memory_share", "The checkpoints' share of the cache memory (0-1)"))}
        self.spec_per_pos = Counter("tpserve:spec_decode_num_accepted_tokens_per_pos",
                                    "Drafted tokens accepted, by draft position", ["position"], registry=r)
        self._spec_seen: dict[str, float] = {}
        self.boot: dict[str, Gauge] = {}  # made once the engine reports them (engine/warmup.py)
        if skip_to_now:
            self._spec_seen = dict(self._totals(stats_fn()))

    def render(self) -> bytes:
        s = self._stats_fn()
        self.running.set(s["running"])
        self.waiting.set(s["waiting"])
        self.cache_usage.set(1 - s["blocks_free"] / max(s["blocks_total"], 1))
        self.slot_usage.set(1 - s["slots_free"] / max(s["slots_total"], 1))
        self.preemptions.set(s["preemptions"])
        for key, text in BOOT_GAUGES.items():
            if key in s:
                if key not in self.boot:
                    self.boot[key] = Gauge(f"tpserve:{key}", text, registry=self.registry)
                self.boot[key].set(s[key])
        for key, gauge in self.prefix_gauges.items():
            gauge.set(s.get(key, 0))
        for key, total in self._totals(s):
            counter = self.spec.get(key) or self.prefix.get(key) or self.spec_per_pos.labels(position=key[3:])
            self._advance(key, total, counter)
        return generate_latest(self.registry)

    def _totals(self, s: dict):
        """(key, the engine's running total) of each counter fed from the engine."""
        for key in (*self.spec, *self.prefix):
            yield key, s.get(key, 0)
        for pos, value in enumerate(s.get("spec_decode_num_accepted_tokens_per_pos", [])):
            yield f"pos{pos}", value

    def _advance(self, key: str, total: float, counter) -> None:
        """Counters only go up: add what the engine's total gained since the last scrape."""
        gained = total - self._spec_seen.get(key, 0)
        if gained > 0:
            counter.inc(gained)
            self._spec_seen[key] = total


class RequestTimer:
    """Feeds TTFT / inter-token latency / token counters from one request's outputs."""

    def __init__(self, metrics: ServerMetrics, arrival: float, prompt_tokens: int):
        self.metrics, self.arrival, self.last = metrics, arrival, None
        self.tokens = 0
        metrics.prompt_tokens.inc(prompt_tokens)

    def tokens_seen(self, total: int, now: float) -> None:
        new = total - self.tokens
        if new <= 0:
            return
        if self.last is None:
            self.metrics.ttft.observe(now - self.arrival)
        else:
            gap = (now - self.last) / new
            for _ in range(new):
                self.metrics.itl.observe(gap)
        self.metrics.generation_tokens.inc(new)
        self.tokens, self.last = total, now

    def done(self, reasons: list[str | None], now: float) -> None:
        self.metrics.e2e.observe(now - self.arrival)
        for reason in reasons:
            self.metrics.requests.labels(finished_reason=reason or "unknown").inc()
