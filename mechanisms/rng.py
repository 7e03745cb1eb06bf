"""Random-generator handling shared by every mechanism.

Client-side noise must never come from a fixed seed: ``rng=None`` means a fresh
``numpy.random.Generator`` seeded from OS entropy. ``rng="secure"`` means a generator whose bit
stream is a cryptographically secure PRNG (ChaCha20 from ``randomgen``, keyed with 256 bits from
``secrets``/``os.urandom``) behind numpy's ``Generator`` interface, so every mechanism draws its
noise through the same API. Tests pass a seeded generator or an int.

Source: docs/privacy.md, "Floating-point attacks on noise sampling"; contributing.md
("Randomness").
"""

from __future__ import annotations

import secrets
from typing import Literal

import numpy as np

from mechanisms.errors import ParameterError

__all__ = ["SECURE", "RngLike", "as_generator", "is_secure", "secure_generator"]

#: The string accepted by :func:`as_generator` for a cryptographically secure generator.
SECURE = "secure"

RngLike = np.random.Generator | int | Literal["secure"] | None

_SECURE_ALGORITHMS = ("chacha", "aes")


def secure_generator(algorithm: str = "chacha") -> np.random.Generator:
    """A ``numpy.random.Generator`` driven by a cryptographically secure bit generator.

    Parameters
    ----------
    algorithm : {"chacha", "aes"}
        ``"chacha"``: ``randomgen.ChaCha`` with 20 rounds (ChaCha20 keystream, 256-bit key);
        ``"aes"``: ``randomgen.AESCounter`` (AES-128 in counter mode).

    Returns
    -------
    numpy.random.Generator
        Seeded from the operating system's CSPRNG (``secrets.randbits``: 256 bits for ChaCha,
        128 for AES); never a fixed seed. Its ``bit_generator`` is the ``randomgen`` object.

    Raises
    ------
    ParameterError
        If ``algorithm`` is not one of ``"chacha"``, ``"aes"``.
    ImportError
        If ``randomgen`` is not installed (it is a dependency of the project).

    Notes
    -----
    The bit stream is unpredictable without the key; numpy's transformations (ziggurat normals,
    gamma, uniform doubles) are applied on top unchanged, so the *distribution* of every draw is
    the same as with the default PCG64 generator. What a CSPRNG does not fix is the
    floating-point support of the transformed samples (Mironov 2012); see docs/privacy.md.
    """
    if algorithm not in _SECURE_ALGORITHMS:
        raise ParameterError(f"algorithm must be one of {_SECURE_ALGORITHMS}, got {algorithm!r}")
    import randomgen

    if algorithm == "chacha":
        bit_gen = randomgen.ChaCha(seed=secrets.randbits(256), rounds=20)
    else:
        bit_gen = randomgen.AESCounter(seed=secrets.randbits(128))
    return np.random.Generator(bit_gen)


def is_secure(rng: np.random.Generator) -> bool:
    """Whether ``rng`` draws from a cryptographically secure bit generator (ChaCha / AESCounter).

    Parameters
    ----------
    rng : numpy.random.Generator

    Returns
    -------
    bool
    """
    name = type(getattr(rng, "bit_generator", None)).__name__
    return name in ("ChaCha", "AESCounter")


def as_generator(rng: RngLike = None) -> np.random.Generator:
    """Return a ``numpy.random.Generator``.

    Parameters
    ----------
    rng : Generator, int, "secure" or None
        ``None`` → a new PCG64 generator seeded from OS entropy (never a fixed seed);
        ``"secure"`` → :func:`secure_generator` (ChaCha20 keyed from the OS CSPRNG); an ``int``
        → ``default_rng(int)`` (tests and benchmarks only); a ``Generator`` is returned unchanged.

    Returns
    -------
    numpy.random.Generator

    Raises
    ------
    ParameterError
        If ``rng`` is of any other type, or a string other than ``"secure"``.
    """
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, str):
        if rng == SECURE:
            return secure_generator()
        raise ParameterError(f"rng must be a numpy Generator, an int seed, 'secure' or None, got {rng!r}")
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise ParameterError(f"rng must be a numpy Generator, an int seed, 'secure' or None, got {rng!r}")
