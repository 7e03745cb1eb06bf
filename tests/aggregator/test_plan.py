"""The query plan (aggregator.plan.PipelineRuntime): built from a typed PipelineConfig, custom
losses resolved once, and usable by serve and analyze without the worker loop."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from aggregator.config import PipelineConfig
from aggregator.plan import PipelineRuntime
from tests.integration import pipeline_support as ps

CUSTOM = (f'[pipeline]\nname = "flights"\nschema = "{ps.SCHEMA}"\n'
          '[[queries]]\nkind = "mean"\nname = "m"\nfield = "arr_delay"\n'
          '[[queries]]\nkind = "custom"\nname = "lin"\nfields = ["dep_delay", "arr_delay"]\n'
          'loss = "tests.aggregator.test_renewable_guard:_flights_linreg"\n')


def test_the_plan_holds_the_configs_names_queries_and_resolved_losses():
    cfg = PipelineConfig.from_dict(tomllib.loads(CUSTOM))
    plan = PipelineRuntime.from_config(cfg)
    assert plan.name == "flights" and plan.query_names == ("m", "lin")
    assert plan.fingerprint == bytes(cfg.telemetry_schema.fingerprint)
    assert set(plan.losses) == {"lin"} and plan.losses["lin"] is cfg.losses["lin"]


def test_building_and_restoring_states_imports_no_user_code(monkeypatch):
    """The custom loss is imported once, when the config is loaded; new states and restored
    checkpoints reuse that object (no import, no change of sys.path)."""
    from aggregator import custom_loss

    cfg = PipelineConfig.from_dict(tomllib.loads(CUSTOM))
    plan = PipelineRuntime.from_config(cfg)
    records = ps.make_records(plan.schema, n_records=3, per_record=50, seed=2)
    states = plan.new_states()
    for r in records:
        b = plan.decode(r)
        for st in states.values():
            st.update(b, plan.double(b, r))
    blobs = {name: st.to_bytes() for name, st in states.items()}

    def refuse(*args, **kwargs):
        raise AssertionError("user code imported")

    monkeypatch.setattr(custom_loss, "load_custom_loss", refuse)
    path = list(sys.path)
    fresh = plan.new_states()
    restored = {name: plan.restore_state(name, blob) for name, blob in blobs.items()}
    assert sys.path == path
    assert {n: st.to_bytes() for n, st in restored.items()} == blobs
    assert fresh["lin"].loss is restored["lin"].loss is plan.losses["lin"]


def test_analyze_imports_no_user_code(monkeypatch):
    """``analyze`` fits the custom query with the loss resolved when the config was loaded, and
    builds a counting query's state with it too: no second import, sys.path unchanged."""
    from aggregator import custom_loss
    from aggregator.analyze import analyze_query, replay_records

    text = CUSTOM + '[[queries]]\nkind = "frequency"\nname = "f"\nfield = "carrier"\n'
    cfg = PipelineConfig.from_dict(tomllib.loads(text))
    plan = PipelineRuntime.from_config(cfg)
    rep = replay_records(plan, ps.make_records(plan.schema, n_records=4, per_record=200, seed=5))

    def refuse(*args, **kwargs):
        raise AssertionError("user code imported")

    monkeypatch.setattr(custom_loss, "load_custom_loss", refuse)
    path = list(sys.path)
    for name in ("lin", "f"):
        assert analyze_query(rep, plan, cfg.query(name))["n"] == 800
    assert sys.path == path


@pytest.mark.parametrize("module", ["aggregator.cli.serve", "aggregator.cli.analyze"])
def test_serve_and_analyze_do_not_import_the_worker_loop(module):
    """What ``serve`` and ``analyze`` import to run (the plan, checkpoints, topics, clients) does
    not pull in ``aggregator.worker``."""
    code = (f"import sys, {module}, aggregator.plan, aggregator.topics, aggregator.checkpoint, "
            "aggregator.serve, aggregator.analyze, ingest.kafka.clients\n"
            "print([m for m in sys.modules if m.startswith('aggregator.worker')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
