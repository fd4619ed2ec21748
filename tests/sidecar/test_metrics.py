"""The inter-token latency histogram is exposed exactly as prometheus-client's Histogram would
expose the same observations (names, ``le`` labels, cumulative counts, sum)."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sidecar.metrics import ITL_BUCKETS, SidecarMetrics

NAME = "sidecar_inter_token_latency_seconds"


def _lines(registry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if NAME in line]


def test_token_histogram_exposes_what_a_prometheus_histogram_would():
    metrics = SidecarMetrics()
    reference = CollectorRegistry()
    histogram = Histogram(NAME, metrics.itl.documentation, buckets=ITL_BUCKETS, registry=reference)
    # (interval, tokens): on a bucket bound, between bounds, past the last, several tokens at once
    for interval, n in [(0.01, 1), (0.0125, 1), (0.04, 1), (9.0, 1), (0.3, 3), (0.001, 1)]:
        metrics.observe_tokens(interval, n)
        for _ in range(n):
            histogram.observe(interval / n)
    assert _lines(metrics.registry) == _lines(reference)
    assert any(f'{NAME}_count 8.0' == line for line in _lines(metrics.registry))
