"""The Prometheus metrics of one server (`GET /metrics`), in a registry of its own: requests by route and status,
errors by kind, latency, time queued and in the model, batch sizes in documents and sub-words, queue depth."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)


class ServerMetrics:
    """The counters, gauges and histograms the app and its batcher update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("biodistil_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=r)
        self.accepted = Counter("biodistil_predict_accepted", "prediction requests read by the server", registry=r)
        self.in_flight = Gauge("biodistil_requests_in_flight", "requests being answered", registry=r)
        self.errors = Counter("biodistil_request_errors", "requests answered with an error, by kind", ["kind"],
                              registry=r)
        self.latency = Histogram("biodistil_request_seconds", "time from a prediction request's arrival to its answer",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queued = Histogram("biodistil_queue_seconds", "time a prediction request waited for its batch",
                                buckets=LATENCY_BUCKETS, registry=r)
        self.inference = Histogram("biodistil_inference_seconds", "time of one model call (a batch)",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.batch_documents = Histogram("biodistil_batch_documents", "documents per model call",
                                         buckets=BATCH_BUCKETS, registry=r)
        self.batch_tokens = Histogram("biodistil_batch_tokens", "sub-words per model call", buckets=TOKEN_BUCKETS,
                                      registry=r)
        self.documents = Counter("biodistil_documents", "documents predicted", registry=r)
        self.queue_depth = Gauge("biodistil_queue_depth", "prediction requests waiting for a batch", registry=r)
        self.ready = Gauge("biodistil_ready", "1 once the model is loaded and warmed up", registry=r)

    def on_batch(self, documents: int, tokens: int, seconds: float) -> None:
        """A model call ran: its size and time."""
        self.batch_documents.observe(documents)
        self.batch_tokens.observe(tokens)
        self.inference.observe(seconds)
        self.documents.inc(documents)

    def predict_counts(self) -> tuple[int, int]:
        """(prediction requests accepted, answered — with records or an error)."""
        answered = sum(sample.value for metric in self.requests.collect() for sample in metric.samples
                       if sample.name.endswith("_total") and sample.labels.get("route") == "/v1/predict")
        return int(self.registry.get_sample_value("biodistil_predict_accepted_total") or 0), int(answered)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
