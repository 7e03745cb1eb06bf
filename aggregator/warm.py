"""Compile every numba kernel of the worker into numba's on-disk cache: ``python -m aggregator.warm``.

Run once at install (``make``'s setup step, the Docker image build; ``ldp-stream demo`` runs it
itself when the cache is empty): the bulk decoder (``ingest.client.decode_kernel``), the closed-form
state loops (``aggregator.state._kernels``) and the renewal loops
(``aggregator.state._renewable_kernel``, ``aggregator.state._kmeans_kernel``) then load in ≈ 1–3 s
per process instead of compiling for ≈ 15 s. Where the cache cannot be written see
``ingest.jit``. :func:`uncached_kernels` tells whether this has been done;
:func:`announce_compile` is the line ``work`` and ``serve`` print before a start that compiles.
"""

from __future__ import annotations

import importlib
import pickle
import sys

__all__ = ["KERNEL_MODULES", "announce_compile", "uncached_kernels", "warm_all"]

#: The modules whose numba kernels :func:`warm_all` compiles (directly or through their callers).
KERNEL_MODULES = ("ingest.client.decode_kernel", "aggregator.state._kernels",
                  "aggregator.state._index_kernel", "aggregator.state._renewable_kernel",
                  "aggregator.state._kmeans_kernel")


def warm_all() -> None:
    """Compile (or load) all the worker's kernels in this process."""
    from aggregator.state import _kernels, _kmeans_kernel, _renewable_kernel
    from ingest.client import decode_kernel

    decode_kernel.warm()
    _kernels.warm()
    _renewable_kernel.warm()
    _kmeans_kernel.warm()


def uncached_kernels() -> list[str]:
    """The kernels of :data:`KERNEL_MODULES` that numba's on-disk cache holds no compiled code
    for (none compiled yet, or compiled from another version of their source file).

    Imports the modules (numba included) but compiles and loads nothing. Kernels that numba
    cannot cache here (no writable cache directory, ``ingest.jit``) are not listed: every
    process compiles them, and compiling them once beforehand would not help.

    Returns
    -------
    list of str
        ``"module.function"`` names, sorted; empty when every kernel is cached.
    """
    from numba.core.dispatcher import Dispatcher

    missing = []
    for name in KERNEL_MODULES:
        module = importlib.import_module(name)
        for attr, fn in vars(module).items():
            if not isinstance(fn, Dispatcher) or fn.py_func.__module__ != name:
                continue
            index = getattr(getattr(fn, "_cache", None), "_cache_file", None)
            if index is None:  # numba's NullCache: this kernel is never cached here
                continue
            try:
                cached = bool(index._load_index())  # {} when absent, stale or of another numba
            except (OSError, EOFError, ValueError, TypeError, AttributeError, pickle.UnpicklingError):
                cached = False  # an unreadable index: numba compiles again
            if not cached:
                missing.append(f"{name}.{attr}")
    return sorted(missing)


def announce_compile(prog: str, file=None) -> bool:
    """Print ``<prog>: compiling the numba kernels (first start only …) …`` when
    :func:`uncached_kernels` finds some, so that a long start-up says what it does.

    Parameters
    ----------
    prog : str
        The command that prints it (``"ldp-stream serve"``).
    file : file object or None
        Where to print (default ``sys.stderr``), flushed.

    Returns
    -------
    bool
        Whether the line was printed.
    """
    try:
        missing = uncached_kernels()
    except (ImportError, AttributeError):  # numba missing or changed: the start-up itself says so
        return False  # (nothing broader: a signal's exception during start-up must pass)
    if missing:
        print(f"{prog}: compiling the numba kernels (first start only; numba caches them for "
              f"the next) …", file=file or sys.stderr, flush=True)
    return bool(missing)


if __name__ == "__main__":
    warm_all()
