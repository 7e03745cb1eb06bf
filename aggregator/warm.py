"""Compile every numba kernel of the worker into numba's on-disk cache: ``python -m aggregator.warm``.

Run once at install (``make``'s setup step, the Docker image build): the bulk decoder
(``ingest._decode_kernel``), the closed-form state loops (``aggregator.state._kernels``) and the
renewal loops (``aggregator.state._renewable_kernel``, ``aggregator.state._kmeans_kernel``) then
load in ≈ 3 s per process instead of compiling for ≈ 15 s. Where the cache cannot be written see
``ingest._numba``.
"""

from __future__ import annotations


def warm_all() -> None:
    """Compile (or load) all the worker's kernels in this process."""
    from aggregator.state import _kernels, _kmeans_kernel, _renewable_kernel
    from ingest import _decode_kernel

    _decode_kernel.warm()
    _kernels.warm()
    _renewable_kernel.warm()
    _kmeans_kernel.warm()


if __name__ == "__main__":
    warm_all()
