"""Fixtures shared by the mechanism tests."""

from __future__ import annotations

import contextlib

import pytest

try:  # the mixture fits are many tall-skinny matrix products: threaded BLAS only contends on a busy machine
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
    threadpool_limits = None


@pytest.fixture(scope="module")
def one_blas_thread():
    """Limit BLAS to one thread for the duration of a test module."""
    with threadpool_limits(limits=1, user_api="blas") if threadpool_limits else contextlib.nullcontext():
        yield
