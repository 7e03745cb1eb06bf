"""Pipeline config: TOML loading, sections, query validation against the schema."""

from __future__ import annotations

import pathlib
import textwrap

import pytest
from pydantic import ValidationError

from aggregator.config import PipelineConfig, load_custom_loss
from aggregator.errors import ConfigError
from aggregator.queries import (
    FrequencyQuery,
    LogisticRegressionQuery,
    QuantilesQuery,
    parse_query,
    query_fields,
)
from tests.aggregator._state_support import make_schema

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "flights.pipeline.toml"


def write(tmp_path, body: str, schema: bool = True) -> pathlib.Path:
    if schema:
        (tmp_path / "s.toml").write_text(make_schema().dumps_toml())
    p = tmp_path / "p.pipeline.toml"
    p.write_text(textwrap.dedent(body))
    return p


HEAD = """
[pipeline]
name = "t"
schema = "s.toml"
"""


def test_example_pipeline_loads():
    cfg = PipelineConfig.load(EXAMPLE)
    names = [q.name for q in cfg.queries]
    assert names == ["arr_delay_mean", "arr_delay_variance", "arr_delay_quantiles", "carrier_distribution",
                     "dest_distribution", "late_arrival_logit", "arr_on_dep_median", "flight_clusters",
                     "arr_delay_mean_daily", "carrier_weekly"]
    daily, weekly = cfg.query("arr_delay_mean_daily").window, cfg.query("carrier_weekly").window
    assert (daily.size_s, daily.hop_s, daily.grace_s) == (86400, 86400, 6 * 3600)
    assert (weekly.size_s, weekly.hop_s, weekly.retention_s) == (7 * 86400, 86400, 400 * 86400)
    assert cfg.telemetry_schema.event_time.field == "time_hour"
    assert cfg.schema_path == (EXAMPLE.parent / "flights.schema.toml")
    assert cfg.telemetry_schema.name == "flights"
    assert cfg.serve.host == "127.0.0.1" and cfg.topics.partitions == 4
    assert tuple(cfg.kafka.bootstrap_servers) == ("127.0.0.1:9092",)
    q = cfg.query("arr_delay_quantiles")
    assert isinstance(q, QuantilesQuery) and q.q == (0.5, 0.9)
    lg = cfg.query("late_arrival_logit")
    assert isinstance(lg, LogisticRegressionQuery) and lg.threshold == 15.0
    assert query_fields(lg) == ("hour", "distance", "arr_delay")
    with pytest.raises(ConfigError, match="no query named"):
        cfg.query("nope")


