"""The server's metrics in Prometheus' text format (0.0.4) at TensorFlow Serving's path,
`GET /monitoring/prometheus/metrics` (docs/design.md section 16), from a registry of the server's
own (prometheus_client), rendered by generate_latest:

    hetu_serve_requests_total{api, code}          the HTTP requests answered, by API (predict,
                                                  metadata, status, stats, classify, regress, other)
                                                  and status code
    hetu_serve_request_latency_seconds{api}       a histogram of their time in the server
    hetu_serve_batch_size                         a histogram of the instances of each model run
    hetu_serve_instances_total                    the instances run
    hetu_serve_failed_batches_total               model runs failed by other than a bad instance
    hetu_serve_model_version{model}               the version served (none before the first)
    hetu_serve_swaps_total                        the versions swapped in
    hetu_serve_unknown_ids_total{column, where}   ids the model never saw: a value outside an
                                                  indexed field's vocabulary (where="vocabulary") or a
                                                  key not resident in a dynamic table (where=its name)

The requests are counted as they are answered; the rest is read from the Batcher and the
ServedBundle when scraped, so the batching path itself does no more than count."""
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

PATH = "/monitoring/prometheus/metrics"
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The registry of one server: observe(api, code, seconds) per request answered; text() the
    exposition."""
    content_type = "text/plain; version=0.0.4; charset=utf-8"   # what generate_latest writes (names in [a-z_])

    def __init__(self, served, batcher):
        self.registry = CollectorRegistry()
        self.requests = Counter("hetu_serve_requests", "HTTP requests answered, by API and status code",
                                ["api", "code"], registry=self.registry)
        self.latency = Histogram("hetu_serve_request_latency_seconds", "Time from a request's arrival to its "
                                 "answer, by API", ["api"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.registry.register(_Serving(served, batcher))

    def observe(self, api, code, seconds):
        self.requests.labels(api, str(code)).inc()
        self.latency.labels(api).observe(seconds)

    def text(self):
        return generate_latest(self.registry)

    def middleware(self):
        """An aiohttp middleware (the outermost) that observes each request a handler marked with
        request["api"]."""
        from aiohttp import web

        @web.middleware
        async def observe(request, handler):
            start, code = time.perf_counter(), 500
            try:
                response = await handler(request)
                code = response.status
                return response
            except web.HTTPException as e:
                code = e.status
                raise
            finally:
                if "api" in request:
                    self.observe(request["api"], code, time.perf_counter() - start)
        return observe


class _Serving:
    """A collector of what the Batcher and the ServedBundle count, read when scraped."""

    def __init__(self, served, batcher):
        self.served, self.batcher = served, batcher

    def collect(self):
        stats = self.batcher.stats
        yield CounterMetricFamily("hetu_serve_instances", "Instances run by the model", value=stats["instances"])
        yield CounterMetricFamily("hetu_serve_failed_batches", "Model runs failed by other than a bad instance",
                                  value=stats["failed_batches"])
        yield CounterMetricFamily("hetu_serve_swaps", "Versions swapped in", value=self.served.swaps)
        version = GaugeMetricFamily("hetu_serve_model_version", "The version served", labels=["model"])
        bundle = self.served.bundle
        if bundle is not None:
            version.add_metric([bundle.name], bundle.version)
        yield version
        yield _histogram("hetu_serve_batch_size", "Instances of each model run", self.batcher.batch_sizes,
                         _powers_of_two(self.batcher.max_batch))
        unknown = CounterMetricFamily("hetu_serve_unknown_ids", "Ids the model never saw, by raw column and "
                                      "where: vocabulary (an indexed value outside it, read as its field's "
                                      "bucket 0) or a dynamic table (a key not resident, read as zeros)",
                                      labels=["column", "where"])
        for (column, where), count in sorted(self.batcher.unknown.items()):
            unknown.add_metric([column, where], count)
        yield unknown


def _powers_of_two(top):
    bounds, b = [], 1
    while b < top:
        bounds.append(b)
        b *= 2
    return bounds + [top]


def _histogram(name, doc, counts, bounds):
    """A histogram of the observations `counts` ({value: how many}) in buckets `bounds`."""
    buckets, total, values = [], 0, sorted(counts.items())
    at = 0
    for bound in bounds:
        while at < len(values) and values[at][0] <= bound:
            total += values[at][1]
            at += 1
        buckets.append((str(float(bound)), total))
    count = sum(counts.values())
    buckets.append(("+Inf", count))
    return HistogramMetricFamily(name, doc, buckets=buckets,
                                 sum_value=float(sum(v * n for v, n in values)))
