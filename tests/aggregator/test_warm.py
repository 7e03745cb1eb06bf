"""Whether numba's cache holds the kernels (``aggregator.warm.uncached_kernels``), which the demo
and the ``work``/``serve`` start-up line rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_an_empty_cache_lists_every_kernel_and_a_compiled_one_drops_out(tmp_path):
    # a cache directory of its own: nothing is cached there until this process compiles it
    script = textwrap.dedent("""
        import io, json
        import numpy as np
        from aggregator.warm import announce_compile, uncached_kernels
        from aggregator.state import _kernels

        before = uncached_kernels()
        _kernels.moments_batch(np.zeros(2), np.zeros(2))  # compiled and written to the cache
        after = uncached_kernels()
        out = io.StringIO()
        said = announce_compile("ldp-stream serve", file=out)
        print(json.dumps({"before": before, "after": after, "said": said, "line": out.getvalue()}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.splitlines()[-1])
    for name in ("ingest.client.decode_kernel.scan", "aggregator.state._kernels.moments_batch",
                 "aggregator.state._renewable_kernel.renew_blocks",
                 "aggregator.state._kmeans_kernel.renew_kmeans_blocks"):
        assert name in res["before"], name
    assert res["before"] == sorted(res["before"])
    assert set(res["after"]) == set(res["before"]) - {"aggregator.state._kernels.moments_batch"}
    assert res["said"] is True
    assert res["line"] == ("ldp-stream serve: compiling the numba kernels (first start only; numba "
                           "caches them for the next) …\n")


def test_a_signal_during_the_check_is_not_swallowed(monkeypatch):
    # ldp-stream work turns SIGTERM during start-up into StoppedDuringStartup, raised wherever the
    # main thread is; the check (imports, about a second) must let it through, or the worker
    # carries on starting and is killed 10 s later by the demo's clean-up
    import pytest

    from aggregator import warm
    from aggregator.errors import StoppedDuringStartup

    def stopped():
        raise StoppedDuringStartup(15)

    monkeypatch.setattr(warm, "uncached_kernels", stopped)
    with pytest.raises(StoppedDuringStartup):
        warm.announce_compile("ldp-stream work")

    def no_numba():
        raise ImportError("No module named 'numba'")

    monkeypatch.setattr(warm, "uncached_kernels", no_numba)
    assert warm.announce_compile("ldp-stream work") is False
