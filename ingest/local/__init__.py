"""Running things on this machine: the embedded Tansu broker (demo, tests, ``ldp-stream broker``)
and child-process helpers (free ports, parent-death signal, stopping)."""
