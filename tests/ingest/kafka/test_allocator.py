"""ingest.kafka.allocator.keep_freed_memory: argument checks, and (on glibc) that large buffers freed and
allocated again stop costing page faults — the effect the worker relies on (docs/benchmarks.md)."""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys

import pytest

from ingest.errors import ConfigError
from ingest.kafka.allocator import MMAP_THRESHOLD_MAX, TRIM_THRESHOLD_MAX, keep_freed_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.parametrize("bad", [-1, 1, MMAP_THRESHOLD_MAX - 1, TRIM_THRESHOLD_MAX + 1, 2.5e8, "128", True])
def test_out_of_range_is_refused_with_the_argument_named(bad):
    msg = r"trim_threshold_bytes must be 0 or an integer in \[33554432, 2147483647\], got"
    with pytest.raises(ConfigError, match=msg):
        keep_freed_memory(bad)


def test_zero_leaves_the_allocator_alone():
    assert keep_freed_memory(0) is False


# A child process does what kafka-python does per fetch response, on a thread of its own: a few
# multi-MiB copies of the response alive at once, all freed before the next response. It reports
# its minor page faults, with or without the settings.
_CHILD = """
import json, resource, sys, threading
from ingest.kafka.allocator import keep_freed_memory
applied = keep_freed_memory(int(sys.argv[1]))
faults = {}
def responses():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        copies = [bytearray(6 << 20) for _ in range(4)]  # zero-filled: every page touched
        del copies
    faults["n"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
t = threading.Thread(target=responses)
t.start(); t.join()
print(json.dumps({"applied": applied, "faults": faults["n"]}))
"""


def _faults(trim: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(trim)], capture_output=True, text=True,
                         check=True, timeout=60)
    return json.loads(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="mallopt settings exist on glibc only")
def test_freed_buffers_are_reused_without_page_faults():
    plain, kept = _faults(0), _faults(128 << 20)
    assert plain["applied"] is False and kept["applied"] is True
    pages = 20 * 4 * (6 << 20) // 4096
    # glibc defaults: the freed copies go back to the kernel and fault in again for the next
    assert plain["faults"] > pages // 2, plain
    # kept: only the first response's pages fault
    assert kept["faults"] < pages // 10, kept


@pytest.mark.skipif(not GLIBC, reason="mallopt settings exist on glibc only")
def test_largest_trim_threshold_is_applied_and_logged_as_given(caplog):
    with caplog.at_level(logging.INFO, logger="ingest.kafka.allocator"):
        assert keep_freed_memory(2047 << 20) is True
    assert "trim threshold 2047 MiB" in caplog.text
    keep_freed_memory(128 << 20)  # the worker's default again for the rest of this process
