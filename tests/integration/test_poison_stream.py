"""Poison interleaved in 10⁵ good reports, through ``ldp-stream collect`` and Kafka, into a real
``ldp-stream work`` (docs/reliability.md §4, §9).

Three kinds of bad input are mixed at seeded random positions into 1000 good records of 100
reports each:

* bodies the collector must refuse (every undecodable kind of the poison corpus, a uRAP report
  with two non-sensitive bits, an event time a month ahead of the clock): 4xx with a JSON reason,
  nothing written;
* records a hostile producer writes straight into the reports topic (the same kinds, a null
  value, 10 MiB records): dead-lettered by the worker with the decoder's reason;
* records that decode but that a state refuses (a delay of 2·10⁵ minutes, inside what the decoder
  accepts and beyond what the pipeline's custom loss accepts): accepted by the collector or
  written directly, then dead-lettered as ``state_rejected`` after the worker restored the
  partition from its last checkpoint.

Every good report is counted exactly once (the merged state is bit-identical to a clean pass over
the good records alone), every bad record is dead-lettered exactly once with its reason or refused
with it, the worker never exits, and the collector's accepted counter equals what it wrote.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from aggregator.collector.tokens import mint_token
from aggregator.config import PipelineConfig
from aggregator.metrics import metric_totals
from aggregator.worker import PipelineRuntime
from ingest.client.codec import decode, encode
from ingest.device.http_protocol import CONTENT_TYPE
from ingest.local.processes import free_port
from tests.integration import chaos_support as cs
from tests.integration import pipeline_support as ps
from tests.integration.refusing_loss import LIMIT
from tests.integration.test_collector import collect_process
from tests.integration.test_poison import poison_corpus

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]

N_GOOD, PER_RECORD = 1000, 100
EXTRA_QUERIES = """
[[queries]]
kind = "custom"
name = "refusing"
loss = "tests.integration.refusing_loss:refusing_linreg"
fields = ["dep_delay", "arr_delay"]
params = ["intercept", "dep_delay"]
renewable = { warm_up = 200, batch_size = 100 }

[[queries]]
kind = "mean"
name = "arr_daily"
field = "arr_delay"
window = { size = "4d", grace = "6h" }
"""


def _post(url: str, data: bytes, key: str, token: str) -> tuple[int, dict]:
    """POST a batch; a refusal the collector sends before it has read the whole body (413) is
    read after the broken pipe, as an HTTP client that reads early responses does."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        try:
            conn.request("POST", "/v1/reports", body=data, headers={
                "Authorization": f"Bearer {token}", "Content-Type": CONTENT_TYPE,
                "Idempotency-Key": key})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the answer is already on its way
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


@contextmanager
def _collect(config: Path):
    """``ldp-stream collect --config`` (:func:`collect_process`); yields ``(url, token)``."""
    token = mint_token(config.parent / "collector.tokens", "fleet")
    with collect_process(config, ready_timeout_s=60) as (_, url, _):
        yield url, token


def _rebuilt(schema, good: bytes, change) -> bytes:
    """``good`` decoded, changed in place by ``change(batch)``, encoded again."""
    batch = decode(good, {schema.fingerprint: schema})
    change(batch)
    return encode(batch, time_resolution=schema.time_resolution_s)


def _two_non_sensitive_bits(schema):
    field = next(c for c in schema.categorical if c.mechanism == "urap")
    ns = [j for j in range(len(field.categories)) if j not in set(field.sensitive_codes)][:2]
    assert len(ns) == 2, "the flights uRAP field needs two non-sensitive categories"

    def change(batch):
        from mechanisms.uldp import SparseBits

        dense = batch.categorical[field.name].to_dense()
        dense[0, ns] = True
        batch.categorical[field.name] = SparseBits.from_dense(dense)
    return change


def _huge_delay(schema):
    j = list(schema.numeric_names).index("dep_delay")

    def change(batch):
        batch.numeric[0, j] = 2 * LIMIT
    return change


