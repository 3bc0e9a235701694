"""Prometheus metrics, named after vLLM's (prefix `ats:` for `vllm:`): requests running and
waiting, prompt and generation token counters, finished requests by reason, and histograms of time
to first token, inter-token latency and end-to-end latency. One registry per server."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=r).labels(
                model_name
            )

        self.running = gauge("ats:num_requests_running", "Requests in a batch slot")
        self.waiting = gauge("ats:num_requests_waiting", "Requests queued for a slot")
        self.prompt_tokens = counter("ats:prompt_tokens", "Prompt tokens prefilled")
        self.generation_tokens = counter("ats:generation_tokens", "Tokens generated")
        self._success = Counter(
            "ats:request_success", "Finished requests", ["model_name", "finished_reason"],
            registry=r,
        )  # fmt: skip
        self._model_name = model_name
        self.ttft = histogram("ats:time_to_first_token_seconds", "Time to first token")
        self.itl = histogram("ats:inter_token_latency_seconds", "Time between tokens")
        self.e2e = histogram("ats:e2e_request_latency_seconds", "Request latency")

    def finished(self, reason: str) -> None:
        self._success.labels(self._model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
