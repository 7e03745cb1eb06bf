"""Memoized reports (ingest.device.memo, ingest.device.runtime; docs/devices.md §2–§4): α-point rounding, the
keyed streams, reports stable across restarts and distinct across devices, the ledger counting
changes, unbiasedness over many simulated devices, the secret file, and the schema keys."""

from __future__ import annotations

import copy
import os
import stat

import numpy as np
import pytest

from ingest.client.privatizer import Privatizer
from ingest.client.schema import TelemetrySchema
from ingest.device.memo import KeyedStreams, alpha_offsets, alpha_round, keyed_generator, thread_streams
from ingest.device.runtime import Device, DevicePath, DeviceSecret, memoized_fields
from ingest.errors import BudgetExceeded, ConfigError, DeviceSecretError, SchemaError

T0 = 1_800_000_000.0


def schema_dict(**privacy) -> dict:
    d = {
        "name": "memo",
        "numeric": {"zero_prob": 0.2, "scale": 0.5, "fields": [
            {"name": "a", "low": 0.0, "high": 10.0, "memoize": True, "memo_buckets": 8},
            {"name": "b", "low": -5.0, "high": 5.0, "memoize": True}]},
        "categorical": [
            {"name": "c", "categories": ["x", "y", "z", "w", "v"], "sensitive": ["x", "y"],
             "mechanism": "urap", "epsilon": 1.0, "memoize": True},
            {"name": "e", "categories": ["p", "q", "r", "s"], "sensitive": ["q", "r"], "mechanism": "urr",
             "epsilon": 1.0, "memoize": True}],
    }
    if privacy:
        d["privacy"] = {"unit": "device", "period": "1d", **privacy}
    return d


SCHEMA = TelemetrySchema.from_dict(schema_dict())
EVENT = {"a": 3.3, "b": 1.2, "c": "z", "e": "q"}


def device_path(schema: TelemetrySchema, key: bytes) -> DevicePath:
    """The privatizer's device path for a schema of unit 'event' (no ledger)."""
    cat = {c.name: schema.categorical_mechanism(c.name) for c in schema.categorical}
    return DevicePath(schema, schema.zil_mechanism(), cat, None, DeviceSecret(key), lambda: T0)


@pytest.fixture
def secret_file(tmp_path):
    return DeviceSecret.create(tmp_path / "secret").path


# ---------------------------------------------------------------------- α-point rounding
def test_alpha_rounding_is_exact_in_mean_and_adds_at_most_a_quarter_bucket_squared():
    """Over α uniform on [0, 1) (a fine midpoint grid here), the rounded value has mean x and
    variance s² f(1 − f) ≤ s²/4 (Ding, Kulkarni & Yekhanin 2017)."""
    low, high, buckets = np.array([-2.0]), np.array([3.0]), np.array([4])  # s = 1.25
    s = 1.25
    x = np.array([-2.0, -1.9, -0.75, 0.5, 1.123, 2.99, 3.0])[:, None]
    grid = (np.arange(20_000) + 0.5) / 20_000
    vals = np.stack([alpha_round(x, low, high, buckets, np.array([a]))[1][:, 0] for a in grid])
    np.testing.assert_allclose(vals.mean(axis=0), x[:, 0], atol=s / 20_000)
    f = ((x[:, 0] + 2.0) / s) % 1.0
    f[-1] = 0.0  # high is an edge
    np.testing.assert_allclose(vals.var(axis=0), s**2 * f * (1 - f), atol=s**2 / 5_000)
    assert vals.var(axis=0).max() <= s**2 / 4
    edges, _ = alpha_round(x, low, high, buckets, np.array([0.999]))
    assert edges[0, 0] == 0 and edges[-1, 0] == 4 and edges.min() >= 0 and edges.max() <= 4
    assert alpha_round(np.array([[3.0]]), low, high, buckets, np.array([0.0]))[1][0, 0] == 3.0


