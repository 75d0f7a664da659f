"""What `/metrics` reports, in the Prometheus text format (prometheus_client).

Each server has its own registry (not the library's global one), so two apps in one process,
as in the tests, count separately. Besides vitlab's own series, the registry carries
prometheus_client's process collector: `process_resident_memory_bytes` is what the load
test reads to look for a leak.
"""

from __future__ import annotations

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
ENDPOINTS = ("/", "/predict", "/health", "/info", "/metrics", "/docs", "/openapi.json", "/static")


def endpoint_label(path: str) -> str:
    """A fixed set of label values, whatever paths clients try (unbounded labels leak memory)."""
    if path.startswith("/static/"):
        return "/static"
    if path.startswith("/static-offline-docs/"):  # the bundled Swagger UI of /docs
        return "/docs"
    return path if path in ENDPOINTS else "other"


class Metrics:
    def __init__(self, model: str, precision: str):
        # prometheus_client is the serve extra's; imported here so vitlab imports without it.
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        r = self.registry
        self.requests = Counter("vitlab_requests", "HTTP requests answered, by endpoint and status code", ["endpoint", "status"],
                                registry=r)
        self.errors = Counter("vitlab_request_errors", "requests answered with a 4xx or 5xx status, by endpoint and status code",
                              ["endpoint", "status"], registry=r)
        self.latency = Histogram("vitlab_request_latency_seconds", "time from request to the response's start, by endpoint",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("vitlab_batch_size", "images per forward pass, by kind (classify or attention)", ["kind"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.forward = Histogram("vitlab_forward_seconds", "time of one batched forward pass, by kind", ["kind"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.images = Counter("vitlab_images", "images classified", registry=r)
        self.in_flight = Gauge("vitlab_requests_in_flight", "requests received and not yet answered", registry=r)
        info = Gauge("vitlab_model_info", "the model being served (always 1)", ["model", "precision"], registry=r)
        info.labels(model=model, precision=precision).set(1)

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        endpoint = endpoint_label(path)
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        if status >= 400:
            self.errors.labels(endpoint=endpoint, status=str(status)).inc()
        self.latency.labels(endpoint=endpoint).observe(seconds)

    def observe_batch(self, kind: str, size: int, seconds: float) -> None:
        self.batch_size.labels(kind=kind).observe(size)
        self.forward.labels(kind=kind).observe(seconds)
        self.images.inc(size)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
