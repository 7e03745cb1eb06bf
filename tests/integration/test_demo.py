"""End-to-end: ``ldp-stream demo --limit 20000`` against the embedded broker."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from ingest.local.processes import port_is_free

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [sys.executable, "-m", "aggregator.cli", "demo", "--limit", "20000", "--no-live",
         "--output", str(out)],
        capture_output=True, text=True, timeout=420,
    )
    return out, proc


def test_demo_exits_zero_and_writes_outputs(demo_run):
    out, proc = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("report.json", "report.md", "estimates_over_reports.png", "frequencies.png",
                 "tradeoff.png", "flight_clusters.png", "pipeline.toml", "history.json"):
        assert (out / name).is_file(), name
        assert (out / name).stat().st_size > 0, name


def test_progress_lines_never_show_more_processed_than_produced(demo_run):
    import re

    _, proc = demo_run
    lines = re.findall(r"produced ([\d,]+) · processed ([\d,]+)/", proc.stdout + proc.stderr)
    assert lines, "no progress line"
    for produced, processed in lines:
        assert int(produced.replace(",", "")) >= int(processed.replace(",", "")), (produced, processed)


def test_report_has_every_query_with_ci_truth_and_n(demo_run):
    out, _ = demo_run
    report = json.loads((out / "report.json").read_text())
    cfg = tomllib.loads((out / "pipeline.toml").read_text())
    queries = {q["name"]: q["kind"] for q in cfg["queries"] if "window" not in q}
    windowed = {q["name"] for q in cfg["queries"] if "window" in q}
    estimated = {r["query"] for r in report["estimates"]}
    pending = {r["query"] for r in report["not_estimated"]}
    assert estimated | pending == set(queries) and not estimated & pending
    # the windowed queries: every window final, judged against its own truth, every report in
    # exactly one daily window (none late: the flights are sent in event-time order)
    assert set(report["windows"]) == windowed == {"arr_delay_mean_daily", "carrier_weekly"}
    for name in windowed:
        rows, summ = report["windows"][name], report["windows_summary"][name]
        # final: every window that ends by the last day (hopping windows reaching past it stay open)
        last_end = max(r["end"] for r in report["windows"]["arr_delay_mean_daily"])
        ended = [r for r in rows if r["end"] <= last_end]
        assert ended and all(r["final"] for r in ended) and summ["final"] == len(ended)
        assert not any(r["final"] for r in rows if r["end"] > last_end)
        assert summ["all_reports_accounted"] is True and summ["late"] == 0
        assert all(r["truth"] is not None for r in rows)
    daily = report["windows"]["arr_delay_mean_daily"]
    assert sum(r["n"] for r in daily) == report["run"]["reports_processed"]
    assert [r["start"] for r in daily] == sorted(r["start"] for r in daily)
    # at 20k reports over 4 partitions every partition of the renewable regressions and k-means is
    # still in its warm-up (the estimate is the batch fit of the pooled buffers, which may not exist
    # yet); every closed-form / count query must have an estimate
    renewable = ("logistic_regression", "quantile_regression", "kmeans")
    assert all(queries[q] in renewable for q in pending), pending
    assert all(r["reason"] for r in report["not_estimated"])
    sent = report["run"]["reports_sent"]
    assert report["run"]["flights_read"] == 20000
    assert 19000 < sent <= 20000  # cancelled flights (no arr_delay) are skipped
    assert report["run"]["reports_processed"] == sent
    assert report["run"]["dead_lettered"] == 0
    for r in report["estimates"]:
        assert r["n"] == sent, r
        assert r["truth"] is not None, r
        if r["ci_low"] is None or r["ci_high"] is None:  # only an unidentified component, named in notes
            j = r["param"].split(".")[0]
            assert r["kind"] == "kmeans", r
            assert any(n.startswith(f"component {j}: ") for n in report["notes"][r["query"]]), r
            continue
        assert r["ci_low"] <= r["estimate"] <= r["ci_high"], r
    assert report["privacy"], "privacy summary missing"
    with_ci = [r for r in report["estimates"] if r["ci_low"] is not None and r["ci_high"] is not None]
    assert report["summary"]["with_truth"] == len(with_ci)
    if "flight_clusters" in estimated:  # one row per component, its truth the raw data's centre
        comps = report["centres"]["flight_clusters"]
        assert [c["component"] for c in comps] == [0, 1, 2]
        assert all(set(c["truth"]) == {"distance", "air_time"} for c in comps)


def test_moment_and_quantile_estimates_near_truth(demo_run):
    """Mean, variance and DR quantiles are within 5 standard errors of the non-private truth."""
    out, _ = demo_run
    report = json.loads((out / "report.json").read_text())
    rows = [r for r in report["estimates"] if r["kind"] in ("mean", "variance", "quantiles")]
    assert len(rows) >= 4
    for r in rows:
        assert abs(r["estimate"] - r["truth"]) < 5 * r["stderr"], r


def test_every_started_process_is_gone(demo_run):
    out, _ = demo_run
    cfg = tomllib.loads((out / "pipeline.toml").read_text())
    port = int(cfg["kafka"]["bootstrap_servers"].rsplit(":", 1)[1])
    assert port_is_free("127.0.0.1", port), "the embedded broker still listens"
    assert port_is_free("127.0.0.1", int(cfg["serve"]["port"])), "serve still listens"
    left = subprocess.run(["pgrep", "-f", str(out / "pipeline.toml")], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"stray processes: {left.stdout}"


def test_ctrl_c_stops_everything_and_writes_partial_report(tmp_path):
    """SIGINT mid-stream: exit 130, a partial report.json, and no process left behind."""
    import signal
    import time

    out = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggregator.cli", "demo", "--limit", "20000", "--rate", "1000",
         "--no-live", "--output", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 180
        history = out / "history.json"
        # wait until the workers report and serve has merged something, then interrupt
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            if line.startswith("produced ") and not line.startswith("produced 0 "):
                break
        assert proc.poll() is None, "demo ended before it could be interrupted"
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    report = json.loads((out / "report.json").read_text())
    assert report["partial"] is True
    assert 0 < report["run"]["reports_processed"] < 20000
    assert history.is_file()
    cfg = tomllib.loads((out / "pipeline.toml").read_text())
    port = int(cfg["kafka"]["bootstrap_servers"].rsplit(":", 1)[1])
    assert port_is_free("127.0.0.1", port), "the embedded broker still listens"
    left = subprocess.run(["pgrep", "-f", str(out / "pipeline.toml")], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"stray processes: {left.stdout}"