def test_alpha_offsets_are_uniform_over_devices_and_fixed_per_device():
    rng = np.random.default_rng(3)
    fp = SCHEMA.fingerprint
    a = np.array([alpha_offsets(rng.bytes(32), fp, ["a", "b"]) for _ in range(20_000)])
    assert a.min() >= 0 and a.max() < 1
    # each field's α is U[0, 1): mean 1/2 ± 4.5 SE (SE = sqrt(1/12 / n)), fields uncorrelated
    assert np.all(np.abs(a.mean(axis=0) - 0.5) < 4.5 * np.sqrt(1 / 12 / a.shape[0]))
    assert abs(np.corrcoef(a.T)[0, 1]) < 4.5 / np.sqrt(a.shape[0])
    key = rng.bytes(32)
    assert np.array_equal(alpha_offsets(key, fp, ["a"]), alpha_offsets(key, fp, ["a"]))


def test_the_re_keyed_stream_is_the_keyed_generator():
    """KeyedStreams (one ChaCha20 re-keyed) draws exactly what a fresh keyed_generator draws, whatever
    was drawn from it before."""
    streams = KeyedStreams()
    dirty = streams(b"k" * 32, b"other")
    dirty.integers(0, 5, 7)
    dirty.random(3)
    for parts in ([b"x"], [b"numeric", b"\x01" * 16], [b"categorical", b"c", b"\x02"]):
        a, b = keyed_generator(b"s" * 32, *parts), streams(b"s" * 32, *parts)
        for draw in (lambda g: g.integers(0, 5, 3), lambda g: g.standard_normal(4),
                     lambda g: g.standard_exponential(2), lambda g: g.random(5),
                     lambda g: g.binomial(3, 0.3, 2)):
            assert np.array_equal(draw(a), draw(b))
    assert thread_streams() is thread_streams()


def test_memoized_reports_are_pinned():
    """The memo report of a fixed secret and event, pinned: a change of numpy's or randomgen's
    streams would re-randomize every device's memoized values (docs/devices.md §5), so it must
    be noticed here first."""
    dp = device_path(SCHEMA, bytes(range(32)))
    released, cat = dp.release(np.array([[3.3, 1.2]]), {"c": np.array([2]), "e": np.array([1])},
                               np.random.default_rng(0))
    np.testing.assert_allclose(released, [[-0.681474760148352, 3.6244586444327953]], rtol=0, atol=1e-12)
    assert cat["c"].to_dense().tolist() == [[0, 0, 0, 0, 0]]
    assert cat["e"].tolist() == [2]
    np.testing.assert_allclose(alpha_offsets(bytes(range(32)), SCHEMA.fingerprint, ["a", "b"]),
                               [0.9143882738443281, 0.9880918776802377], rtol=0, atol=1e-15)


# ---------------------------------------------------------------------- through the privatizer
def test_memoized_reports_survive_restarts_and_differ_across_devices(tmp_path, secret_file):
    s = TelemetrySchema.from_dict(schema_dict(reports_per_period=10))
    first = Privatizer(s, 1, device=Device(tmp_path / "l.db", secret_file, clock=lambda: T0)).privatize(EVENT)
    again = Privatizer(s, 2, device=Device(tmp_path / "l.db", secret_file, clock=lambda: T0)).privatize(EVENT)
    assert np.array_equal(first.numeric, again.numeric)
    assert first.categorical["c"] == again.categorical["c"]
    assert np.array_equal(first.categorical["e"], again.categorical["e"])
    # another device (another secret): other reports for the same event
    other = DeviceSecret.create(tmp_path / "other").path
    others = [Privatizer(s, 1, device=Device(tmp_path / f"l{i}.db", DeviceSecret(bytes([i]) * 32),
                                             clock=lambda: T0)).privatize(EVENT) for i in range(8)]
    p = Privatizer(s, 1, device=Device(tmp_path / "lo.db", other, clock=lambda: T0))
    others.append(p.privatize(EVENT))
    assert all(not np.array_equal(o.numeric, first.numeric) for o in others)
    assert len({o.categorical["c"].to_dense().tobytes() for o in others}) > 1
    assert len({int(o.categorical["e"][0]) for o in others}) > 1


