"""Helpers of the chaos / poison integration tests (not a test module).

A stream of ``N_RECORDS × PER_RECORD`` privatized synthetic flights (10⁵ reports) is produced to
explicit partitions (record i → partition i % 4), so the per-partition logs are known exactly
from the producer's acknowledgements; the "clean single pass" is
``pipeline_support.reference_pass`` over those logs (record-by-record updates, partitions merged
in ascending order — the arithmetic of ``ldp-stream work --no-coalesce`` + serve).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import numpy as np

from tests.integration import pipeline_support as ps

N_RECORDS, PER_RECORD, PARTITIONS = 1000, 100, 4

#: The windowed queries of the chaos pipelines (docs/windows.md): tumbling and hopping windows of a
#: closed-form state, and 4-day logistic regressions whose panes (≈ 2500 reports per partition)
#: pass their warm-up and renew.
WINDOWED_QUERIES = """
[[queries]]
kind = "mean"
name = "arr_delay_daily"
field = "arr_delay"
window = { size = "1d", grace = "6h" }

[[queries]]
kind = "frequency"
name = "carrier_weekly"
field = "carrier"
window = { size = "7d", hop = "1d", grace = "6h" }

[[queries]]
kind = "logistic_regression"
name = "late_daily"
covariates = ["hour"]
label = "arr_delay"
threshold = 15.0
window = { size = "4d", grace = "6h" }
renewable = { warm_up = 1000, batch_size = 200 }
"""


def make_stream(schema, n_records: int = N_RECORDS, per_record: int = PER_RECORD,
                seed: int = 20240901) -> list[bytes]:
    """``n_records`` encoded records of ``per_record`` reports, privatized in one vectorised pass."""
    from ingest.client.codec import encode
    from ingest.client.privatizer import Privatizer
    from ingest.kafka.producer import slice_batch

    rng = np.random.default_rng(seed)
    m = n_records * per_record
    cols = {"arr_delay": rng.normal(5, 40, m), "dep_delay": rng.normal(10, 35, m),
            "distance": rng.uniform(100, 2500, m), "air_time": rng.uniform(30, 400, m),
            "hour": rng.integers(5, 23, m).astype(float)}
    for c in schema.categorical:
        values = np.asarray(list(c.categories), dtype=object)
        cols[c.name] = values[rng.integers(0, len(values), m)]
    cols = ps.with_event_times(schema, cols, rng, days=40.0)  # windows close while it streams
    batch = Privatizer(schema, rng=rng).privatize_batch(cols)
    assert batch.n == m
    return [encode(slice_batch(batch, i * per_record, (i + 1) * per_record),
                   time_resolution=schema.time_resolution_s) for i in range(n_records)]


class Producer(threading.Thread):
    """Background producer: ``records`` to explicit partitions with a pause between sends.

    ``where`` (after :meth:`join`) holds the acknowledged (partition, offset) of every record.
    """

    def __init__(self, bootstrap: str, topic: str, records: list[bytes], delay_s: float,
                 partitions: int = PARTITIONS, **producer_kw) -> None:
        super().__init__(daemon=True, name="chaos-producer")
        self.bootstrap, self.topic, self.records = bootstrap, topic, records
        self.delay_s, self.partitions, self.producer_kw = delay_s, partitions, producer_kw
        self.where: list[tuple[int, int]] | None = None
        self.error: BaseException | None = None
        self.started_at = self.finished_at = 0.0

    def run(self) -> None:
        from ingest.kafka.clients import producer_client
        from ingest.kafka.settings import KafkaSettings

        self.started_at = time.monotonic()
        kw = {"acks": "all", "max_request_size": 8 << 20, **self.producer_kw}
        prod = producer_client(KafkaSettings(bootstrap_servers=self.bootstrap), **kw)
        try:
            futs = []
            for i, rec in enumerate(self.records):
                futs.append(prod.send(self.topic, value=rec, partition=i % self.partitions))
                if self.delay_s:
                    time.sleep(self.delay_s)
            prod.flush(120)
            self.where = [(f.get(60).partition, f.get(60).offset) for f in futs]
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            with contextlib.suppress(Exception):
                prod.close(timeout=5)
            self.finished_at = time.monotonic()

    def result(self, timeout: float = 180) -> list[tuple[int, int]]:
        self.join(timeout)
        assert not self.is_alive(), "producer did not finish"
        if self.error is not None:
            raise AssertionError(f"producer failed: {self.error!r}") from self.error
        assert self.where is not None
        return self.where


def logs_by_partition(records: list[bytes], where: list[tuple[int, int]]) -> dict[int, list[bytes]]:
    """Per-partition log contents in offset order; asserts the log holds every record exactly once
    (offsets of each partition are exactly 0 … n_p − 1: no producer duplicate, no hole)."""
    by_part: dict[int, list[tuple[int, bytes]]] = {}
    for rec, (p, off) in zip(records, where, strict=True):
        by_part.setdefault(p, []).append((off, rec))
    out = {}
    for p, items in by_part.items():
        items.sort(key=lambda t: t[0])
        assert [o for o, _ in items] == list(range(len(items))), f"partition {p}: offsets not dense"
        out[p] = [r for _, r in items]
    return out


def wait_until_complete(bootstrap: str, state_topic: str, pipeline: str, expected: dict[int, int],
                        timeout: float, procs=()) -> dict:
    """Poll the state topic until every partition's checkpoint has ``next_offset == expected[p]``.

    Returns the checkpoints. Fails if a process in ``procs`` exits meanwhile.
    """
    deadline = time.monotonic() + timeout
    cks: dict = {}
    while time.monotonic() < deadline:
        for pr in procs:
            assert pr.poll() is None, f"worker exited early with {pr.returncode}"
        cks = ps.read_checkpoints(bootstrap, state_topic, pipeline)
        got = {c.partition: c.next_offset for c in cks.values()}
        if got == expected:
            return cks
        time.sleep(0.5)
    got = {c.partition: c.next_offset for c in cks.values()}
    raise AssertionError(f"checkpoints did not reach {expected} within {timeout}s (got {got})")


def assert_exact(bootstrap: str, cfg, runtime, by_part: dict[int, list[bytes]], per_record: int) -> dict:
    """Final checkpoints == clean single pass: report counts equal, states bit-identical.

    Returns a summary dict (reports counted, reports expected, per-partition next offsets).
    """
    from aggregator.serve import merge_checkpoints

    cks = ps.read_checkpoints(bootstrap, cfg.topics.state, runtime.name)
    assert sorted(c.partition for c in cks.values()) == sorted(by_part)
    for c in cks.values():
        n_p = len(by_part[c.partition])
        assert c.next_offset == n_p, (c.partition, c.next_offset, n_p)
        assert c.reports == per_record * n_p, (c.partition, c.reports, per_record * n_p)
        assert c.records == n_p, (c.partition, c.records, n_p)
    merged, info = merge_checkpoints(cks.values(), runtime)
    expected = per_record * sum(len(v) for v in by_part.values())
    assert info["reports"] == expected
    want = ps.reference_pass(runtime, by_part)
    assert set(merged) == set(want)
    for name, st in want.items():
        if name in runtime.windowed:
            continue  # closed panes left the checkpoints for their own records: below
        assert merged[name].n == st.n, name
        assert merged[name].to_bytes() == st.to_bytes(), f"{name}: state differs from the single pass"
    windows = assert_windows_exact(bootstrap, cfg, runtime, by_part) if runtime.windowed else {}
    return {"reports": info["reports"], "expected": expected, **windows,
            "next_offsets": {c.partition: c.next_offset for c in cks.values()}}


def assert_windows_exact(bootstrap: str, cfg, runtime, by_part: dict[int, list[bytes]]) -> dict:
    """Every pane of every windowed query and partition — held by its checkpoint or published
    under its own key — is bit-identical to the single pass's, with equal late counts and
    watermarks; so is every window's estimate, assembled as serve does. Returns counts."""
    from aggregator.windows import merge_panes, window_rows

    cks, records = ps.read_state(bootstrap, cfg.topics.state, runtime.name)
    ref = ps.reference_states(runtime, by_part)
    panes_total = late_total = published = 0
    for name in runtime.windowed:
        held, pub, ref_held = {}, {}, {}
        for p, ck in cks.items():
            got = runtime.restore_state(name, ck.states[name])
            want = ref[p][name]
            assert (got.late, got.max_event_time) == (want.late, want.max_event_time), (name, p)
            mine = got.pane_states()
            for (rp, q, start), blob in records.items():
                if rp == p and q == name and start not in mine:
                    mine[start] = got.new_pane().from_bytes(blob, got.query, got.schema)
                    published += 1
            theirs = want.pane_states()
            assert sorted(mine) == sorted(theirs), (name, p)
            for start, st in theirs.items():
                assert mine[start].to_bytes() == st.to_bytes(), f"{name}: pane {start} of partition {p}"
            held[p], ref_held[p] = mine, theirs
            panes_total += len(mine)
            late_total += got.late
        template = runtime.new_states()[name]
        rows = window_rows(template, merge_panes(held, pub), None)
        want_rows = window_rows(template, merge_panes(ref_held, {}), None)
        assert rows == want_rows, f"{name}: window estimates differ from the single pass"
    return {"panes": panes_total, "pane_records": published, "late": late_total}


def wait_metric(port: int, name: str, at_least: float, timeout: float, proc) -> float:
    """Scrape ``name`` from a worker's metrics endpoint until it is ≥ ``at_least``; returns it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"worker exited early with {proc.returncode}"
        with contextlib.suppress(OSError):
            v = ps.metric_value(ps.scrape(port), name)
            if v >= at_least:
                return v
        time.sleep(0.02)
    raise AssertionError(f"{name} did not reach {at_least} in {timeout}s")


def tail(path: Path, n: int = 4000) -> str:
    """Last ``n`` characters of a log file (for assertion messages)."""
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""
