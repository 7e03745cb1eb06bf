"""Tests of ``ldp-stream privacy`` (aggregator/cli/privacy.py) through ``aggregator.cli.main``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aggregator.cli import main
from mechanisms.privacy import calibrate_c, delta_for_epsilon, zil_guarantee

PAPER = ["--epsilon", "0.8", "--delta", "0.17", "--zero-prob", "0.05"]


def test_calibrate_text(capsys):
    assert main(["privacy", "calibrate", *PAPER, "--diameter", "1"]) == 0
    out = capsys.readouterr().out
    assert "c = 0.502521" in out
    assert "scale = 1.989965" in out
    assert "exactly" in out
    assert "is (0.8, 0.17)-DP" in out


def test_calibrate_text_shows_delta_as_given(capsys):
    # :g formatting printed δ = 0.99999999 as "(0.8, 1)-DP"
    assert main(["privacy", "calibrate", "--epsilon", "0.8", "--delta", "0.99999999", "--zero-prob",
                 "0.05", "--diameter", "1"]) == 0
    assert "is (0.8, 0.99999999)-DP" in capsys.readouterr().out


def test_calibrate_json(capsys):
    assert main(["privacy", "calibrate", *PAPER, "--diameter", "2", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert abs(obj["c"] - 0.5025212930596765) < 1e-6
    assert obj["scale"] == pytest.approx(2.0 / obj["c"], rel=1e-12)
    assert obj["delta_tilde_check"] == pytest.approx(0.17, abs=1e-10)
    assert obj["dim"] is None and obj["accounting"] == "beta_c_bound"


def test_calibrate_dim1_exact(capsys):
    """d = 1: (zero_prob, scale) = (0.1, 0.94) is (1.504, 0.1)-DP, so calibrating to that gives 0.94."""
    argv = ["privacy", "calibrate", "--epsilon", "1.5044825131628672", "--delta", "0.1000000001",
            "--zero-prob", "0.1", "--diameter", "1", "--dim", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["scale"] == pytest.approx(0.94, rel=1e-6)
    assert obj["accounting"] == "exact_laplace"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["privacy", "calibrate", "--epsilon", "0.8", "--delta", "0.05", "--zero-prob", "0.05",
          "--diameter", "1"], "zero_prob"),
        (["privacy", "calibrate", "--epsilon", "0.8", "--delta", "0.2", "--zero-prob", "1.5",
          "--diameter", "1"], "zero_prob must be in (0, 1)"),
        (["privacy", "calibrate", *PAPER, "--diameter", "-1"], "diameter"),
        (["privacy", "calibrate", *PAPER, "--diameter", "1", "--dim", "0"], "dim"),
        (["privacy", "calibrate", "--epsilon", "-1", "--delta", "0.2", "--zero-prob", "0.05",
          "--diameter", "1"], "epsilon"),
        (["privacy", "curve", "--c", "0", "--zero-prob", "0.05", "--png", "x.png"], "c must be"),
        (["privacy", "curve", "--c", "0.5", "--zero-prob", "0.05", "--png", "x.png",
          "--monte-carlo", "1000"], "--dim"),
        (["privacy", "guarantee", "--zero-prob", "0.05", "--scale", "0", "--dim", "2"], "scale"),
    ],
)  # fmt: skip
def test_bad_arguments_one_line_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err
    assert err.startswith(f"ldp-stream privacy {argv[1]}: error:"), err  # the action is named too
    assert not (tmp_path / "x.png").exists()


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["privacy", "calibrate", "--epsilon", "abc", "--delta", "0.2", "--zero-prob", "0.1",
              "--diameter", "1"])  # fmt: skip
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["privacy", "curve", "--c", "1", "--zero-prob", "0.1", "--png", "a.png", "--epsilons", "1,-2"])
    assert info.value.code == 2
    assert "epsilons" in capsys.readouterr().err


def test_privacy_without_action_prints_help(capsys):
    assert main(["privacy"]) == 2
    assert "calibrate" in capsys.readouterr().out


def test_curve_png(tmp_path, capsys):
    png = tmp_path / "curve.png"
    argv = ["privacy", "curve", "--c", "0.5", "--zero-prob", "0.05", "--png", str(png),
            "--epsilons", "0.8,1.6"]  # fmt: skip
    assert main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert str(png) in out
    expected = delta_for_epsilon(np.array([0.8, 1.6]), 0.5, 0.05)
    assert f"{expected[0]:.6f}" in out and f"{expected[1]:.6f}" in out


def test_curve_dim1_and_monte_carlo(tmp_path):
    png = tmp_path / "d1.png"
    assert main(["privacy", "curve", "--c", "1", "--zero-prob", "0.1", "--dim", "1", "--png", str(png)]) == 0
    assert png.stat().st_size > 1000
    png2 = tmp_path / "mc.png"
    argv = ["privacy", "curve", "--c", "0.5", "--zero-prob", "0.05", "--dim", "3", "--monte-carlo", "2000",
            "--seed", "3", "--png", str(png2), "--points", "51"]  # fmt: skip
    assert main(argv) == 0
    assert png2.read_bytes()[:4] == b"\x89PNG"


def test_curve_missing_directory_exit_2(tmp_path, capsys):
    argv = ["privacy", "curve", "--c", "0.5", "--zero-prob", "0.05", "--png", str(tmp_path / "no" / "x.png")]
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_guarantee(capsys):
    assert main(["privacy", "guarantee", "--zero-prob", "0.05", "--scale", "2", "--dim", "4"]) == 0
    text = capsys.readouterr().out
    assert "0.05" in text and "exactly" in text.lower()
    assert main(["privacy", "guarantee", "--zero-prob", "0.05", "--scale", "2", "--dim", "4",
                 "--epsilons", "1,2", "--json"]) == 0  # fmt: skip
    obj = json.loads(capsys.readouterr().out)
    assert obj == zil_guarantee(0.05, 2.0, 4, (1.0, 2.0)).to_dict()
    assert obj["c_record"] == pytest.approx(1.0)


def test_calibrate_matches_library(capsys):
    assert main(["privacy", "calibrate", "--epsilon", "2", "--delta", "0.06", "--zero-prob", "0.05",
                 "--diameter", "3", "--json"]) == 0  # fmt: skip
    obj = json.loads(capsys.readouterr().out)
    assert obj["c"] == calibrate_c(2.0, 0.06, 0.05)
    assert abs(obj["c"] / 0.20628232933941135 - 1) < 1e-3
