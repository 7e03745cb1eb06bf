"""The checkpoint fixture written by an earlier version of the code (tests/reference/README.md):
format version 1, whose regression queries hold averaged-SGD states.

* today's code refuses it (``CheckpointError`` naming the retired version's reason), and a worker
  that finds it in the state topic rebuilds the partition from offset 0;
* the states of the other queries are unchanged: folding the committed records gives
  byte-identical blobs, and the committed blobs restore to the same estimates. The blobs are read
  out of ``checkpoint.bin`` by the layout of ``aggregator.checkpoint`` (magic, version, header
  length, JSON header, blobs), bypassing the version check; the regression queries' entries are
  left out of the comparison (their states are renewable fits now).

The fixture's ``pipeline.toml`` still has the removed ``sgd`` tables: it is loaded from a copy
without them.
"""

from __future__ import annotations

import json
import math
import re
import struct
import types

import pytest

from tests.reference.make_checkpoint_fixture import HERE, N_RECORDS, PER_RECORD, fold

#: the queries whose states are renewable fits now (averaged SGD in the fixture)
REGRESSIONS = ("late_arrival_logit", "arr_on_dep_median", "arr_on_dep_huber")


def _records() -> list[bytes]:
    data = (HERE / "records.bin").read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


def read_layout(blob: bytes) -> tuple[int, dict, dict[str, bytes]]:
    """(version, header, blobs by query) of a checkpoint, parsed by the wire layout of
    ``aggregator.checkpoint`` without its version check."""
    magic, version, hlen = struct.unpack_from(">4sHI", blob, 0)
    assert magic == b"LDPC"
    header = json.loads(blob[10:10 + hlen])
    pos, states = 10 + hlen, {}
    for name, n in header["queries"]:
        states[name] = blob[pos:pos + n]
        pos += n
    assert pos == len(blob)
    return version, header, states


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The fixture's pipeline, loaded from a copy without its ``sgd = {...}`` lines (the schema
    path made absolute)."""
    from aggregator.config import PipelineConfig
    from aggregator.worker import PipelineRuntime

    text = (HERE / "pipeline.toml").read_text()
    cleaned, k = re.subn(r"(?m)^sgd = \{[^}\n]*\}\n", "", text)
    assert k == len(REGRESSIONS) and "sgd" not in cleaned
    cleaned = cleaned.replace('schema = "schema.toml"', f'schema = "{HERE / "schema.toml"}"')
    path = tmp_path_factory.mktemp("fixture") / "pipeline.toml"
    path.write_text(cleaned)
    return PipelineRuntime.from_config(PipelineConfig.load(path))


@pytest.fixture(scope="module")
def committed():
    return read_layout((HERE / "checkpoint.bin").read_bytes())


def test_the_version_1_checkpoint_is_refused_naming_the_reason(committed):
    from aggregator.checkpoint import CHECKPOINT_VERSION, RETIRED_VERSIONS, Checkpoint, CheckpointError

    version, header, _ = committed
    assert version == 1 and CHECKPOINT_VERSION == 2 and 1 in RETIRED_VERSIONS
    assert "averaged-SGD" in RETIRED_VERSIONS[1]
    with pytest.raises(CheckpointError) as info:
        Checkpoint.from_bytes((HERE / "checkpoint.bin").read_bytes())
    assert str(info.value) == (f"checkpoint format version 1 is no longer read: {RETIRED_VERSIONS[1]} "
                               f"(this version writes {CHECKPOINT_VERSION})")
    # the header itself is intact: what the worker would have resumed from
    assert header["next_offset"] == N_RECORDS and header["reports"] == N_RECORDS * PER_RECORD


def test_the_other_queries_fold_into_the_committed_states(runtime, committed):
    """Decoding the committed records and folding them record by record gives byte-identical
    state blobs for every non-regression query: the wire format, the doubling draws and those
    states' serialization are unchanged."""
    from aggregator.state import RenewableState

    _, header, blobs = committed
    records = _records()
    assert len(records) == N_RECORDS
    states = fold(runtime, records)
    assert header["fingerprint"] == bytes(runtime.fingerprint).hex()
    assert sorted(blobs) == sorted(states)
    compared = [name for name in states if name not in REGRESSIONS]
    assert len(compared) == 6
    for name in compared:
        assert states[name].to_bytes() == blobs[name], name
    for name in REGRESSIONS:
        assert isinstance(states[name], RenewableState) and states[name].n == N_RECORDS * PER_RECORD
        assert states[name].to_bytes() != blobs[name]


