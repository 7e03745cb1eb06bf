"""Write the checkpoint fixture in ``checkpoint_v1/`` (see README.md beside this file).

Run from the repository root: ``python -m tests.reference.make_checkpoint_fixture``. It makes
80 records of 100 privatized synthetic flights (seed 20261201), folds them record by record into
one state per query of ``checkpoint_v1/pipeline.toml`` and writes

* ``records.bin``: the encoded records, each behind a 4-byte big-endian length;
* ``checkpoint.bin``: the checkpoint of those states (partition 0, next_offset 80);
* ``estimates.json``: every query's estimate payload as ``serve`` returns it.

The committed files were written by the code before the worker and state modules were
restructured (checkpoint format version 1, averaged-SGD regression states); today's config
refuses the ``sgd`` tables of their ``pipeline.toml``, so ``main`` no longer runs on it.
``tests/aggregator/test_checkpoint_fixture.py`` uses :func:`fold` to check that today's code folds
the same records into byte-identical states for the non-regression queries, and that it refuses
the version-1 checkpoint.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent / "checkpoint_v1"
N_RECORDS, PER_RECORD, SEED = 80, 100, 20261201
CREATED = 1764547200.0  # fixed so the file is reproducible


def fold(runtime, records: list[bytes]) -> dict:
    """Fresh states of ``runtime``'s queries with ``records`` folded in one by one, in order."""
    states = runtime.new_states()
    for rec in records:
        batch = runtime.decode(rec)
        x2 = runtime.double(batch, rec)
        for st in states.values():
            st.update(batch, x2)
    return states


def main() -> None:
    from aggregator.checkpoint import Checkpoint
    from aggregator.config import PipelineConfig
    from aggregator.serve import estimate_payload
    from aggregator.worker import PipelineRuntime
    from tests.integration import pipeline_support as ps

    cfg = PipelineConfig.load(HERE / "pipeline.toml")
    runtime = PipelineRuntime.from_config(cfg)
    records = ps.make_records(runtime.schema, n_records=N_RECORDS, per_record=PER_RECORD, seed=SEED)
    states = fold(runtime, records)
    ck = Checkpoint(cfg.pipeline.name, 0, N_RECORDS, N_RECORDS * PER_RECORD, runtime.fingerprint,
                    {name: st.to_bytes() for name, st in states.items()}, records=N_RECORDS, created=CREATED)
    (HERE / "records.bin").write_bytes(b"".join(struct.pack(">I", len(r)) + r for r in records))
    (HERE / "checkpoint.bin").write_bytes(ck.to_bytes())
    payloads = {name: estimate_payload(name, st) for name, st in states.items()}
    (HERE / "estimates.json").write_text(json.dumps(payloads, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
