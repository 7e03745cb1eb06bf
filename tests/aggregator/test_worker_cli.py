"""``ldp-stream work`` configuration errors: one readable line and exit status 2 (no broker)."""

from __future__ import annotations

import pytest

from aggregator.cli import main
from tests.integration import pipeline_support as ps

BASE = f"""
[pipeline]
name = "flights"
schema = "{ps.SCHEMA}"

[kafka]
bootstrap_servers = "127.0.0.1:9"
"""

CASES = {
    "unknown_field": ("""
[[queries]]
kind = "mean"
name = "m"
field = "arr_delay"
colour = "blue"
""", "colour"),
    "unknown_section_key": ("""
[worker]
group_id = "g"
checkpoint_every = 3
""", "checkpoint_every"),
    "sl_with_non_smooth_loss": ("""
[[queries]]
kind = "custom"
name = "median"
loss = "mechanisms.losses:CheckLoss"
fields = ["arr_delay"]
estimator = "sl"
""", "smooth"),
    "unimportable_custom_loss": ("""
[[queries]]
kind = "custom"
name = "c"
loss = "no_such_module_xyz:loss"
fields = ["arr_delay"]
""", "no_such_module_xyz"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_errors_exit_2_with_one_line(tmp_path, capsys, case):
    extra, needle = CASES[case]
    path = tmp_path / "bad.toml"
    path.write_text(BASE + extra)
    assert main(["work", "--config", str(path), "--exit-when-idle", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("ldp-stream work: error:") and needle in err
    assert "Traceback" not in err


def test_missing_config_file_exit_2(tmp_path, capsys):
    assert main(["work", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--max-reports", "0"], ["--exit-when-idle", "-1"], ["--group-id", ""],
                                  ["--group-id", "  "]])
def test_bad_arguments_exit_2(tmp_path, capsys, args):
    path = tmp_path / "ok.toml"
    path.write_text(BASE)
    assert main(["work", "--config", str(path), *args]) == 2
    assert "must be" in capsys.readouterr().err


def test_max_poll_records_help_states_the_workers_default(capsys):
    from aggregator.worker import DEFAULT_MAX_POLL_RECORDS

    with pytest.raises(SystemExit):
        main(["work", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"default {DEFAULT_MAX_POLL_RECORDS} = aggregator.worker.DEFAULT_MAX_POLL_RECORDS" in help_text


@pytest.mark.parametrize("failed, status", [(False, 0), (True, 1)])
def test_work_exits_1_when_the_final_checkpoint_failed(tmp_path, capsys, monkeypatch, failed, status):
    """A worker whose final checkpoint failed exits with status 1 and one line on stderr, so that
    a supervisor does not take the stop for a clean one."""
    import aggregator.worker as worker_mod

    class Worker:
        def __init__(self):
            self.owned = {}
            self.owned_at_stop = []
            self.final_checkpoint_failed = failed

        def run(self, max_reports=None, exit_when_idle=None):
            return 7

    monkeypatch.setattr(worker_mod, "worker_from_config", lambda cfg, **kw: Worker())
    monkeypatch.setattr(worker_mod, "ensure_topics", lambda cfg: None)
    cfg = tmp_path / "p.toml"
    cfg.write_text(BASE + '''
[[queries]]
kind = "mean"
name = "m"
field = "arr_delay"
''')
    assert main(["work", "--config", str(cfg), "--metrics-port", "0"]) == status
    out, err = capsys.readouterr()
    assert "processed 7 reports" in out
    assert ("final checkpoint failed" in err) is failed
    lines = err.strip().splitlines()  # the start-up line, then the failure's line if any
    assert lines[0].startswith("ldp-stream work: group ") and len(lines) == (2 if failed else 1), lines


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_during_start_up_stops_with_one_line_and_status_0(tmp_path, capsys, monkeypatch, signum):
    """A signal before the worker consumes (here: while the topics are set up) stops it with one
    line and status 0 (not silently with status 143), and the process's handlers are restored
    afterwards."""
    import os
    import signal
    import time

    import aggregator.worker as worker_mod

    sig = getattr(signal, signum)

    def ensure_topics(cfg):
        os.kill(os.getpid(), sig)
        time.sleep(5)  # interrupted by the handler's exception
        raise AssertionError("the signal did not stop start-up")

    monkeypatch.setattr(worker_mod, "ensure_topics", ensure_topics)
    cfg = tmp_path / "p.toml"
    cfg.write_text(BASE + '[[queries]]\nkind = "mean"\nname = "m"\nfield = "arr_delay"\n')
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert main(["work", "--config", str(cfg), "--metrics-port", "0"]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    want = f"ldp-stream work: stopped by {signum} during start-up; nothing was consumed"
    assert err.strip().splitlines() == [want]
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_once_consuming_asks_the_worker_to_stop(tmp_path, capsys, monkeypatch):
    import os
    import signal

    import aggregator.worker as worker_mod

    class Worker:
        def __init__(self):
            self.owned = {}
            self.owned_at_stop = []
            self.final_checkpoint_failed = False
            self.stopped = False

        def stop(self):
            self.stopped = True

        def run(self, max_reports=None, exit_when_idle=None):
            os.kill(os.getpid(), signal.SIGTERM)  # handled by stop(), not an exception
            return 3 if self.stopped else 0

    monkeypatch.setattr(worker_mod, "worker_from_config", lambda cfg, **kw: Worker())
    monkeypatch.setattr(worker_mod, "ensure_topics", lambda cfg: None)
    cfg = tmp_path / "p.toml"
    cfg.write_text(BASE + '[[queries]]\nkind = "mean"\nname = "m"\nfield = "arr_delay"\n')
    assert main(["work", "--config", str(cfg), "--metrics-port", "0"]) == 0
    out, err = capsys.readouterr()
    assert "processed 3 reports" in out
    # one start-up line (what it consumes, how to stop it), nothing else: no traceback
    assert err.splitlines() == ["ldp-stream work: group 'ldp-stream', reports topic 'ldp.reports'; "
                                "Ctrl-C or SIGTERM for a final checkpoint and a clean leave"], err