def test_the_other_committed_states_restore_to_the_same_estimates(runtime, committed):
    """Every non-regression state of the committed checkpoint restores, serializes back to the
    same bytes and serves the estimate the earlier code served; the averaged-SGD blobs of the
    regression queries are refused."""
    from aggregator.errors import StateError
    from aggregator.serve import estimate_payload

    _, _, blobs = committed
    want = json.loads((HERE / "estimates.json").read_text())
    assert sorted(want) == sorted(blobs)
    for name, blob in blobs.items():
        if name in REGRESSIONS:
            with pytest.raises(StateError):
                runtime.restore_state(name, blob)
            continue
        st = runtime.restore_state(name, blob)
        assert st.to_bytes() == blob, name
        got = estimate_payload(name, st)
        assert "error" not in got and "error" not in want[name], name
        assert got["params"] == want[name]["params"] and got["n"] == want[name]["n"], name
        for key in ("value", "stderr", "ci_low", "ci_high"):
            for a, b in zip(got[key], want[name][key], strict=True):
                assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300), (name, key, a, b)


def _worker_with_state_record(runtime, value: bytes):
    """A worker over fake clients whose state-topic reader holds ``value`` as the latest
    checkpoint of partition 0."""
    from aggregator.checkpoint import checkpoint_key
    from aggregator.metrics import WorkerMetrics
    from aggregator.worker import KafkaClients, Worker
    from tests.aggregator.worker_support import FakeConsumer, FakeProducer

    key = checkpoint_key(runtime.name, 0)
    reader = types.SimpleNamespace(latest={key: value}, offsets={key: 41}, close=lambda: None)
    clients = KafkaClients(FakeConsumer([]), FakeProducer(), reader)
    return Worker(runtime, lambda: clients, reports_topic="reports", state_topic="state",
                  dead_letter_topic="dlq", group_id="g", metrics=WorkerMetrics()).open()


def test_a_worker_rebuilds_a_partition_whose_checkpoint_is_version_1(runtime, caplog):
    """The worker's restore (``_restore_partition``): the version-1 checkpoint is counted as an
    invalid state record, logged with its reason, and the partition starts again from offset 0
    with fresh states — while a version-2 checkpoint of the same progress restores as is."""
    from aggregator.checkpoint import RETIRED_VERSIONS, Checkpoint
    from tests.integration import pipeline_support as ps

    old = (HERE / "checkpoint.bin").read_bytes()
    w = _worker_with_state_record(runtime, old)
    part = w._restore_partition(0)
    assert (part.next_offset, part.reports, part.records, part.published_offset) == (0, 0, 0, None)
    assert sorted(part.states) == sorted(runtime.query_names)
    assert all(st.n == 0 for st in part.states.values())
    text = w.metrics.exposition().decode()
    assert ps.metric_value(text, "ldp_state_records_invalid_total") == 1
    assert RETIRED_VERSIONS[1] in caplog.text
    assert "rebuilding partition 0 from the earliest offset" in caplog.text

    states = fold(runtime, _records())
    new = Checkpoint(runtime.name, 0, N_RECORDS, N_RECORDS * PER_RECORD, runtime.fingerprint,
                     {name: st.to_bytes() for name, st in states.items()}, records=N_RECORDS).to_bytes()
    w = _worker_with_state_record(runtime, new)
    part = w._restore_partition(0)
    assert (part.next_offset, part.reports, part.records) == (N_RECORDS, N_RECORDS * PER_RECORD, N_RECORDS)
    assert {n: st.to_bytes() for n, st in part.states.items()} == {n: st.to_bytes()
                                                                    for n, st in states.items()}
    assert ps.metric_value(w.metrics.exposition().decode(), "ldp_state_records_invalid_total") == 0
