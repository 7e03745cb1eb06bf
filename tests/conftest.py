"""Project-wide test fixtures."""

from __future__ import annotations

import numpy as np
import pytest


def global_rng_fingerprint() -> tuple:
    """A hashable snapshot of numpy's global (legacy) random state."""
    state = np.random.get_state(legacy=False)
    return (repr(state["state"]), state.get("has_gauss"), state.get("gauss"))


@pytest.fixture(autouse=True)
def _forbid_global_numpy_rng():
    """Fail any test that draws from or reseeds numpy's global random state.

    Tests must use a local ``numpy.random.default_rng(seed)``.
    """
    before = global_rng_fingerprint()
    yield
    if global_rng_fingerprint() != before:
        pytest.fail("test touched numpy's global random state; use numpy.random.default_rng(seed)")
