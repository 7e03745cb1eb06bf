"""A checkpoint written by an earlier version of the code restores unchanged (tests/reference/README.md)."""

from __future__ import annotations

import json
import math
import struct

import pytest

from tests.reference.make_checkpoint_fixture import HERE, N_RECORDS, PER_RECORD, fold


def _records() -> list[bytes]:
    data = (HERE / "records.bin").read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


@pytest.fixture(scope="module")
def runtime():
    from aggregator.config import PipelineConfig
    from aggregator.worker import PipelineRuntime

    return PipelineRuntime.from_config(PipelineConfig.load(HERE / "pipeline.toml"))


@pytest.fixture(scope="module")
def checkpoint():
    from aggregator.checkpoint import Checkpoint

    return Checkpoint.from_bytes((HERE / "checkpoint.bin").read_bytes())


def test_the_committed_checkpoint_is_what_todays_fold_writes(runtime, checkpoint):
    """Decoding the committed records and folding them record by record gives byte-identical
    state blobs: the wire format, the doubling draws and every state's serialization are unchanged."""
    records = _records()
    assert len(records) == N_RECORDS
    states = fold(runtime, records)
    assert checkpoint.next_offset == N_RECORDS and checkpoint.reports == N_RECORDS * PER_RECORD
    assert checkpoint.fingerprint == runtime.fingerprint
    assert sorted(checkpoint.states) == sorted(states)
    for name, st in states.items():
        assert st.to_bytes() == checkpoint.states[name], name


def test_the_committed_checkpoint_restores_to_the_same_estimates(runtime, checkpoint):
    """Every state of the committed checkpoint restores, serializes back to the same bytes and
    serves the estimate the earlier code served."""
    from aggregator.serve import estimate_payload

    want = json.loads((HERE / "estimates.json").read_text())
    assert sorted(want) == sorted(checkpoint.states)
    for name, blob in checkpoint.states.items():
        st = runtime.restore_state(name, blob)
        assert st.to_bytes() == blob, name
        got = estimate_payload(name, st)
        assert "error" not in got and "error" not in want[name], name
        assert got["params"] == want[name]["params"] and got["n"] == want[name]["n"], name
        for key in ("value", "stderr", "ci_low", "ci_high"):
            for a, b in zip(got[key], want[name][key], strict=True):
                assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300), (name, key, a, b)
