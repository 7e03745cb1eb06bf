"""Tests of ``ldp-stream privacy`` (aggregator/cli/privacy.py) through ``aggregator.cli.main``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from aggregator.cli import main
from mechanisms.privacy import calibrate_c, delta_for_epsilon, zil_guarantee

PAPER = ["--epsilon", "0.8", "--delta", "0.17", "--zero-prob", "0.05"]


def test_calibrate_text(capsys):
    assert main(["privacy", "calibrate", *PAPER, "--diameter", "1"]) == 0
    out = capsys.readouterr().out
    assert "c = 0.502521" in out
    assert "scale = 1.98997" in out
    assert "exactly" in out
    assert "is (0.8, 0.17)-DP" in out


def test_calibrate_text_shows_delta_as_given(capsys):
    # :g formatting printed δ = 0.99999999 as "(0.8, 1)-DP"
    assert main(["privacy", "calibrate", "--epsilon", "0.8", "--delta", "0.99999999", "--zero-prob",
                 "0.05", "--diameter", "1"]) == 0
    assert "is (0.8, 0.99999999)-DP" in capsys.readouterr().out
    # :.12g still printed 0.9999999999999999 as 1, and epsilon -0.0 as -0
    assert main(["privacy", "calibrate", "--epsilon=-0.0", "--delta", "0.9999999999999999",
                 "--zero-prob", "0.05", "--diameter", "1"]) == 0
    assert "is (0, 0.9999999999999999)-DP" in capsys.readouterr().out


def test_an_empty_item_in_epsilons_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's own error exit
        main(["privacy", "guarantee", "--zero-prob", "0.2", "--scale", "1", "--dim", "2",
              "--epsilons", "1,,2"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        "argument --epsilons: expected comma-separated numbers >= 0 without empty items, got '1,,2'")


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
    assert f"        0.8  {expected[0]:.6g}\n" in out and f"        1.6  {expected[1]:.6g}\n" in out


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


# ------------------------------------------------------------------ extreme values (no nan, no warning)
# The suite turns every warning into an error, so a numpy RuntimeWarning fails these tests too.


@pytest.mark.parametrize("dim", ["1", "3"])
def test_guarantee_huge_and_tiny_epsilon(dim, capsys):
    """``--epsilons 0,1e-9,1e9`` overflowed e^ε (d = 1) and ε√w/c (the β_c bound), with
    RuntimeWarnings and, with other numpy builds, delta = nan. Independent values: δ̃ → zero_prob
    as ε → ∞ (the limit 1 − (1 − δ)·e^(−c²/(2ε)) for the bound, exactly zero_prob for d = 1 above
    √2·c), at every scale from 1e-300 to 1e300."""
    for scale in ("1e300", "1", "1e-300"):
        argv = ["privacy", "guarantee", "--zero-prob", "0.2", "--scale", scale, "--dim", dim,
                "--epsilons", "0,1e-9,1e9", "--json"]  # fmt: skip
        assert main(argv) == 0
        obj = json.loads(capsys.readouterr().out)
        for level, c in (("delta_record", obj["c_record"]), ("delta_attribute", obj["c_attribute"])):
            d0, d_tiny, d_huge = obj[level]
            assert 0.2 <= d_huge <= d_tiny <= d0 <= 1.0, (scale, level, obj[level])
            assert d_tiny == pytest.approx(d0, abs=1e-8)
            ratio = c / math.sqrt(2e9)  # c²/(2ε) = ratio², ε = 1e9
            exact_d1 = dim == "1" and c * math.sqrt(2) <= 1e9
            limit = 0.2 if exact_d1 else 1 - 0.8 * math.exp(-ratio * ratio)
            assert d_huge == pytest.approx(limit, rel=1e-6), (scale, level, c, d_huge, limit)
        if scale == "1e300":
            assert obj["delta_record"] == obj["delta_attribute"] == [0.2, 0.2, 0.2]


@pytest.mark.parametrize("dim", [[], ["--dim", "1"], ["--dim", "2", "--monte-carlo", "500", "--seed", "1"]])
@pytest.mark.parametrize("c", ["1e-300", "1e300"])
def test_curve_extreme_c(c, dim, tmp_path, capsys):
    """``--c 1e-300`` (a vanishing shift: the identity-like curve) failed with ``delta must be in
    [0, 1], got nan`` / overflow warnings; ``--c 1e300`` overflowed c² and (Monte Carlo) K_ν.
    δ̃ is then zero_prob (c → 0) or 1 (c → ∞, as long as ε ≪ c²) at every ε, including ε = 1e9,
    whose envelope line raised OverflowError."""
    png = tmp_path / "x.png"
    argv = ["privacy", "curve", "--c", c, "--zero-prob", "0.2", "--png", str(png),
            "--epsilons", "0,1e-9,0.5,1e9", *dim]  # fmt: skip
    assert main(argv) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    rows = capsys.readouterr().out.splitlines()[2:]
    want = "0.2" if c == "1e-300" else "1"
    assert [r.split() for r in rows] == [["0", want], ["1e-09", want], ["0.5", want], ["1e+09", want]]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["curve", "--points", "100000000"], "--points must be in [11, 10000], got 100000000"),
        (["curve", "--points", "10"], "--points must be in [11, 10000], got 10"),
        (["curve", "--dim", "0"], "--dim must be in [1, 1000000], got 0"),
        (["curve", "--dim", "3", "--monte-carlo", "5"],
         "--monte-carlo must be 0 (no Monte Carlo curve) or in [100, 1000000], got 5"),
        (["curve", "--dim", "3", "--monte-carlo", "-5"], "--monte-carlo must be 0"),
        (["curve", "--dim", "3", "--monte-carlo", "100000000000"], "--monte-carlo must be 0"),
        (["curve", "--dim", "100", "--monte-carlo", "1000000"],
         "--monte-carlo times --dim must be at most 10000000"),
        (["guarantee", "--dim", "10000000"], "--dim must be in [1, 1000000], got 10000000"),
        (["guarantee", "--scale", "1e-310"], "scale=1e-310 is too small"),
        (["calibrate", "--dim", "10000000"], "--dim must be in [1, 1000000], got 10000000"),
        (["calibrate", "--diameter", "1e308"], "scale = diameter / c = 1e+308 / 0.502521"),
        (["calibrate", "--epsilon", "1.7e308", "--dim", "1"], "outside the range of normal floats"),
    ],
)  # fmt: skip
def test_numeric_flag_limits_one_line_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    """Absurd values of every numeric flag give one line naming the flag and exit 2 — never a
    traceback, a hang (``--points 100000000`` ran for minutes), an inf scale or a 300-digit one."""
    monkeypatch.chdir(tmp_path)
    base = {
        "curve": ["--c", "0.5", "--zero-prob", "0.05", "--png", "x.png"],
        "guarantee": ["--zero-prob", "0.05", "--scale", "2", "--dim", "3"],
        "calibrate": [*PAPER, "--diameter", "1"],
    }[argv[0]]
    assert main(["privacy", argv[0], *base, *argv[1:]]) == 2  # later flags override the base ones
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"ldp-stream privacy {argv[0]}: error:"), err
    assert needle in err, err
    assert not (tmp_path / "x.png").exists()


def test_epsilons_list_is_bounded(capsys):
    too_many = ",".join(["1"] * 101)
    with pytest.raises(SystemExit) as info:
        main(["privacy", "guarantee", "--zero-prob", "0.05", "--scale", "2", "--dim", "3",
              "--epsilons", too_many])  # fmt: skip
    assert info.value.code == 2
    assert "argument --epsilons: at most 100 values, got 101" in capsys.readouterr().err


@pytest.mark.parametrize(("diameter", "scale"), [("1e-300", "1.98997e-300"), ("1e300", "1.98997e+300")])
def test_calibrate_prints_significant_digits(diameter, scale, capsys):
    """``--diameter 1e-300`` printed ``scale = 0.000000`` and ``1e300`` a 300-digit number."""
    assert main(["privacy", "calibrate", *PAPER, "--diameter", diameter]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == ["c = 0.502521", f"scale = {scale}"]
    assert f"scale={scale})" in out
