"""Fuzzing the wire decoder for a bounded time (docs/reliability.md §5): coverage-guided with atheris
(libFuzzer) when installed, plus a hypothesis mutation fuzzer that always runs. Target and contract:
``benchmarks/fuzz_codec.py`` (``check_one``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "fuzz_codec.py"


def _load():
    spec = importlib.util.spec_from_file_location("fuzz_codec", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fz = _load()
SEEDS = fz.seed_records(np.random.default_rng(5))


def test_seed_corpus_is_valid():
    assert len(SEEDS) >= 7
    assert all(fz.check_one(s) == "ok" for s in SEEDS)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(fz.mutations(SEEDS), st.binary(max_size=256)))
def test_hypothesis_fuzz_decoder_contract(data):
    fz.check_one(data)


def test_contract_violations_are_detected(monkeypatch):
    """The fuzz target can fail: a decoder that leaks another exception or uses the safety net."""
    from ingest.client import codec

    real = codec.decode

    def leaky(data, known, **kw):
        if len(data) == 5:
            raise IndexError("boom")
        return real(data, known, **kw)

    monkeypatch.setattr(codec, "decode", leaky)
    with pytest.raises(fz.FuzzFailure, match="IndexError"):
        fz.check_one(b"12345")

    def netted(data, known, **kw):
        raise codec.InternalDecodeError("internal decoder error: KeyError")

    monkeypatch.setattr(codec, "decode", netted)
    with pytest.raises(fz.FuzzFailure, match="internal_error"):
        fz.check_one(SEEDS[0])

    def lax(data, known, **kw):  # accepts a code outside the domain
        b = real(data, known, **kw)
        for name, col in b.categorical.items():
            if isinstance(col, np.ndarray) and col.size:
                col = col.copy()
                col[0] = 10_000
                b.categorical[name] = col
        return b

    monkeypatch.setattr(codec, "decode", lax)
    urr_seed = next(s for s in SEEDS if any(isinstance(c, np.ndarray) and c.size
                                            for c in real(s, fz.KNOWN).categorical.values()))
    with pytest.raises(fz.FuzzFailure, match="contract"):
        fz.check_one(urr_seed)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_atheris_coverage_guided_bounded(tmp_path):
    """libFuzzer over the instrumented decoder for 5 s (seeded) from the valid-record corpus."""
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    proc = subprocess.run([sys.executable, str(SCRIPT), "-max_total_time=5", "-seed=12345",
                           "-max_len=4096", "-print_final_stats=1", str(corpus)],
                          cwd=ROOT, capture_output=True, text=True, timeout=110)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Done" in out and "runs in" in out, out[-2000:]
    runs = int(out.split("Done ", 1)[1].split(" runs", 1)[0])
    assert runs > 1000, out[-2000:]
    assert len(list(corpus.iterdir())) > len(SEEDS)  # coverage feedback grew the corpus