def test_defaults_and_relative_schema(tmp_path):
    p = write(tmp_path, HEAD + """
    [[queries]]
    kind = "frequency"
    name = "cd"
    field = "d"
    """)
    cfg = PipelineConfig.load(p)
    assert cfg.schema_path == tmp_path / "s.toml"
    assert cfg.worker.checkpoint_interval_s > 0 and cfg.serve.host == "127.0.0.1"
    assert isinstance(cfg.queries[0], FrequencyQuery) and cfg.queries[0].level == 0.95
    with pytest.raises(ValidationError):  # frozen
        cfg.topics = None  # type: ignore[misc]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('[[queries]]\nkind = "mean"\nname = "m"\nfield = "nope"\n', r"m\.field: 'nope' is not a field"),
        ('[[queries]]\nkind = "mean"\nname = "m"\nfield = "c"\n', r"queries\.m\.field: 'c' is a categorical"),
        ('[[queries]]\nkind = "frequency"\nname = "f"\nfield = "a"\n', r"f\.field: 'a' is a numeric"),
        ('[[queries]]\nkind = "quantile_regression"\nname = "qr"\nresponse = "b"\ncovariates = ["a"]\n'
         'estimator = "sdr"\n', r"queries\.qr\.estimator"),
        ('[[queries]]\nkind = "logistic_regression"\nname = "l"\ncovariates = ["a"]\nlabel = "b"\n'
         'threshold = 0.0\nestimator = "sdr"\n', r"queries\.l.*thresholded label"),
        ('[[queries]]\nkind = "custom"\nname = "c"\nloss = "no_such_module_xyz:f"\nfields = ["a"]\n',
         r"queries\.c\.loss: cannot import module 'no_such_module_xyz'"),
        ('[[queries]]\nkind = "custom"\nname = "c"\nloss = "mechanisms.losses:nope"\nfields = ["a"]\n',
         r"queries\.c\.loss: module 'mechanisms.losses' has no attribute"),
        ('[[queries]]\nkind = "custom"\nname = "c"\nloss = "benchmarks.paper_losses:relu_loss"\n'
         'fields = ["a"]\nestimator = "sdr"\n',
         r"queries\.c\.estimator: 'sdr' needs a loss twice differentiable"),
        ('[[queries]]\nkind = "custom"\nname = "c"\nloss = "json:dumps"\nfields = ["a"]\n',
         r"queries\.c\.loss"),
        # the check loss takes one column: two fields would run it on the wrong records
        ('[[queries]]\nkind = "custom"\nname = "c"\nloss = "mechanisms.losses:CheckLoss"\n'
         'fields = ["a", "b"]\n', r"queries\.c\.fields: 2 field\(s\) \['a', 'b'\] do not fit the loss "
         r"'mechanisms.losses:CheckLoss'.*exactly 1 column"),
        ('[[queries]]\nkind = "custom"\nname = "c"\nloss = "mechanisms.losses:CheckLoss"\n'
         'fields = ["c"]\n', r"queries\.c\.fields: 'c' is a categorical field"),
        ('[[queries]]\nkind = "mean"\nname = "m"\nfield = "a"\n[[queries]]\nkind = "mean"\nname = "m"\n'
         'field = "b"\n', "used twice"),
        ('[[queries]]\nkind = "mean"\nname = "m"\nfield = "a"\nlevel = 1.5\n', r"queries\.m\.level"),
        ('[[queries]]\nkind = "quantiles"\nname = "q"\nfield = "a"\nq = []\n', r"queries\.q\.q"),
        ('[[queries]]\nkind = "histogram"\nname = "h"\nfield = "a"\n', r"queries\.h"),
        ('[[queries]]\nkind = "mean"\nname = "m"\nfield = "a"\ncolour = "red"\n', r"queries\.m\.colour"),
        ('[topics]\npartitions = 0\n', r"topics\.partitions"),
        ('[topics]\nreports = "bad topic!"\n', r"topics\.reports: a topic name must be 1-249 characters"),
        ('[topics]\nreports = "x"\nstate = "x"\n', r"topics: reports, state and dead_letter must be three "
         r"different topics, got 'x', 'x'"),
        ('[[queries]]\nkind = "quantile_regression"\nname = "qr"\nresponse = "b"\ncovariates = ["a"]\n'
         'renewable = { warm_up = 99 }\n', r"queries\.qr\.renewable\.warm_up: must be >= 100, got 99"),
        ('[[queries]]\nkind = "logistic_regression"\nname = "l"\ncovariates = ["a"]\nlabel = "y"\n'
         'renewable = { batch_size = 2000000 }\n', r"queries\.l\.renewable\.batch_size: must be <= 1000000"),
        ('[[queries]]\nkind = "quantile_regression"\nname = "qr"\nresponse = "b"\ncovariates = ["a"]\n'
         'renewable = { burn_in = 10 }\n', r"queries\.qr\.renewable\.burn_in: Extra inputs"),
        ('[[queries]]\nkind = "mean"\nname = "m"\nfield = "a"\nrenewable = { warm_up = 1000 }\n',
         r"queries\.m\.renewable: Extra inputs"),
        ('[worker]\nmetrics_port = 70000\n', r"worker\.metrics_port"),
        ('[worker]\nmalloc_trim_threshold_mib = 16\n', r"worker\.malloc_trim_threshold_mib.*\[32, 2047\]"),
        ('[worker]\nmalloc_trim_threshold_mib = -1\n', r"worker\.malloc_trim_threshold_mib"),
        ('[worker]\nmalloc_trim_threshold_mib = 2048\n', r"worker\.malloc_trim_threshold_mib"),
        ('[worker]\nmalloc_trim_threshold_mib = true\n', r"worker\.malloc_trim_threshold_mib"),
        ('[worker]\nmalloc_trim_threshold_mib = "64"\n', r"worker\.malloc_trim_threshold_mib"),
        ('[serve]\nrefresh_interval_s = -1\n', r"serve\.refresh_interval_s"),
        ("[serve]\nrefresh_interval_s = 5\nstale_after_s = 4\n", r"serve.*stale_after_s must be >"),
        ('[kafka]\nbootstrap_servers = 5\n', r"kafka"),
        ('[bogus]\nx = 1\n', r"bogus"),
    ],
)
def test_invalid_configs_name_the_key(tmp_path, body, match):
    p = write(tmp_path, HEAD + body)
    with pytest.raises(ConfigError, match=match) as info:
        PipelineConfig.load(p)
    assert "\n" not in str(info.value)


REGRESSIONS = {
    "logistic_regression": 'covariates = ["a"]\nlabel = "y"\n',
    "quantile_regression": 'covariates = ["a"]\nresponse = "b"\n',
    "custom": 'loss = "mechanisms.losses:CheckLoss"\nfields = ["a"]\n',
}


@pytest.mark.parametrize("kind", list(REGRESSIONS))
@pytest.mark.parametrize("sgd", ["sgd = { step0 = 1.0, burn_in = 10 }\n", "sgd = {}\n",
                                 "[queries.sgd]\nci = 'plugin'\n"])
