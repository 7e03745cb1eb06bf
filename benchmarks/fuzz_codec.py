"""Coverage-guided fuzzing of the wire decoder (``ingest.client.codec.decode``; docs/reliability.md §5).

Property checked on every input: ``decode`` either raises a :class:`ingest.errors.DecodeError`
whose ``reason`` is one of :data:`ingest.client.codec.DECODE_REASONS` other than ``internal_error``, or
returns a :class:`ReportBatch` that re-encodes to a record decoding to the same batch (finite
numerics inside ``ingest.client.bounds.numeric_span``, codes and bit positions inside their domains, at
most one non-sensitive bit per uRAP report). Anything else — another exception type,
``internal_error`` (the decoder's safety net caught a bug), a non-finite value or one outside
its field's span, an index outside
its domain — is a crash.

Engines
-------
* ``atheris`` (libFuzzer, coverage-guided) when installed: ``python benchmarks/fuzz_codec.py
  -max_total_time=600 [corpus_dir]`` — any libFuzzer flag works; the seed corpus (valid records of
  four schemas: every block layout, and version-2 records with a TIME block of each width) is
  written to ``corpus_dir`` if it is empty.
* otherwise a ``hypothesis`` loop (mutations of the seed records plus random bytes) for
  ``--seconds`` seconds.

CI runs this file for a few seconds through ``tests/ingest/client/test_fuzz_codec.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from ingest.client import codec  # noqa: E402
from ingest.client.batch import ReportBatch  # noqa: E402
from ingest.client.bounds import numeric_span  # noqa: E402
from ingest.client.codec import DECODE_REASONS, encode  # noqa: E402
from ingest.client.event_time import MAX_EVENT_TIME  # noqa: E402
from ingest.client.schema import TelemetrySchema  # noqa: E402
from ingest.errors import DecodeError  # noqa: E402
from mechanisms.uldp.sparse import SparseBits  # noqa: E402

MAX_REPORTS = 4096  # keep a single input cheap for the fuzzer
MAX_BYTES = 1 << 20


def schemas() -> list[TelemetrySchema]:
    """The flights example schema and four small schemas (uRR only; uRAP-only with k = 300 and one
    sensitive category; one with ``[event_time]`` at a resolution of 1 h, a uRR and a uRAP field;
    uRAP-only with k = 300 and all but one category sensitive)."""
    flights = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    small = TelemetrySchema.from_dict({
        "name": "fuzz_urr", "numeric": {"zero_prob": 0.1, "scale": 1.0,
                                        "fields": [{"name": "x", "low": 0.0, "high": 1.0}]},
        "categorical": [{"name": "c", "categories": [f"v{j}" for j in range(5)], "sensitive": ["v0"],
                         "mechanism": "urr", "epsilon": 1.0}]})
    wide = TelemetrySchema.from_dict({
        "name": "fuzz_urap",
        "categorical": [{"name": "c", "categories": [f"v{j}" for j in range(300)], "sensitive": ["v0"],
                         "mechanism": "urap", "epsilon": 1.0}]})
    # all but one of 300 categories sensitive: an all-ones report is possible (one non-sensitive
    # bit) and takes the bitmap layout
    dense = TelemetrySchema.from_dict({
        "name": "fuzz_bitmap",
        "categorical": [{"name": "c", "categories": [f"v{j}" for j in range(300)],
                         "sensitive": [f"v{j}" for j in range(299)], "mechanism": "urap",
                         "epsilon": 1.0}]})
    timed = TelemetrySchema.from_dict({
        "name": "fuzz_time", "numeric": {"zero_prob": 0.1, "scale": 1.0,
                                         "fields": [{"name": "x", "low": 0.0, "high": 1.0}]},
        "categorical": [{"name": "c", "categories": [f"v{j}" for j in range(5)], "sensitive": ["v0"],
                         "mechanism": "urr", "epsilon": 1.0},
                        {"name": "u", "categories": [f"v{j}" for j in range(12)],
                         "sensitive": [f"v{j}" for j in range(11)], "mechanism": "urap",
                         "epsilon": 1.0}],
        "event_time": {"field": "t", "resolution": "1h"}})
    return [flights, small, wide, timed, dense]


KNOWN = {s.fingerprint: s for s in schemas()}


def seed_records(rng: np.random.Generator | None = None) -> list[bytes]:
    """Valid records of every schema (n = 0, 1, 7; sparse and bitmap uRAP layouts; TIME blocks of
    widths 1, 2 and 4, the last one reaching the latest hour before ``MAX_EVENT_TIME``)."""
    from ingest.client.privatizer import Privatizer

    rng = rng if rng is not None else np.random.default_rng(0)
    out = []
    for s in KNOWN.values():
        priv = Privatizer(s, rng=rng)
        for n in (1, 7):
            cols = {f.name: rng.uniform(f.low, f.high, n) for f in (s.numeric.fields if s.numeric else ())}
            for c in s.categorical:
                values = np.asarray(list(c.categories), dtype=object)
                cols[c.name] = values[rng.integers(0, len(values), n)]
            if s.event_time is not None:  # 2013: offsets up to 8759 h, 2-byte offsets for n = 7
                cols[s.event_time.field] = rng.integers(1356998400, 1388534400, n)
            out.append(encode(priv.privatize_batch(cols), time_resolution=s.time_resolution_s))
    # an all-ones uRAP report (one non-sensitive bit) forces the bitmap layout
    wide, dense = schemas()[2], schemas()[4]
    out.append(encode(ReportBatch(dense.fingerprint, np.empty((2, 0)),
                                  {"c": SparseBits.from_dense(np.ones((2, dense.categorical[0].k), bool))})))
    out.append(encode(ReportBatch(wide.fingerprint, np.empty((0, 0)),
                                  {"c": SparseBits.from_dense(np.zeros((0, wide.categorical[0].k), bool))})))
    # TIME blocks: 1-byte offsets (a few hours), 4-byte offsets (1970 … the last whole hour before
    # MAX_EVENT_TIME), and no report at all
    timed = schemas()[3]
    res = timed.time_resolution_s
    last = MAX_EVENT_TIME // res * res
    for t in ([1357034400, 1357038000, 1357041600], [0, last]):
        n = len(t)
        b = ReportBatch(timed.fingerprint, rng.uniform(0, 1, (n, 1)),
                        {"c": rng.integers(0, 5, n).astype(np.int32),
                         "u": SparseBits.from_dense(rng.random((n, 12)) < 0.3)}, np.array(t))
        out.append(encode(b, time_resolution=res))
    none = {"c": np.empty(0, np.int32), "u": SparseBits.from_dense(np.zeros((0, 12), bool))}
    out.append(encode(ReportBatch(timed.fingerprint, np.empty((0, 1)), none, np.empty(0, np.int64)),
                      time_resolution=res))
    return out


class FuzzFailure(AssertionError):
    """The decoder violated its contract on an input."""


def check_one(data: bytes) -> str:
    """Run the decoder contract on one input; returns ``"ok"`` or the decode reason.

    Raises
    ------
    FuzzFailure
        On any contract violation (the input is attached as ``.data``).
    """
    try:
        batch = codec.decode(data, KNOWN, max_reports=MAX_REPORTS, max_bytes=MAX_BYTES)
    except DecodeError as exc:
        reason = getattr(exc, "reason", None)
        if reason not in DECODE_REASONS or reason == "internal_error":
            err = FuzzFailure(f"decode raised reason {reason!r}: {exc}")
            err.data = data
            raise err from exc
        return reason
    except Exception as exc:
        err = FuzzFailure(f"decode raised {type(exc).__name__}: {exc}")
        err.data = data
        raise err from exc
    try:
        schema = KNOWN[batch.fingerprint]
        assert batch.numeric.shape == (batch.n, schema.dim)
        assert np.isfinite(batch.numeric).all()
        lo, hi = numeric_span(schema)
        assert ((batch.numeric >= lo) & (batch.numeric <= hi)).all()
        for c in schema.categorical:
            col = batch.categorical[c.name]
            if isinstance(col, SparseBits):
                assert col.k == c.k and col.n == batch.n
                assert col.indices.size == 0 or (0 <= col.indices.min() and col.indices.max() < c.k)
                sens = np.isin(np.arange(c.k), c.sensitive_codes)
                assert all((~sens[col.indices[a:b]]).sum() <= 1  # uRAP: ≤ 1 non-sensitive bit
                           for a, b in zip(col.offsets[:-1], col.offsets[1:], strict=True))
            else:
                assert col.shape == (batch.n,) and (col.size == 0 or (col.min() >= 0 and col.max() < c.k))
        res = schema.time_resolution_s
        if res is None:
            assert batch.event_time is None
        else:
            t = batch.event_time
            assert t.shape == (batch.n,) and t.dtype == np.int64
            assert t.size == 0 or (t.min() >= 0 and t.max() <= MAX_EVENT_TIME and not (t % res).any())
        again = codec.decode(encode(batch, time_resolution=res), KNOWN, max_reports=MAX_REPORTS,
                             max_bytes=MAX_BYTES)
        assert np.array_equal(again.numeric, batch.numeric)
        assert (again.event_time is None) == (batch.event_time is None)
        assert batch.event_time is None or np.array_equal(again.event_time, batch.event_time)
        for name, col in batch.categorical.items():
            other = again.categorical[name]
            if isinstance(col, SparseBits):
                assert np.array_equal(col.indices, other.indices)
                assert np.array_equal(col.offsets, other.offsets)
            else:
                assert np.array_equal(col, other)
    except Exception as exc:
        err = FuzzFailure(f"decoded batch violates the contract: {type(exc).__name__}: {exc}")
        err.data = data
        raise err from exc
    return "ok"


def mutations(seeds: list[bytes], *, max_ops: int = 6, max_chunk: int = 12):
    """Hypothesis strategy: a record of ``seeds`` with 1 … ``max_ops`` random edits — overwrite a
    byte, insert or delete up to ``max_chunk`` bytes, truncate, or lie in a header count field
    (``n``, ``d`` or ``n_cat``). Shared by the fuzz tests and :func:`_hypothesis_main`."""
    from hypothesis import strategies as st

    @st.composite
    def mutated(draw):
        base = bytearray(draw(st.sampled_from(seeds)))
        for _ in range(draw(st.integers(1, max_ops))):
            op = draw(st.integers(0, 4))
            pos = draw(st.integers(0, max(len(base) - 1, 0)))
            if op == 0 and base:
                base[pos] = draw(st.integers(0, 255))
            elif op == 1:
                base[pos:pos] = draw(st.binary(min_size=1, max_size=max_chunk))
            elif op == 2:
                del base[pos:pos + draw(st.integers(1, max_chunk))]
            elif op == 3:
                base = base[:pos]
            elif len(base) >= 32:  # lie in a header field: n, d or n_cat
                off = draw(st.sampled_from([24, 25, 26, 27, 28, 30]))
                base[off] = draw(st.integers(0, 255))
        return bytes(base)

    return mutated()


def _atheris_main(argv: list[str]) -> None:  # pragma: no cover - run as a subprocess
    import atheris

    corpus_dirs = [a for a in argv[1:] if not a.startswith("-")]
    for d in corpus_dirs:
        p = Path(d)
        p.mkdir(parents=True, exist_ok=True)
        if not any(p.iterdir()):
            for i, rec in enumerate(seed_records()):
                (p / f"seed-{i:03d}").write_bytes(rec)

    def test_one_input(data: bytes) -> None:
        check_one(data)

    # coverage instrumentation of the decoder only (instrument_all() takes minutes)
    import inspect

    from mechanisms.uldp import sparse

    for mod in (codec, sparse):
        for name, obj in list(vars(mod).items()):
            if inspect.isfunction(obj) and obj.__module__ == mod.__name__:
                setattr(mod, name, atheris.instrument_func(obj))
            elif inspect.isclass(obj) and obj.__module__ == mod.__name__:
                for attr, fn in list(vars(obj).items()):
                    if inspect.isfunction(fn):
                        setattr(obj, attr, atheris.instrument_func(fn))
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


def _hypothesis_main(seconds: float) -> int:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    seeds = seed_records()
    deadline = time.monotonic() + seconds
    count = {"n": 0}

    @settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(mutations(seeds, max_ops=8, max_chunk=16), st.binary(max_size=512)))
    def run(data):
        count["n"] += 1
        check_one(data)  # a violation propagates (hypothesis shrinks it first)

    while time.monotonic() < deadline:
        run()
    print(f"hypothesis fuzzing: {count['n']} inputs in {seconds:g} s, no contract violation")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    argv = list(sys.argv if argv is None else argv)
    force_hypothesis = "--hypothesis" in argv
    if not force_hypothesis:
        try:
            import atheris  # noqa: F401
        except ImportError:
            force_hypothesis = True
    if not force_hypothesis:
        _atheris_main([a for a in argv if a != "--hypothesis"])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", 60)))
    ap.add_argument("--hypothesis", action="store_true")
    args, _ = ap.parse_known_args(argv[1:])
    return _hypothesis_main(args.seconds)


if __name__ == "__main__":
    sys.exit(main())
