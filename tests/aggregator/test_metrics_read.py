"""Reading a Prometheus endpoint back: ``aggregator.metrics.read_metrics`` and its parsers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from aggregator.metrics import metric_totals, metric_value, read_metrics, start_metrics_server


def test_read_an_endpoint_back():
    reg = CollectorRegistry()
    c = Counter("ldp_demo_things", "things", ["reason"], registry=reg)
    c.labels(reason="a").inc(2)
    c.labels(reason="b").inc(3)
    server, thread = start_metrics_server(reg, 0)
    try:
        text = read_metrics(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5)
    finally:
        server.shutdown()
        thread.join(5)
    assert metric_value(text, "ldp_demo_things_total", 'reason="a"') == 2
    assert metric_value(text, "ldp_demo_things_total", 'reason="b"') == 3
    assert metric_value(text, "ldp_demo_things_total", 'reason="c"') == 0.0
    assert metric_totals(text)["ldp_demo_things_total"] == 5
