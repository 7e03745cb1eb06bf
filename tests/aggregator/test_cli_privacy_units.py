"""``ldp-stream privacy compose`` and ``privacy guarantee --schema``: guarantees for a privacy unit
of several reports (aggregator/cli/privacy.py, docs/privacy.md §7)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from aggregator.cli import main
from mechanisms.privacy.composition import compose_zil

ROOT = Path(__file__).resolve().parents[2]
DEVICE = '\n[privacy]\nunit = "device"\nperiod = "1d"\nreports_per_period = 10\n'


def test_compose_json_is_the_library_result(capsys):
    argv = ["privacy", "compose", "--zero-prob", "0.05", "--scale", "2", "--diameter", str(math.sqrt(3)),
            "--dim", "3", "--reports", "12", "--epsilons", "1,4", "--json"]
    assert main(argv) == 0
    obj = json.loads(capsys.readouterr().out)
    want = compose_zil(0.05, 2.0, diameter=math.sqrt(3), dim=3, reports=12, epsilons=(1.0, 4.0))
    assert obj["reports"] == 12
    assert [r["epsilon"] for r in obj["epsilon_delta"]] == [1.0, 4.0]
    assert [r["delta"] for r in obj["epsilon_delta"]] == list(want.deltas)
    assert obj["exact_release_prob"] == pytest.approx(1 - 0.95 ** 12, rel=1e-12)
    assert obj["accounting"] == "beta_c_bound"


def test_compose_text_states_the_exact_release_floor(capsys):
    argv = ["privacy", "compose", "--zero-prob", "0.2", "--scale", "1", "--dim", "1", "--reports", "10"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "exact one-field (Laplace) accounting" in out
    assert "released exactly with probability 0.892626" in out
    assert out.strip().splitlines()[-1].split() == ["16", "0.892626"]  # 16 > 10·√2: only exact releases


@pytest.mark.parametrize(("argv", "needle"), [
    (["--zero-prob", "0.2", "--scale", "1", "--reports", "0"], "--reports must be in [1, 100000]"),
    (["--zero-prob", "0.2", "--scale", "1", "--reports", "100001"], "--reports must be in"),
    (["--zero-prob", "1.2", "--scale", "1", "--reports", "3"], "zero_prob must be in (0, 1)"),
    (["--zero-prob", "0.2", "--scale", "-1", "--reports", "3"], "scale must be"),
    (["--zero-prob", "0.2", "--scale", "1", "--reports", "3", "--dim", "0"], "--dim must be in"),
    (["--zero-prob", "0.2", "--scale", "1", "--reports", "3", "--diameter", "0"], "diameter must be"),
])
def test_compose_bad_arguments_one_line_exit_2(argv, needle, capsys):
    assert main(["privacy", "compose", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err and err.startswith("ldp-stream privacy compose: error:")


def test_guarantee_of_an_event_schema_says_the_unit_is_one_report(capsys):
    assert main(["privacy", "guarantee", "--schema", str(ROOT / "examples" / "flights.schema.toml")]) == 0
    out = capsys.readouterr().out
    assert "the unit is one event" in out and "ldp-stream privacy compose" in out
    assert "composed" not in out.split("\n", 1)[1]


def test_guarantee_of_a_device_schema_gives_both_and_says_which_holds(tmp_path, capsys):
    path = tmp_path / "device.schema.toml"
    path.write_text((ROOT / "examples" / "flights.schema.toml").read_text() + DEVICE)
    assert main(["privacy", "guarantee", "--schema", str(path), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["unit"]["unit"] == "device" and obj["unit"]["holds"] == "composed"
    comp = obj["numeric"]["composed"]
    assert comp["reports"] == 10 and comp["exact_release_prob"] == pytest.approx(1 - 0.8 ** 10)
    per_report = {r["epsilon"]: r["delta"] for r in obj["numeric"]["epsilon_delta"]["record"]}
    for row in comp["record"]:
        assert row["delta"] >= comp["exact_release_prob"] - 1e-12
        if row["epsilon"] in per_report:
            assert row["delta"] >= per_report[row["epsilon"]]
    assert obj["categorical"]["carrier"]["composed"]["accounting"] == "pure_epsilon"
    assert main(["privacy", "guarantee", "--schema", str(path)]) == 0
    text = capsys.readouterr().out
    assert "over 10 reports per 1d (composed" in text and "probability 0.8926" in text


def test_guarantee_flags_conflict_or_are_missing(tmp_path, capsys):
    schema = str(ROOT / "examples" / "flights.schema.toml")
    assert main(["privacy", "guarantee", "--schema", schema, "--scale", "1"]) == 2
    assert "either --schema or --zero-prob/--scale/--dim" in capsys.readouterr().err
    assert main(["privacy", "guarantee", "--scale", "1"]) == 2
    assert "missing --zero-prob, --dim" in capsys.readouterr().err
    assert main(["privacy", "guarantee", "--schema", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nope.toml" in err


ONE_FIELD = """
name = "one"
version = 1

[numeric]
zero_prob = 0.2
scale = 1.0

[[numeric.fields]]
name = "delay"
low = -60.0
high = 240.0
unit = "min"
"""


def test_plan_json_and_written_schema(tmp_path, capsys):
    from ingest.client.schema import TelemetrySchema

    src, out = tmp_path / "one.schema.toml", tmp_path / "planned.schema.toml"
    src.write_text(ONE_FIELD + DEVICE)
    argv = ["privacy", "plan", "--schema", str(src), "--epsilon", "4", "--delta", "0.3",
            "--reports-per-window", "5000", "--data-sd", "delay=45", "--write-schema", str(out), "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["target"]["reports"] == 10 and plan["numeric"]["accounting"] == "exact_laplace"
    num = plan["numeric"]
    assert compose_zil(num["zero_prob"], num["scale"], dim=1, reports=10, epsilons=(4.0,)).deltas[0] <= 0.3
    planned = TelemetrySchema.load(out)
    assert (planned.numeric.zero_prob, planned.numeric.scale) == (num["zero_prob"], num["scale"])
    assert main(["privacy", "plan", "--schema", str(src), "--epsilon", "4", "--delta", "0.3",
                 "--reports-per-window", "5000", "--zero-prob", str(num["zero_prob"])]) == 0
    text = capsys.readouterr().out
    assert "Numeric block (1 fields, exact_laplace)" in text and "| delay | [-60, 240] |" in text


@pytest.mark.parametrize(("extra", "needle"), [
    (["--reports-per-window", "1"], "--reports-per-window must be in [2,"),
    (["--reports-per-window", "100", "--zero-prob", "0.2"], "numeric block"),
    (["--reports-per-window", "100", "--data-sd", "hour=2"], "not numeric fields of the schema"),
])
def test_plan_bad_input_one_line_exit_2(extra, needle, tmp_path, capsys):
    src = tmp_path / "one.schema.toml"
    src.write_text(ONE_FIELD + DEVICE)
    assert main(["privacy", "plan", "--schema", str(src), "--epsilon", "4", "--delta", "0.3", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err and err.startswith("ldp-stream privacy plan: error:")


def test_plan_data_sd_syntax_is_checked_by_argparse(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["privacy", "plan", "--schema", "x.toml", "--epsilon", "4", "--delta", "0.3",
              "--reports-per-window", "100", "--data-sd", "delay=-1"])
    assert info.value.code == 2 and "FIELD=SD" in capsys.readouterr().err
