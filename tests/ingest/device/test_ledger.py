"""The device ledger (ingest.device.ledger, docs/devices.md §1): budget per period, all-or-nothing spends,
memo tags, concurrent processes, SIGKILL mid-write, corrupt and foreign files."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from ingest.client.privatizer import Privatizer
from ingest.client.schema import TelemetrySchema
from ingest.device.ledger import APPLICATION_ID, DeviceLedger, iso_utc
from ingest.device.runtime import Device
from ingest.errors import BudgetExceeded, ConfigError, LedgerError, SchemaError

ROOT = Path(__file__).resolve().parents[3]
DAY = 86_400
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z: a fixed clock, far from a period boundary
START = 1_799_971_200  # its day


def schema(budget: int = 5, period: str = "1d", **privacy) -> TelemetrySchema:
    return TelemetrySchema.from_dict({
        "name": "dev",
        "numeric": {"zero_prob": 0.2, "scale": 0.5, "fields": [{"name": "a", "low": 0.0, "high": 1.0}]},
        "privacy": {"unit": "device", "period": period, "reports_per_period": budget, **privacy},
    })


def test_periods_are_aligned_to_the_epoch_in_utc(tmp_path):
    led = DeviceLedger(tmp_path / "l.db", schema(period="1h"))
    hour = 1_800_000_000 - 1_800_000_000 % 3600
    assert led.period_bounds(T0) == (hour, hour + 3600)
    assert DeviceLedger(tmp_path / "d.db", schema()).period_bounds(T0) == (START, START + DAY)
    assert iso_utc(START) == "2027-01-15T00:00:00Z"


def test_the_budget_is_kept_per_period_and_the_refusal_says_why(tmp_path):
    led = DeviceLedger(tmp_path / "l.db", schema(budget=3))
    assert [led.spend(T0 + i) for i in range(3)] == [1, 1, 1]
    assert led.spent(T0) == 3 and led.remaining(T0) == 0
    with pytest.raises(BudgetExceeded) as exc:
        led.spend(T0 + 10)
    e = exc.value
    assert (e.period_start, e.count, e.budget, e.needed) == ("2027-01-15T00:00:00Z", 3, 3, 1)
    assert str(e) == (f"device ledger {led.path!r}: the budget of 3 fresh reports per 1d is spent in the "
                      "period starting 2027-01-15T00:00:00Z (3 spent, 1 more needed); nothing was sent")
    assert led.spent(T0) == 3  # the refusal recorded nothing
    # the next period (UTC midnight) starts afresh; the last second of this one does not
    with pytest.raises(BudgetExceeded):
        led.spend(START + DAY - 0.001)
    assert led.spend(START + DAY) == 1
    assert led.spent(START + DAY) == 1 and led.spent(T0) == 3


def test_a_call_is_all_or_nothing(tmp_path):
    led = DeviceLedger(tmp_path / "l.db", schema(budget=5))
    assert led.spend(T0, reports=[(True, ())] * 3) == 3
    with pytest.raises(BudgetExceeded) as exc:
        led.spend(T0, reports=[(True, ())] * 3)
    assert (exc.value.count, exc.value.needed) == (3, 3)
    assert led.spent(T0) == 3
    assert led.spend(T0, reports=[(True, ())] * 2) == 2


def test_memoized_resends_cost_nothing_within_a_period(tmp_path):
    led = DeviceLedger(tmp_path / "l.db", schema(budget=3))
    a, b = b"a" * 16, b"b" * 16
    # one call: the first report with tag a costs 1, its repeat nothing, tag b 1 more
    assert led.spend(T0, reports=[(False, [a]), (False, [a]), (False, [a, b])]) == 2
    assert led.spend(T0 + 1, reports=[(False, [b, a])] * 5) == 0
    assert led.spend(T0 + 2, reports=[(True, [a])]) == 1  # a fresh part costs whatever the tags
    assert led.spent(T0) == 3
    assert led.spend(T0 + 3, reports=[(False, [a])]) == 0  # free even with the budget spent
    with pytest.raises(BudgetExceeded):
        led.spend(T0 + 4, reports=[(False, [b"c" * 16])])
    # a new period: the first send of a memoized report costs one unit again
    assert led.spend(START + DAY, reports=[(False, [a])]) == 1
    assert led.spend(START + DAY, reports=[(False, [a])]) == 0
    with sqlite3.connect(led.path) as con:  # only the current period's tags are kept
        tags = con.execute("SELECT tag, at FROM memo_tags").fetchall()
    assert tags == [(a, float(START + DAY))]


def test_a_new_ledger_is_private_and_marked_as_a_ledger(tmp_path):
    led = DeviceLedger(tmp_path / "l.db", schema())
    assert stat.S_IMODE(os.stat(led.path).st_mode) == 0o600
    with sqlite3.connect(led.path) as con:
        assert con.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    DeviceLedger(led.path, schema(budget=9))  # reopening is fine


def test_a_schema_of_unit_event_keeps_no_ledger(tmp_path):
    event = TelemetrySchema.from_dict({"name": "e", "numeric": schema().numeric.model_dump()})
    with pytest.raises(ConfigError, match=r"unit = 'event', which keeps no budget"):
        DeviceLedger(tmp_path / "l.db", event)
    with pytest.raises(ConfigError, match=r"give no device ledger"):
        Privatizer(event, 0, device=Device(tmp_path / "l.db"))
    assert not (tmp_path / "l.db").exists()


def test_a_device_schema_without_a_device_is_refused_with_what_to_pass():
    with pytest.raises(ConfigError, match=r"unit = 'device': pass device=Device\(ledger_path, secret\)"):
        Privatizer(schema(), 0)
    with pytest.raises(ConfigError, match=r"needs a ledger_path"):
        Privatizer(schema(), 0, device=Device(secret="s"))


@pytest.mark.parametrize(("content", "what"), [
    (b"\x00garbage\xff" * 500, r"is not an ldp-stream device ledger \(not an SQLite database, or corrupt"),
    (b"SQLite format 3\x00" + bytes(range(256)) * 20, r"(not an ldp-stream device ledger|is corrupt)"),
])
def test_a_corrupt_ledger_is_one_error_naming_the_path_and_nothing_is_sent(tmp_path, content, what):
    path = tmp_path / "l.db"
    path.write_bytes(content)
    with pytest.raises(LedgerError, match=what) as exc:
        Privatizer(schema(), 0, device=Device(path))
    assert exc.value.path == str(path) and str(path) in str(exc.value)
    assert str(exc.value).endswith("nothing was sent")
    assert path.read_bytes() == content  # left as it was


def test_a_foreign_database_or_a_directory_is_refused(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t (x)")
    con.close()
    with pytest.raises(LedgerError, match=r"SQLite database of something else"):
        DeviceLedger(other, schema())
    with pytest.raises(LedgerError, match=r"is a directory"):
        DeviceLedger(tmp_path, schema())
    with pytest.raises(LedgerError, match=r"cannot be opened: No such file or directory"):
        DeviceLedger(tmp_path / "no" / "l.db", schema())


@pytest.mark.parametrize("privacy", [{"reports_per_period": -1}, {"reports_per_period": 10**9},
                                     {"reports_per_period": 0}, {"period": "1s"}, {"period": "400d"}])
def test_a_negative_or_absurd_budget_is_a_schema_error(tmp_path, capsys, privacy):
    """The [privacy] checks of the schema reach the privatizer's user and the CLI as one line."""
    full = {"reports_per_period": 5, "period": "1d", **privacy}
    with pytest.raises(SchemaError, match=r"privacy\.(reports_per_period|period) must be"):
        schema(**full)
    from aggregator.cli import main

    f = tmp_path / "s.toml"
    f.write_text('name = "dev"\n[numeric]\nzero_prob = 0.2\nscale = 0.5\n[[numeric.fields]]\nname = "a"\n'
                 'low = 0.0\nhigh = 1.0\n[privacy]\nunit = "device"\n'
                 f'period = "{full["period"]}"\nreports_per_period = {full["reports_per_period"]}\n')
    events = tmp_path / "e.jsonl"
    events.write_text('{"a": 0.5}\n')
    rc = main(["produce", "--schema", str(f), "--source", str(events), "--bootstrap-servers", "127.0.0.1:9",
               "--topic", "t", "--device-ledger", str(tmp_path / "l.db")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "must be" in err[0], err
    assert not (tmp_path / "l.db").exists()


def test_produce_names_the_missing_flag_and_stops_at_the_budget(tmp_path, capsys):
    """`ldp-stream produce`: a device schema without --device-ledger, and a source with more fresh
    reports than the budget, are one line each (the first piece is privatized before connecting)."""
    from aggregator.cli import main

    f = tmp_path / "s.toml"
    f.write_text(schema(budget=3).dumps_toml())
    events = tmp_path / "e.jsonl"
    events.write_text("".join(f'{{"a": {v}}}\n' for v in (0.1, 0.2, 0.3, 0.4, 0.5)))
    base = ["produce", "--schema", str(f), "--source", str(events), "--bootstrap-servers", "127.0.0.1:9",
            "--topic", "t"]
    assert main(base) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "ldp-stream produce: error: schema 'dev' has [privacy] unit = 'device': give --device-ledger PATH "
        "(the device's budget ledger)"]
    ledger = tmp_path / "l.db"
    assert main([*base, "--device-ledger", str(ledger)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the budget of 3 fresh reports per 1d is spent" in err[0], err
    assert DeviceLedger(ledger, schema(budget=3)).spent() == 3


def test_produce_sends_the_rows_that_fit_before_the_refusal(tmp_path):
    """The CLI's device path: a piece the budget refuses is retried row by row; the skipped-row
    counts are those of one pass."""
    from aggregator.cli.produce import _privatize_pieces

    s = schema(budget=4)
    p = Privatizer(s, 0, device=Device(tmp_path / "l.db", clock=lambda: T0))
    piece = {"a": np.array([0.1, np.nan, 0.2, 0.3, 0.4, 0.5, 0.6])}
    out = []
    with pytest.raises(BudgetExceeded):
        for batch in _privatize_pieces(p, [piece], device=True):
            out.append(batch.n)
    assert out == [1, 0, 1, 1, 1]  # 4 reports, the missing value skipped once
    assert dict(p.stats.skipped) == {"missing": 1}
    assert p._device.ledger.spent(T0) == 4


# ---------------------------------------------------------------------- other processes
def _script(body: str) -> str:
    return textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from ingest.client.schema import TelemetrySchema
        schema = TelemetrySchema.loads(open(sys.argv[1]).read())
    """) + textwrap.dedent(body)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def test_four_processes_never_spend_more_than_the_budget(tmp_path):
    """4 processes privatize 30 fresh events each, concurrently, for one device with a budget of 50:
    exactly 50 reports are handed out and recorded."""
    budget = 50
    f = tmp_path / "s.toml"
    f.write_text(schema(budget=budget).dumps_toml())
    go = tmp_path / "go"
    code = _script(f"""
        from ingest.device.runtime import Device
        from ingest.errors import BudgetExceeded
        from ingest.client.privatizer import Privatizer
        p = Privatizer(schema, None, device=Device(sys.argv[2], clock=lambda: {T0}))
        print("ready", flush=True)
        while not __import__("os").path.exists(sys.argv[3]):
            time.sleep(0.005)
        sent = refused = 0
        for i in range(30):
            try:
                p.privatize({{"a": i / 30}})
                sent += 1
            except BudgetExceeded:
                refused += 1
        print(sent, refused, flush=True)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(f), str(tmp_path / "l.db"), str(go)],
                              stdout=subprocess.PIPE, text=True, env=_env()) for _ in range(4)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        results = [tuple(map(int, p.communicate(timeout=120)[0].split())) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()
    assert all(p.returncode == 0 for p in procs)
    assert sum(s for s, _ in results) == budget
    assert sum(r for _, r in results) == 4 * 30 - budget
    assert sum(1 for s, _ in results if s) >= 2  # the processes did overlap
    assert DeviceLedger(tmp_path / "l.db", schema(budget=budget)).spent(T0) == budget


def test_a_process_killed_mid_write_loses_no_committed_spend(tmp_path):
    """A child spends in a tight loop and prints each spend after its commit; SIGKILL at a random
    moment: the file opens, passes quick_check, and holds every printed spend (at most one more:
    committed, not yet printed)."""
    f = tmp_path / "s.toml"
    f.write_text(schema(budget=100_000).dumps_toml())
    path = tmp_path / "l.db"
    code = _script(f"""
        from ingest.device.ledger import DeviceLedger
        led = DeviceLedger(sys.argv[2], schema)
        i = led.spent({T0})
        print("start", i, flush=True)
        while True:
            led.spend({T0}, reports=[(True, [b"t%d" % i]), (False, [b"t%d" % i])])
            i += 1
            print(i, flush=True)
    """)
    rng = np.random.default_rng(7)
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", code, str(f), str(path)], stdout=subprocess.PIPE,
                                 text=True, env=_env())
        try:
            first = int(child.stdout.readline().split()[1])
            target = first + int(rng.integers(20, 60))
            last = first
            while last < target:
                last = int(child.stdout.readline())
            time.sleep(float(rng.uniform(0, 0.02)))
            os.kill(child.pid, signal.SIGKILL)
            rest = child.stdout.read().split()
            last = int(rest[-1]) if rest else last
        finally:
            child.kill()
            child.wait()
            child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        led = DeviceLedger(path, schema(budget=100_000))  # opens, passes quick_check
        assert last <= led.spent(T0) <= last + 1
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
