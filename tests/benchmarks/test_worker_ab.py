"""Fast checks of ``benchmarks/worker_ab.py`` (no broker, no timing): the base tree it exports
and the arguments it takes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import worker_ab
from benchmarks._common import ROOT


def test_export_tree_is_the_commit(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    full = worker_ab.export_tree("HEAD", tmp_path / "base")
    assert full == head.stdout.strip()
    committed = subprocess.run(["git", "show", "HEAD:pyproject.toml"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout
    assert (tmp_path / "base" / "pyproject.toml").read_text() == committed
    assert (tmp_path / "base" / "benchmarks" / "pipeline.py").exists()


def test_the_base_config_writer_runs_in_an_exported_tree(tmp_path):
    """The snippet that writes the base tree's configs: the base's own demo pipeline with the
    shared reports topic and one group and state topic per pass (topic creation needs a broker,
    so ``ensure_topics`` is replaced here)."""
    tree = tmp_path / "base"
    worker_ab.export_tree("HEAD", tree)
    snippet = worker_ab._BASE_CONFIGS.replace("ensure_topics(load_config(p))", "load_config(p)")
    out = subprocess.run([sys.executable, "-c", snippet, str(tmp_path), "127.0.0.1:9", "t", "shared.reports",
                          ",".join(worker_ab.NOT_CLOSED), "2"], cwd=tree, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tree), "PATH": ""}, check=True)
    made = json.loads(out.stdout.strip().splitlines()[-1])
    texts = [Path(p).read_text() for p in made["configs"]]
    assert len(texts) == 2 and all('reports = "shared.reports"' in t for t in texts)
    assert 'group_id = "bench-t-b0"' in texts[0] and 'state = "bench.t.state-b1"' in texts[1]
    assert not any(f'kind = "{k}"' in t for t in texts for k in worker_ab.NOT_CLOSED)
    assert made["schema"].endswith("examples/flights.schema.toml")


def test_drop_takes_closed_or_kinds():
    assert worker_ab._drop("closed") == worker_ab.NOT_CLOSED
    assert worker_ab._drop("kmeans,gaussian_mixture") == ("kmeans", "gaussian_mixture")
    with pytest.raises(argparse.ArgumentTypeError, match="lower-case"):
        worker_ab._drop("kmeans;rm")


@pytest.mark.parametrize("bad", ["0", "-3", "x"])
def test_repeats_and_records_must_be_positive_integers(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        worker_ab.main(["--base", "HEAD", "--repeats", bad])
    assert exc.value.code == 2
    assert "--repeats" in capsys.readouterr().err
