"""Batched privatize + count throughput of the categorical mechanisms (reports/s).

Run: .venv/bin/python benchmarks/uldp_client.py [n]
"""

from __future__ import annotations

import sys
import time

import numpy as np

from mechanisms.uldp import URAP, URR


def rate(mech, n, rng):
    x = rng.integers(0, mech.k, size=n)
    t = time.perf_counter()
    c = mech.counts(mech.privatize(x, rng))
    dt = time.perf_counter() - t
    assert c.n == n
    return n / dt


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    rng = np.random.default_rng(0)
    cases = [
        ("uRAP k=100 s=10 eps=1", URAP(100, range(10), 1.0)),
        ("uRAP k=100 s=10 eps=1 (no patterns)", URAP(100, range(10), 1.0, max_patterns=0)),
        ("uRAP k=10^4 s=100 eps=1", URAP(10_000, range(100), 1.0)),
        ("uRAP k=10^4 s=100 eps=1 (no patterns)", URAP(10_000, range(100), 1.0, max_patterns=0)),
        ("uRR k=100 s=10 eps=1", URR(100, range(10), 1.0)),
    ]
    for name, mech in cases:
        best = max(rate(mech, n, rng) for _ in range(3))
        print(f"{name:42s} {best:12,.0f} reports/s (batch {n})")


if __name__ == "__main__":
    main()