def _month_ahead(schema):
    res = schema.time_resolution_s

    def change(batch):
        batch.event_time[0] = (int(time.time()) + 30 * 86400) // res * res
    return change


def test_poison_in_a_stream_through_collector_and_kafka(request, tmp_path, bootstrap_servers, topic_name):
    from ingest.kafka.clients import producer_client, topic_records
    from ingest.kafka.settings import KafkaSettings

    cfg_path = ps.write_config(tmp_path, bootstrap_servers, topic_name, partitions=cs.PARTITIONS,
                               checkpoint_interval_s=0.3, extra_queries=EXTRA_QUERIES)
    cfg_path.write_text(cfg_path.read_text().replace(
        "[serve]", '[collector]\nport = 0\ntoken_file = "collector.tokens"\nack_timeout_s = 10.0\n\n[serve]'))
    cfg = PipelineConfig.load(cfg_path)
    ps.create_topics(bootstrap_servers, cfg)
    runtime = PipelineRuntime.from_config(cfg)
    schema = cfg.telemetry_schema
    good = cs.make_stream(schema, N_GOOD, PER_RECORD, seed=515)
    rng = np.random.default_rng(616)
    corpus = poison_corpus(good[0], good[1], rng)
    corpus = [(k, v, r) for k, v, r in corpus if k != "other_schema"]  # (decodes: not poison here)
    impossible = _rebuilt(schema, good[2], _two_non_sensitive_bits(schema))
    ahead = _rebuilt(schema, good[3], _month_ahead(schema))
    refused_by_state = [_rebuilt(schema, good[10 + i], _huge_delay(schema)) for i in range(6)]

    # (route, kind, value, expected reason or None = any decode reason)
    actions = [("good", "good", g, None) for g in good]
    for kind, value, reason in corpus:
        actions.append(("direct", kind, value, reason))
        if value is not None:
            actions.append(("refused", kind, value, reason))
    for route in ("direct", "refused"):
        actions.append((route, "impossible_urap", impossible, "impossible_report"))
        actions.append((route, "event_time_ahead", ahead, "event_time_skew"))
    for i, value in enumerate(refused_by_state):
        actions.append(("accepted" if i % 2 else "direct", "refused_by_state", value, "state_rejected"))
    actions = _interleave(actions, rng)

    port = free_port()
    log = tmp_path / "worker.log"
    w = ps.start_worker(cfg_path, "--no-coalesce", "--metrics-port", str(port), log_path=log)
    refusals = Counter()
    try:
        cs.wait_metric(port, "ldp_owned_partitions", cs.PARTITIONS, 120, w)
        prod = producer_client(KafkaSettings(bootstrap_servers=bootstrap_servers), max_request_size=16 << 20)
        try:
            with _collect(cfg_path) as (url, token):
                for i, (route, kind, value, reason) in enumerate(actions):
                    if route == "direct":
                        prod.send(cfg.topics.reports, value=value, partition=i % cs.PARTITIONS,
                                  key=None if value is not None else b"tombstone")
                        continue
                    status, js = _post(url, value, f"k-{i}", token)
                    if route in ("good", "accepted"):
                        n = decode(value, {schema.fingerprint: schema}).n
                        assert status == 202 and js["accepted"] == n, (kind, status, js)
                    else:
                        assert status in (413, 422) and set(js) == {"error", "reason"} and js["reason"], \
                            (kind, status, js)
                        if reason is not None and status == 422:
                            assert js["error"] == reason, (kind, js)
                        refusals[js["error"]] += 1
                    assert w.poll() is None, cs.tail(log)
                prod.flush(60)
                with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                    collector_metrics = r.read().decode()
        finally:
            prod.close(timeout=5)
        in_topic = topic_records(bootstrap_servers, cfg.topics.reports, timeout_s=60)
        counts = Counter(r.partition for r in in_topic)
        cs.wait_until_complete(bootstrap_servers, cfg.topics.state, runtime.name,
                               {p: max(r.offset for r in in_topic if r.partition == p) + 1 for p in counts},
                               300, procs=[w])
        text = ps.scrape(port)
        assert w.poll() is None, cs.tail(log)
        assert ps.kill(w, signal.SIGTERM, timeout=60) == 0, cs.tail(log)
    finally:
        ps.kill(w)

    # what the topic holds: the good records, the accepted refused-by-state ones, the direct ones
    want_kind = {}
    for route, kind, value, reason in actions:
        if route != "refused":
            want_kind.setdefault(value, []).append((route, kind, reason))
    n_direct = sum(1 for a in actions if a[0] == "direct")
    assert len(in_topic) == N_GOOD + n_direct + sum(1 for a in actions if a[0] == "accepted")

    # the collector counts what it wrote
    from tests.aggregator.collector_support import metric

    from_collector = [r for r in in_topic if r.headers]  # the collector's records carry a batch id
    assert metric(collector_metrics, "ldp_collector_reports_accepted_total") == sum(
        decode(r.value, {schema.fingerprint: schema}).n for r in from_collector)

    # every bad record of the topic dead-lettered once, with its reason
    bad = {(r.partition, r.offset): r for r in in_topic
           if r.value is None or any(route != "good" for route, _, _ in want_kind.get(r.value, []))}
    dl = ps.read_dead_letters(bootstrap_servers, cfg.topics.dead_letter, len(bad), timeout=120)
    got = {}
    for rec in dl:
        h = {k: v.decode() for k, v in rec.headers}
        key = (int(h["source_partition"]), int(h["source_offset"]))
        assert key not in got, f"dead-lettered twice: {key}"
        got[key] = h
    assert set(got) == set(bad), ([(k, want_kind.get(bad[k].value)) for k in sorted(set(bad) - set(got))],
                                  sorted(set(got) - set(bad)), cs.tail(log, 3000))
    by_reason = Counter(h["reason"] for h in got.values())
    for key, r in bad.items():
        kinds = want_kind.get(r.value, [("direct", "empty_none", "empty")])
        wanted = {reason for _, _, reason in kinds}
        if None not in wanted:
            assert got[key]["reason"] in wanted, (kinds, got[key])
        if "state_rejected" in wanted:
            assert "beyond the loss's limit" in got[key]["error"], got[key]
    assert by_reason["state_rejected"] == len(refused_by_state)
    assert metric_totals(text).get("ldp_partition_recoveries_total", 0) >= 1

    # every good report counted once: the merged state is a clean pass over the good records
    by_part: dict[int, list[bytes]] = {}
    good_set = set(good)
    for r in sorted(in_topic, key=lambda r: (r.partition, r.offset)):
        if r.value in good_set:
            by_part.setdefault(r.partition, []).append(r.value)
    from aggregator.serve import merge_checkpoints

    cks = ps.read_checkpoints(bootstrap_servers, cfg.topics.state, runtime.name)
    merged, info = merge_checkpoints(cks.values(), runtime)
    assert info["reports"] == N_GOOD * PER_RECORD
    want = ps.reference_pass(runtime, by_part)
    for name, st in want.items():
        if name not in runtime.windowed:
            assert merged[name].to_bytes() == st.to_bytes(), name
    summary = {"good_reports": info["reports"], "refused_by_collector": dict(refusals),
               "dead_lettered": dict(by_reason),
               "recoveries": metric_totals(text).get("ldp_partition_recoveries_total", 0)}
    request.node.user_properties.append(("poison_stream", summary))
    print("POISON_STREAM", summary)


def _interleave(actions: list, rng) -> list:
    """The good records in order with the bad ones at seeded random positions after the first 40
    good records (the first checkpoints then hold a fitted warm-up)."""
    goods = [a for a in actions if a[0] == "good"]
    others = [a for a in actions if a[0] != "good"]
    others = [others[i] for i in rng.permutation(len(others))]
    out = goods[:40]
    rest = goods[40:]
    slots = sorted(rng.integers(0, len(rest) + 1, len(others)))
    j = 0
    for i, a in enumerate([*rest, None]):
        while j < len(others) and slots[j] == i:
            out.append(others[j])
            j += 1
        if a is not None:
            out.append(a)
    return out