def test_the_ledger_counts_changes_not_reports(tmp_path, secret_file):
    s = TelemetrySchema.from_dict(schema_dict(reports_per_period=3))
    p = Privatizer(s, 0, device=Device(tmp_path / "l.db", secret_file, clock=lambda: T0))
    ledger = p._device.ledger
    for _ in range(5):
        p.privatize(EVENT)
    assert ledger.spent(T0) == 1
    p.privatize({**EVENT, "e": "s"})  # one categorical field changes: one unit
    p.privatize({**EVENT, "e": "s"})
    assert ledger.spent(T0) == 2
    batch = p.privatize_batch({k: [v, v] for k, v in {**EVENT, "a": 9.5}.items()})  # another bucket
    assert batch.n == 2 and ledger.spent(T0) == 3
    with pytest.raises(BudgetExceeded):
        p.privatize({**EVENT, "c": "x"})
    assert ledger.spent(T0) == 3
    p.privatize(EVENT)  # what was sent in this period is resent for free
    assert p.stats.reports == 10


def test_a_fresh_part_costs_one_unit_per_report(tmp_path, secret_file):
    """A memoized numeric block next to a categorical field without memoize: every report has a fresh
    part. Fresh parts come from the privatizer's generator; memoized parts do not depend on it."""
    d = schema_dict(reports_per_period=4)
    del d["categorical"][1]["memoize"]
    s = TelemetrySchema.from_dict(d)
    assert memoized_fields(s) == ["a", "b", "c"]
    p = Privatizer(s, 0, device=Device(tmp_path / "l.db", secret_file, clock=lambda: T0))
    b = p.privatize_batch({k: [v] * 4 for k, v in EVENT.items()})
    assert p._device.ledger.spent(T0) == 4
    assert np.all(b.numeric == b.numeric[0])
    with pytest.raises(BudgetExceeded):
        p.privatize(EVENT)


def test_memoize_needs_a_device_secret(tmp_path):
    with pytest.raises(ConfigError,
                       match=r"memoizes \['a', 'b', 'c', 'e'\]: pass device=Device\(secret=FILE\)"):
        Privatizer(SCHEMA, 0)
    with pytest.raises(ConfigError, match=r"the Device needs a secret"):
        Privatizer(SCHEMA, 0, device=Device())
    with pytest.raises(DeviceSecretError, match=r"does not exist; create one with python -c") as exc:
        Privatizer(SCHEMA, 0, device=Device(secret=tmp_path / "nope"))
    assert exc.value.path == str(tmp_path / "nope")


# ---------------------------------------------------------------------- the secret file
def test_a_created_secret_is_private_and_loads_back(tmp_path):
    s = DeviceSecret.create(tmp_path / "k")
    assert stat.S_IMODE(os.stat(s.path).st_mode) == 0o600
    assert DeviceSecret.load(s.path).key == s.key and len(s.key) == 32
    assert s.key.hex() not in repr(s)
    with pytest.raises(DeviceSecretError, match=r"exists; a secret is never overwritten"):
        DeviceSecret.create(s.path)
    assert DeviceSecret.load(s.path).key == s.key


