"""Random-generator handling shared by every mechanism.

Client-side noise must never come from a fixed seed: ``rng=None`` means a fresh
``numpy.random.Generator`` seeded from OS entropy. Tests pass a seeded generator.
"""

from __future__ import annotations

import numpy as np

from mechanisms.errors import ParameterError

RngLike = np.random.Generator | int | None


def as_generator(rng: RngLike = None) -> np.random.Generator:
    """Return a ``numpy.random.Generator``.

    Parameters
    ----------
    rng : Generator, int or None
        ``None`` → a new generator seeded from OS entropy; an ``int`` → ``default_rng(int)``
        (tests and benchmarks only); a ``Generator`` is returned unchanged.

    Raises
    ------
    ParameterError
        If ``rng`` is of any other type.
    """
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise ParameterError(f"rng must be a numpy Generator, an int seed or None, got {rng!r}")
