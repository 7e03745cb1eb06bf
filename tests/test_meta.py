"""Tests of the test harness itself and of package layering."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from tests.conftest import global_rng_fingerprint

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_global_rng_guard_detects_a_draw():
    """The guard's snapshot changes when the global state is drawn from (then we restore it)."""
    saved = np.random.get_state()
    before = global_rng_fingerprint()
    try:
        np.random.random()
        assert global_rng_fingerprint() != before
    finally:
        np.random.set_state(saved)
    assert global_rng_fingerprint() == before


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("mechanisms", {"ingest", "aggregator"}), ("ingest", {"aggregator"})],
)
def test_layering(package, forbidden):
    """mechanisms imports neither other package; ingest does not import aggregator."""
    offenders = []
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in forbidden]
    assert not offenders, offenders


def test_tests_need_nothing_outside_the_repository():
    """A fresh clone must run every test: no test reads the team's ../shared folder."""
    offenders = [
        str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
        if p.name != "test_meta.py" and ('"shared"' in p.read_text() or "../shared" in p.read_text())
    ]
    assert not offenders, offenders


def test_library_files_stay_short():
    """One file, one idea: no module of the three packages is over 700 lines."""
    long = {str(p.relative_to(ROOT)): n for pkg in ("mechanisms", "ingest", "aggregator")
            for p in (ROOT / pkg).rglob("*.py") if (n := len(p.read_text().splitlines())) > 700}
    assert not long, long
