"""``numba.njit`` with numba's on-disk cache where a cache directory can be written, without it
elsewhere.

numba raises ``RuntimeError: cannot cache function …: no locator available`` *at import* when it
finds no writable cache directory: a package installed read-only without ``NUMBA_CACHE_DIR``, or a
container with a read-only root filesystem and an unwritable ``$HOME``. The compiled loops (the
bulk decoder ``ingest.client.decode_kernel``, the state updates in ``aggregator.state``) must not make
the worker unimportable there: they are then compiled in every process (≈ 13 s at start) and a
warning names the fix (``NUMBA_CACHE_DIR`` on a writable volume; the
deployment files set it).
"""

from __future__ import annotations

import logging

from numba import njit

__all__ = ["jit"]

log = logging.getLogger(__name__)


def jit(**options):
    """Decorator: ``numba.njit(cache=True, **options)``, or ``numba.njit(**options)`` where numba
    cannot cache (see the module docstring).

    Parameters
    ----------
    **options
        numba ``njit`` options (e.g. ``nogil=True``).
    """

    def wrap(fn):
        try:
            return njit(cache=True, **options)(fn)
        except RuntimeError as exc:
            log.warning("numba cannot cache %s (%s): compiling it in this process; set NUMBA_CACHE_DIR "
                        "to a writable directory to keep the compiled code", fn.__name__, exc)
            return njit(**options)(fn)

    return wrap