def test_a_removed_sgd_table_is_one_line_naming_its_replacement(tmp_path, kind, sgd):
    """A config of the averaged-SGD era: one line naming the query, ``sgd`` and the ``renewable``
    table that replaced it — not a pydantic listing of the old keys."""
    from aggregator.queries import SGD_REMOVED

    p = write(tmp_path, HEAD + f'[[queries]]\nkind = "{kind}"\nname = "r"\n' + REGRESSIONS[kind] + sgd)
    with pytest.raises(ConfigError) as info:
        PipelineConfig.load(p)
    msg = str(info.value)
    assert msg == f"queries.r: {SGD_REMOVED}"
    assert "\n" not in msg and "`sgd`" in msg and "renewable = {" in msg


def test_renewable_options_default_and_load_at_their_bounds(tmp_path):
    """``renewable`` is optional (``RenewableOptions()``'s defaults) and takes warm_up 100 … 10⁶, batch_size
    10 … 10⁶; the Wald intervals of the regressions take any level in [0.5, 1)."""
    from aggregator.queries import RenewableOptions

    body = HEAD
    for name, opts in (("d", ""), ("lo", "renewable = { warm_up = 100, batch_size = 10 }\n"),
                       ("hi", "renewable = { warm_up = 1000000, batch_size = 1000000 }\n")):
        body += (f'[[queries]]\nkind = "quantile_regression"\nname = "{name}"\n'
                 + REGRESSIONS["quantile_regression"] + opts + "level = 0.9995\n")
    cfg = PipelineConfig.load(write(tmp_path, body))
    assert cfg.query("d").renewable == RenewableOptions()
    assert (cfg.query("lo").renewable.warm_up, cfg.query("lo").renewable.batch_size) == (100, 10)
    assert (cfg.query("hi").renewable.warm_up, cfg.query("hi").renewable.batch_size) == (10**6, 10**6)
    assert cfg.query("hi").level == 0.9995


def test_file_problems(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        PipelineConfig.load(tmp_path / "missing.toml")
    p = write(tmp_path, "[pipeline\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        PipelineConfig.load(p)
    p = write(tmp_path, "[pipeline]\nname = 't'\nschema = 'other.toml'\n")
    with pytest.raises(ConfigError, match=r"pipeline\.schema: file not found"):
        PipelineConfig.load(p)
    p = write(tmp_path, "[topics]\npartitions = 2\n")
    with pytest.raises(ConfigError, match=r"pipeline: missing"):
        PipelineConfig.load(p)
    (tmp_path / "bad.toml").write_text("name = 'x'\n")
    p = write(tmp_path, "[pipeline]\nname = 't'\nschema = 'bad.toml'\n")
    with pytest.raises(ConfigError, match=r"pipeline\.schema: .*bad\.toml"):
        PipelineConfig.load(p)
    cfg = PipelineConfig.load(p, validate=False)  # parsing only
    assert cfg.pipeline.name == "t"


def test_custom_loss_loading():
    loss = load_custom_loss("mechanisms.losses:LogisticLoss")  # a class is instantiated
    assert hasattr(loss, "grad")
    assert load_custom_loss("benchmarks.paper_losses:relu_loss").smooth is False
    with pytest.raises(ConfigError, match="not a loss object"):
        load_custom_loss("json:JSONDecoder")


def test_parse_query_errors_are_one_line():
    with pytest.raises(ConfigError, match=r"queries\.m\.field: Field required"):
        parse_query({"kind": "mean", "name": "m"})
    with pytest.raises(ConfigError, match="name must start with a letter"):
        parse_query({"kind": "mean", "name": "bad name", "field": "a"})
    with pytest.raises(ConfigError, match="tau must be in"):
        parse_query({"kind": "quantile_regression", "name": "r", "response": "b", "covariates": ["a"],
                     "tau": 1})
    with pytest.raises(ConfigError, match="must not also be a covariate"):
        parse_query({"kind": "linear_regression", "name": "r", "response": "a", "covariates": ["a"]})
    q = parse_query({"kind": "mean", "name": "m", "field": "a"})
    assert parse_query(q) is q and q.estimator == "sdr"


def test_a_custom_loss_failing_on_a_record_of_its_fields_is_a_config_error(tmp_path, monkeypatch):
    """A user loss may fail any way (here IndexError) on records it cannot take: one ConfigError
    line at load, not a traceback from work/serve/analyze."""
    (tmp_path / "ldp_test_badloss.py").write_text(
        "from mechanisms.losses import CheckLoss\n"
        "class Picky(CheckLoss):\n"
        "    def _check_records(self, x, name):\n"
        "        x[:, 3]  # wants four columns, says nothing useful\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = write(tmp_path, HEAD + '[[queries]]\nkind = "custom"\nname = "c"\n'
              'loss = "ldp_test_badloss:Picky"\nfields = ["a"]\n')
    with pytest.raises(ConfigError, match=r"queries\.c\.fields: 1 field\(s\) \['a'\] do not fit the loss "
                       r"'ldp_test_badloss:Picky': index 3 is out of bounds") as info:
        PipelineConfig.load(p)
    assert "\n" not in str(info.value)
