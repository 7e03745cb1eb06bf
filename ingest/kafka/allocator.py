"""glibc allocator settings for a consumer process: :func:`keep_freed_memory` stops it from
returning each fetch response's memory to the kernel (and page-faulting it back in for the next
one; docs/benchmarks.md §3.6)."""

from __future__ import annotations

import ctypes
import logging
import platform

from ingest.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["MMAP_THRESHOLD_MAX", "TRIM_THRESHOLD_MAX", "keep_freed_memory"]

#: glibc ``mallopt`` parameters (``<malloc.h>``), the largest mmap threshold glibc accepts on
#: 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``) and the largest trim threshold ``mallopt``'s
#: ``int`` argument can carry.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
TRIM_THRESHOLD_MAX = 2**31 - 1


def keep_freed_memory(trim_threshold_bytes: int) -> bool:
    """Make glibc ``malloc`` keep freed memory for reuse instead of handing it back to the kernel.

    kafka-python copies every fetch response (megabytes with large records) several times in
    fresh buffers. With glibc's defaults those buffers are ``mmap``-ed and unmapped, or the heap
    top is trimmed, after each response, so every page of the next one is faulted in again: on
    the benchmark machine (2-core KVM guest) that was 2·10⁵ minor faults per 4·10⁶ reports and
    more than half of a raw consume loop's network-thread CPU time (docs/benchmarks.md §3.6).
    This sets, for the whole process:

    * ``M_MMAP_THRESHOLD`` to 32 MiB (glibc's maximum): buffers below it come from the heap;
    * ``M_TRIM_THRESHOLD`` to ``trim_threshold_bytes``: up to that much free memory stays at
      the top of each heap rather than being returned.

    The cost is resident memory: up to ``trim_threshold_bytes`` of freed memory per malloc arena
    (one per thread that allocates, at most 8 per core) stays mapped.

    Parameters
    ----------
    trim_threshold_bytes : int
        Free memory kept at a heap's top, bytes, in ``[MMAP_THRESHOLD_MAX, TRIM_THRESHOLD_MAX]``
        (32 MiB … 2 GiB − 1); 0 leaves the allocator alone.

    Returns
    -------
    bool
        Whether the settings were applied (False for 0, or where the C library is not glibc).

    Raises
    ------
    ConfigError
        If ``trim_threshold_bytes`` is neither 0 nor within the range above.
    """
    if isinstance(trim_threshold_bytes, bool) or not isinstance(trim_threshold_bytes, int) or not (
        trim_threshold_bytes == 0 or MMAP_THRESHOLD_MAX <= trim_threshold_bytes <= TRIM_THRESHOLD_MAX
    ):
        raise ConfigError(f"trim_threshold_bytes must be 0 or an integer in [{MMAP_THRESHOLD_MAX}, "
                          f"{TRIM_THRESHOLD_MAX}], got {trim_threshold_bytes!r}")
    if trim_threshold_bytes == 0:
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        logger.debug("C library is not glibc: malloc settings left alone")
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        logger.debug("mallopt not found: malloc settings left alone")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
          and mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes) == 1)
    if ok:
        logger.info("glibc malloc: mmap threshold %d MiB, trim threshold %.0f MiB (freed memory is "
                    "reused, not returned)", MMAP_THRESHOLD_MAX >> 20, trim_threshold_bytes / 2**20)
    else:
        logger.warning("glibc mallopt refused the settings: malloc left at its defaults")
    return ok
