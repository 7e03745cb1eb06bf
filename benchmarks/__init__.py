"""Benchmarks and paper reproductions (not part of the installed package).

Each module runs as ``python -m benchmarks.<name>``, prints a table and writes its numbers to
``benchmarks/results/<name>.json``; see ``docs/benchmarks.md`` and ``docs/reproductions.md``.
"""