@pytest.mark.parametrize(("content", "mode", "what"), [
    ("ab" * 32 + "\n", 0o644, r"has mode 0644: group or others may read it; run chmod 600"),
    ("ab" * 32, 0o640, r"has mode 0640"),
    ("ab" * 31 + "\n", 0o600, r"must hold 32 bytes as 64 hex digits; it holds 63 bytes"),
    ("zz" * 32, 0o600, r"must hold 32 bytes as 64 hex digits"),
    ("", 0o600, r"must hold 32 bytes as 64 hex digits; it holds 0 bytes"),
])
def test_a_bad_secret_file_is_one_error_and_nothing_is_sent(tmp_path, capsys, content, mode, what):
    path = tmp_path / "k"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(DeviceSecretError, match=what) as exc:
        Privatizer(SCHEMA, 0, device=Device(secret=path))
    assert exc.value.path == str(path) and str(exc.value).endswith("nothing was sent")
    from aggregator.cli import main

    f = tmp_path / "s.toml"
    f.write_text(SCHEMA.dumps_toml())
    events = tmp_path / "e.jsonl"
    events.write_text('{"a": 1.0, "b": 0.0, "c": "x", "e": "p"}\n')
    rc = main(["produce", "--schema", str(f), "--source", str(events), "--bootstrap-servers",
               "127.0.0.1:9", "--topic", "t", "--device-secret", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("ldp-stream produce: error: device secret file")


def test_produce_names_the_missing_secret_flag(tmp_path, capsys):
    from aggregator.cli import main

    f = tmp_path / "s.toml"
    f.write_text(SCHEMA.dumps_toml())
    events = tmp_path / "e.jsonl"
    events.write_text('{"a": 1.0, "b": 0.0, "c": "x", "e": "p"}\n')
    assert main(["produce", "--schema", str(f), "--source", str(events), "--bootstrap-servers",
                 "127.0.0.1:9", "--topic", "t"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "ldp-stream produce: error: schema 'memo' memoizes ['a', 'b', 'c', 'e']: give --device-secret FILE "
        "(the device secret that keys the memoized reports)"]


# ---------------------------------------------------------------------- the schema keys
def test_memoize_false_leaves_the_fingerprint_unchanged_and_true_changes_it():
    d = schema_dict()
    plain = copy.deepcopy(d)
    for f in plain["numeric"]["fields"] + plain["categorical"]:
        f.pop("memoize")
        f.pop("memo_buckets", None)
    off = copy.deepcopy(plain)
    for f in off["numeric"]["fields"] + off["categorical"]:
        f["memoize"] = False
    a, b = TelemetrySchema.from_dict(plain), TelemetrySchema.from_dict(off)
    assert a.fingerprint == b.fingerprint and a.to_dict() == b.to_dict()
    assert "memoize" not in a.canonical_json()
    assert SCHEMA.fingerprint != a.fingerprint
    assert SCHEMA.numeric.fields[1].memo_buckets == 32  # the default is filled in (and hashed)
    assert TelemetrySchema.loads(SCHEMA.dumps_toml()) == SCHEMA
    assert memoized_fields(a) == []


@pytest.mark.parametrize(("edit", "what"), [
    (lambda d: d["numeric"]["fields"][1].pop("memoize"),
     r"memoize must be true on every numeric field or on none .*true on \['a'\], not on \['b'\]"),
    (lambda d: d["numeric"]["fields"][0].update(memo_buckets=0),
     r"memo_buckets must be an integer in \[1, 65536\]"),
    (lambda d: d["numeric"]["fields"][0].update(memo_buckets=70_000), r"memo_buckets must be an integer"),
    (lambda d: d["numeric"]["fields"][0].update(memoize=False), r"memo_buckets needs memoize = true"),
    (lambda d: d["categorical"][0].update(memoize="yes"), r"memoize: Input should be a valid boolean"),
    (lambda d: d["categorical"][0].update(memo_buckets=4), r"memo_buckets: Extra inputs are not permitted"),
])
def test_bad_memo_keys_are_schema_errors(edit, what):
    d = schema_dict()
    edit(d)
    with pytest.raises(SchemaError, match=what):
        TelemetrySchema.from_dict(d)


# ---------------------------------------------------------------------- unbiasedness
@pytest.mark.slow
def test_memoized_reports_keep_the_mean_and_the_frequencies_unbiased():
    """20,000 simulated devices, each with its own secret, report 3 events (each value changes with
    probability 0.3 between events) through the device path (ingest.device.runtime.DevicePath). Over all
    reports: the plain mean of the released numeric values is unbiased for the raw mean, and the
    empirical frequency estimator of the uRAP and uRR fields is unbiased for the raw frequencies —
    each within 4.5 standard errors over devices (a device's reports are correlated), 11 checks:
    a correct implementation fails < 1e-4. Rounding to the nearest edge instead of α-point rounding
    would miss the mean of ``a`` by more than 8 SE (checked too), and the exact releases keep their
    rate zero_prob."""
    rng = np.random.default_rng(20_250_101)
    n, steps = 20_000, 3
    zil = SCHEMA.zil_mechanism()
    mechs = {c.name: SCHEMA.categorical_mechanism(c.name) for c in SCHEMA.categorical}
    s_a = 10.0 / 8

    def draw(size):
        # a: on the grid plus 0.3 of a bucket (nearest rounding is biased there), or anywhere
        on_grid = s_a * (rng.integers(0, 8, size) + 0.3)
        a = np.where(rng.random(size) < 0.8, on_grid, rng.beta(2, 5, size) * 10)
        b = np.clip(rng.normal(1.0, 2.0, size), -5, 5)
        return np.column_stack([a, b]), rng.choice(5, size, p=[.3, .1, .2, .25, .15]), \
            rng.choice(4, size, p=[.4, .3, .2, .1])

    x, c, e = draw(n)
    xs, cs, es = [x], [c], [e]
    for _ in range(steps - 1):
        x2, c2, e2 = draw(n)
        keep = rng.random(n) >= 0.3
        xs.append(np.where(keep[:, None], xs[-1], x2))
        cs.append(np.where(keep, cs[-1], c2))
        es.append(np.where(keep, es[-1], e2))
    X, C, E = np.stack(xs, 1), np.stack(cs, 1), np.stack(es, 1)  # (n, steps, ...)

    released = np.empty_like(X)
    bits = np.empty((n, steps, 5))
    codes = np.empty((n, steps), dtype=np.int64)
    alpha = np.empty((n, 2))
    for i in range(n):
        dp = device_path(SCHEMA, rng.bytes(32))
        r, cat = dp.release(X[i], {"c": C[i], "e": E[i]}, rng)
        released[i], bits[i], codes[i], alpha[i] = r, cat["c"].to_dense(), cat["e"], dp._alpha
    buckets = np.array([8, 32])
    first = np.array([alpha_round(X[i, :1], zil.low, zil.high, buckets, alpha[i])[1][0] for i in range(n)])
    exact = np.all(released[:, 0] == first, axis=1)  # the first report: the rounded values exactly?
    nearest = np.round(X[..., 0] / s_a) * s_a

    def check(per_report_error, what):
        d = per_report_error.reshape(n, steps, -1).mean(axis=1)  # one mean error per device
        bias, se = d.mean(axis=0), d.std(axis=0, ddof=1) / np.sqrt(n)
        assert np.all(np.abs(bias) < 4.5 * se), (what, bias / se)
        return se

    se_a = check(released - X, "numeric mean")[0]
    assert abs((nearest - X[..., 0]).mean()) > 8 * se_a  # the check above can fail

    for name, out, truth in (("c", bits, C), ("e", np.eye(4)[codes], E)):
        a, b = mechs[name]._intercept_slope()
        k = a.size
        z = (out - a) / b  # the empirical estimator, one report at a time: E[z] = onehot(x)
        check(z - np.eye(k)[truth], f"frequency of {name}")
        counts = mechs[name].counts(_reports(name, out))
        np.testing.assert_allclose(mechs[name].estimate(counts).p, z.reshape(-1, k).mean(axis=0), atol=1e-12)

    q = SCHEMA.numeric.zero_prob
    assert abs(exact.mean() - q) < 4.5 * np.sqrt(q * (1 - q) / n)


def _reports(name, out):
    from mechanisms.uldp import SparseBits

    flat = out.reshape(-1, out.shape[-1])
    return SparseBits.from_dense(flat) if name == "c" else flat.argmax(axis=1)
