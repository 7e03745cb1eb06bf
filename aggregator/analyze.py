"""Batch re-analysis of the stored reports (docs/mechanisms.md §4).

Reports are already private, so the reports topic can be replayed and re-analysed any number of
times, with any loss, at no further privacy cost. :func:`replay` reads the reports topic from the
beginning up to its end (:func:`ingest.kafka.clients.read_to_end`), decodes every record and draws
``X̃₂`` with the same per-record seed as the worker
(:func:`aggregator.state.doubling_draws`), so batch and streaming see identical ``(X̃₁, X̃₂)``.
:func:`analyze_query` and :func:`analyze_loss` then run the exact batch fits of
:mod:`mechanisms.estimation` (closed forms or scipy, plug-in sandwich CI); :func:`analyze_windows`
runs them per event-time window.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from aggregator.errors import AggregatorError, ConfigError, LdpStreamError
from ingest.client.batch import ReportBatch, concat_batches
from ingest.errors import DecodeError
from ingest.kafka.clients import read_to_end, reader_client
from ingest.kafka.settings import KafkaSettings

__all__ = ["Replay", "analyze_loss", "analyze_query", "analyze_windows", "replay", "replay_records"]

log = logging.getLogger(__name__)


@dataclass
class Replay:
    """All decodable reports of the reports topic.

    Attributes
    ----------
    batch : ReportBatch or None
        Every report, partitions in ascending order, offsets ascending (``None`` if empty).
    x2 : ndarray (n, d)
        Doubled numeric block, drawn per record with the worker's seed.
        ``batch.event_time`` holds every report's event time: the record's own, or its Kafka
        timestamp (whole seconds) for a schema without a time column.
    records : int
        Records decoded.
    skipped : dict str → int
        Undecodable records by reason (they are in the dead-letter topic too).
    """

    batch: ReportBatch | None
    x2: np.ndarray
    records: int = 0
    skipped: dict = field(default_factory=dict)

    def rows(self, mask: np.ndarray) -> Replay:
        """The reports where ``mask`` (bool, shape (n,)) holds, as a Replay (for one window)."""
        from aggregator.state.windowed import split_rows

        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return Replay(None, np.empty((0, self.x2.shape[1])), 0, {})
        return Replay(split_rows(self.batch, idx), self.x2[idx], self.records, {})

    @property
    def n(self) -> int:
        """Number of reports."""
        return 0 if self.batch is None else self.batch.n


def replay_records(runtime, values: Sequence[bytes | None], timestamps: Sequence[int] | None = None,
                   max_event_time_skew_s: float | None = None) -> Replay:
    """Decode record values and draw ``X̃₂`` per record (no Kafka).

    Parameters
    ----------
    runtime : aggregator.plan.PipelineRuntime
    values : sequence of bytes or None
        Record values in the order to concatenate; ``None`` (a record without a value) is
        skipped and counted under ``"empty"``, the reason the worker dead-letters it with.
    timestamps : sequence of int or None
        Kafka timestamps of the records (milliseconds): the event time of their reports when
        the schema has no time column (``None``: 0).
    max_event_time_skew_s : float or None
        Skip (and count under ``"event_time_skew"``) a record holding an event time more than
        this many seconds ahead of its timestamp, as the workers dead-letter it (None: keep all).

    Returns
    -------
    Replay
    """
    from ingest.client.batch import with_event_time

    batches, x2s, skipped = [], [], {}
    stamps = [0] * len(values) if timestamps is None else timestamps
    for v, ts in zip(values, stamps, strict=True):
        if v is None:
            skipped["empty"] = skipped.get("empty", 0) + 1
            continue
        try:
            b = runtime.decode(v)
        except DecodeError as exc:
            skipped[exc.reason] = skipped.get(exc.reason, 0) + 1
            continue
        if b.fingerprint != runtime.fingerprint or b.n == 0:
            continue
        ts_s = max(0, int(ts or 0)) // 1000
        if b.event_time is None:
            b = with_event_time(b, np.full(b.n, ts_s, dtype=np.int64))
        elif max_event_time_skew_s is not None and int(b.event_time.max()) > ts_s + max_event_time_skew_s:
            skipped["event_time_skew"] = skipped.get("event_time_skew", 0) + 1
            continue
        batches.append(b)
        x2s.append(runtime.double(b, v))
    if not batches:
        return Replay(None, np.empty((0, 0)), 0, skipped)
    return Replay(concat_batches(batches), np.concatenate(x2s, axis=0), len(batches), skipped)


def replay(runtime, settings: KafkaSettings, topic: str, timeout_s: float = 120.0,
           max_event_time_skew_s: float | None = None) -> Replay:
    """Read ``topic`` from the beginning to its current end and decode every record.

    Parameters
    ----------
    runtime : aggregator.plan.PipelineRuntime
    settings : ingest.kafka.settings.KafkaSettings
        Connection settings (``bootstrap_servers``, security) of the reading consumer.
    topic : str
        The reports topic.
    timeout_s : float
        Give up after this many seconds (> 0).
    max_event_time_skew_s : float or None
        As in :func:`replay_records`.

    Raises
    ------
    AggregatorError
        If the topic does not exist or its end is not reached in time.
    """
    from kafka import TopicPartition

    if not timeout_s > 0:
        raise ConfigError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    consumer = reader_client(settings)
    try:
        deadline = time.monotonic() + timeout_s
        parts = consumer.partitions_for_topic(topic)
        while not parts and time.monotonic() < deadline:
            time.sleep(0.1)
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise AggregatorError(f"reports topic {topic!r} does not exist")
        tps = sorted(TopicPartition(topic, p) for p in parts)
        consumer.assign(tps)
        for tp in tps:
            consumer.seek_to_beginning(tp)
        values: dict[int, list[bytes]] = {tp.partition: [] for tp in tps}
        stamps: dict[int, list[int]] = {tp.partition: [] for tp in tps}

        def collect(tp, recs) -> None:
            values[tp.partition].extend(r.value for r in recs)  # None: counted "empty"
            stamps[tp.partition].extend(r.timestamp for r in recs)

        read_to_end(consumer, tps, collect, timeout_s=max(0.0, deadline - time.monotonic()),
                    poll_timeout_ms=200, on_timeout=lambda: AggregatorError(
                        f"could not read {topic!r} to its end in {timeout_s:g} s"))
    finally:
        consumer.close()
    ordered = [v for p in sorted(values) for v in values[p]]
    times = [t for p in sorted(stamps) for t in stamps[p]]
    return replay_records(runtime, ordered, times, max_event_time_skew_s)


def analyze_windows(rep: Replay, runtime, query, window=None) -> dict:
    """Batch re-analysis of one query per event-time window (docs/windows.md §5).

    Every report with event time in ``[start, start + size)`` enters the window's fit
    (:func:`analyze_query` on those reports; no report is late in batch).

    Parameters
    ----------
    rep : Replay
    runtime : aggregator.plan.PipelineRuntime
    query : Query
    window : aggregator.queries.WindowSpec or None
        The windows (``None``: the query's own ``window``).

    Returns
    -------
    dict
        ``{"query", "window": {"size_s", "hop_s", "grace_s", "retention_s"}, "windows": [{"start",
        "end", "start_s", "end_s", "n", "params", "value", "stderr", "ci_low", "ci_high", …} or
        {"start", "end", …, "error"}]}`` ordered by start; windows without a report are left out.

    Raises
    ------
    ConfigError
        If neither the query nor ``window`` gives windows, or there are no reports.
    """
    from aggregator.state.windowed import window_starts
    from aggregator.windows import window_meta
    from ingest.client.event_time import floor_to, iso_utc

    spec = window if window is not None else query.window
    if spec is None:
        raise ConfigError(f"query {query.name!r} has no window; pass one (analyze --window 1d)")
    if rep.n == 0:
        raise ConfigError("no reports to analyse in the reports topic")
    plain = query.model_copy(update={"window": None})
    size, hop = spec.size_s, spec.hop_s
    t = rep.batch.event_time
    rows = []
    for start in window_starts(np.unique(floor_to(t, hop)), size, hop):
        mask = (t >= start) & (t < start + size)
        row = {"start": iso_utc(start), "end": iso_utc(start + size), "start_s": start,
               "end_s": start + size}
        try:
            row.update(analyze_query(rep.rows(mask), runtime, plain))
        except (LdpStreamError, ValueError, ArithmeticError) as exc:  # one window, not the others
            row.update(query=query.name, n=int(mask.sum()), error=str(exc))
        rows.append(row)
    return {"query": query.name, "window": window_meta(query.model_copy(update={"window": spec})),
            "windows": rows}


def _columns(runtime, names: Sequence[str], what: str) -> np.ndarray:
    numeric = list(runtime.schema.numeric_names)
    idx = []
    for name in names:
        if name not in numeric:
            raise ConfigError(f"{what}: {name!r} is not a numeric field of the schema (have {numeric})")
        idx.append(numeric.index(name))
    return np.asarray(idx, dtype=int)


def _result(name: str, method: str, params, est, level: float) -> dict:
    lo, hi = est.ci(level)
    return {"query": name, "estimator": method, "n": int(est.n), "level": level, "params": list(params),
            "value": est.theta.tolist(), "stderr": est.stderr.tolist(), "ci_low": lo.tolist(),
            "ci_high": hi.tolist(), "converged": bool(est.converged), "source": "batch m_estimate"}


def analyze_loss(rep: Replay, runtime, loss, fields: Sequence[str], *, method: str = "dr",
                 name: str = "custom", params: Sequence[str] | None = None, level: float = 0.95) -> dict:
    """Batch M-estimate of an arbitrary loss over the replayed reports.

    Parameters
    ----------
    rep : Replay
    runtime : aggregator.plan.PipelineRuntime
    loss : mechanisms.losses.Loss
        Record columns are ``fields`` in the given order.
    fields : sequence of str
        Numeric fields of the schema (all ZIL-noised).
    method : {"dr", "sdr", "sl", "naive"}
    name : str
        Label of the result.
    params : sequence of str or None
        Names of the parameters (default ``theta0, theta1, …``).
    level : float
        Confidence level in (0, 1).

    Returns
    -------
    dict
        ``query, estimator, n, level, params, value, stderr, ci_low, ci_high, converged``.

    Raises
    ------
    ConfigError
        Unknown field or no reports.
    mechanisms.errors.ParameterError
        From :func:`mechanisms.estimation.m_estimate` (e.g. SL/SDR on a non-smooth loss).
    """
    from mechanisms.estimation import m_estimate

    if rep.n == 0:
        raise ConfigError("no reports to analyse in the reports topic")
    idx = _columns(runtime, fields, "fields")
    zil = runtime.schema.zil_mechanism()
    est = m_estimate(loss, rep.batch.numeric[:, idx], rep.x2[:, idx], zero_prob=zil.zero_prob,
                     scale=zil.coord_scale[idx], method=method, level=level)
    names = list(params) if params else [f"theta{i}" for i in range(est.theta.size)]
    if len(names) != est.theta.size:
        raise ConfigError(f"params: {len(names)} names for {est.theta.size} parameters")
    return _result(name, method, names, est, level)


def analyze_query(rep: Replay, runtime, query) -> dict:
    """Batch re-analysis of one configured query over the replayed reports.

    ``mean`` (squared loss), ``linear_regression``, ``quantile_regression`` and ``custom`` run
    :func:`mechanisms.estimation.m_estimate` with the query's estimator; ``variance`` and
    ``quantiles`` use :func:`mechanisms.estimation.variance_estimate` /
    :func:`mechanisms.estimation.dr_quantile`; ``logistic_regression`` runs the exact fit of the
    logistic loss with the label ``1{label > threshold}`` (or the noised 0/1 label field itself);
    ``frequency`` folds the replayed batch into the query's state (its estimator is already the
    batch one for counts); ``kmeans`` and ``gaussian_mixture`` run the batch fits of
    :mod:`mechanisms.mixtures.fit`.

    Returns
    -------
    dict
        As :func:`analyze_loss`, with ``source`` naming the method used.

    Raises
    ------
    ConfigError
        If there are no reports.
    """
    from mechanisms import losses
    from mechanisms.estimation import dr_quantile, variance_estimate

    if rep.n == 0:
        raise ConfigError("no reports to analyse in the reports topic")
    kind, name, level = query.kind, query.name, float(query.level)
    if kind == "mean":
        return analyze_loss(rep, runtime, losses.SquaredLoss(1, noised=(0,)), [query.field],
                            method=query.estimator, name=name, params=["mean"], level=level)
    if kind in ("linear_regression", "quantile_regression", "logistic_regression"):
        cols = [*query.covariates, query.label if kind == "logistic_regression" else query.response]
        k = len(query.covariates)
        common = dict(intercept=query.intercept, noised=tuple(range(k + 1)))
        if kind == "linear_regression":
            loss = losses.LinearRegressionLoss(**common)
        elif kind == "quantile_regression":
            loss = losses.QuantileRegressionLoss(tau=query.tau, **common)
        elif query.threshold is not None:
            # y = 1{label > threshold} is a function of a noised field: the exact DR fit
            t = float(query.threshold)
            loss = losses.LogisticLoss(covariates=tuple(range(k)),
                                       label=lambda x: (x[:, k] > t).astype(float), **common)
        else:  # the noised 0/1 label field enters the loss linearly
            loss = losses.NoisedLabelLogisticLoss(covariates=tuple(range(k)), **common)
        params = (["intercept"] if query.intercept else []) + list(query.covariates)
        return analyze_loss(rep, runtime, loss, cols, method=query.estimator, name=name, params=params,
                            level=level)
    if kind == "custom":
        loss = runtime.losses[name]  # resolved once, when the config was loaded
        return analyze_loss(rep, runtime, loss, list(query.fields), method=query.estimator, name=name,
                            params=query.params, level=level)
    zil = runtime.schema.zil_mechanism() if runtime.schema.numeric_names else None
    if kind in ("kmeans", "gaussian_mixture"):
        return _analyze_mixture(rep, runtime, query, zil)
    if kind == "variance":
        j = _columns(runtime, [query.field], "field")
        est = variance_estimate(rep.batch.numeric[:, j[0]], zero_prob=zil.zero_prob,
                                scale=zil.coord_scale[j[0]], level=level)
        return _result(name, "sdr", ["variance"], est, level)
    if kind == "quantiles":
        j = _columns(runtime, [query.field], "field")
        est = dr_quantile(rep.batch.numeric[:, j[0]], rep.x2[:, j[0]], np.asarray(query.q), zil.zero_prob,
                          level=level)
        return _result(name, "dr", [f"q{q:g}" for q in query.q], est, level)
    from aggregator.state import build_state

    st = build_state(query, runtime.schema, loss=runtime.losses.get(name))  # no user code imported here
    st.update(rep.batch, rep.x2)
    out = st.estimate().to_dict()
    out["source"] = "state over the replayed batch"
    return out


def _analyze_mixture(rep: Replay, runtime, query, zil) -> dict:
    """Batch k-means / Gaussian mixture of the replayed reports (:mod:`mechanisms.mixtures.fit`),
    with ``notes`` naming the components the data do not determine."""
    from mechanisms.mixtures import fit_gaussian_mixture, fit_kmeans

    j = _columns(runtime, query.fields, "fields")
    x1 = rep.batch.numeric[:, j]
    common = dict(k=query.k, low=zil.low[j], high=zil.high[j], zero_prob=zil.zero_prob,
                  method=query.estimator, fields=query.fields, level=float(query.level))
    if query.kind == "kmeans":
        fit = fit_kmeans(x1, rep.x2[:, j], **common)
    else:
        fit = fit_gaussian_mixture(x1, rep.x2[:, j] if query.estimator == "dr" else None,
                                   scale=zil.coord_scale[j], **common)
    lo, hi = fit.ci()
    out = {"query": query.name, "estimator": query.estimator, "n": fit.n, "level": fit.level,
           "params": list(fit.params), "value": fit.value.tolist(),
           "stderr": [float(v) if np.isfinite(v) else None for v in fit.stderr],
           "ci_low": [float(v) if np.isfinite(v) else None for v in lo],
           "ci_high": [float(v) if np.isfinite(v) else None for v in hi],
           "converged": fit.converged, "source": f"batch {query.kind} fit"}
    if fit.unidentified:
        out["notes"] = [f"component {c}: {why}" for c, why in sorted(fit.unidentified.items())]
    return out
