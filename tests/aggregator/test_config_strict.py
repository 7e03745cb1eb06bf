"""Config validation: regressions on no covariate, a logistic threshold that
makes the label constant, TOML values of the wrong type silently coerced, nan/inf settings, the
pipeline name, and custom losses that do not declare their fields noised (the docs' interface and
factory example are checked against the code)."""

from __future__ import annotations

import math
import pathlib
import re
import textwrap

import pytest

from aggregator.cli import main
from aggregator.config import PipelineConfig, check_loss_fields, load_custom_loss
from aggregator.errors import ConfigError
from mechanisms.losses import Loss
from tests.aggregator._state_support import make_schema

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "configuration.md"
SCHEMA = make_schema()
BOUNDS = {f.name: (f.low, f.high) for f in SCHEMA.numeric.fields}

HEAD = '[pipeline]\nname = "t"\nschema = "s.toml"\n'
LOGIT = '[[queries]]\nkind = "logistic_regression"\nname = "lg"\ncovariates = ["a"]\nlabel = "b"\n'
MEDIAN = '[[queries]]\nkind = "quantile_regression"\nname = "qr"\ncovariates = ["a"]\nresponse = "b"\n'


def load(tmp_path, body: str) -> PipelineConfig:
    (tmp_path / "s.toml").write_text(SCHEMA.dumps_toml())
    p = tmp_path / "p.pipeline.toml"
    p.write_text(HEAD + textwrap.dedent(body))
    return PipelineConfig.load(p)


def refused(tmp_path, body: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, body)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


# ------------------------------------------------------------------ 1. regressions need a covariate
LOGIT_HINT = "a logistic regression needs at least one covariate"


@pytest.mark.parametrize(("kind", "keys", "hint"), [
    ("linear_regression", 'response = "b"', 'for the response\'s mean use kind = "mean"'),
    ("quantile_regression", 'response = "b"',
     'for the response\'s quantile use kind = "quantiles" with q = [tau]'),
    ("logistic_regression", 'label = "b"\nthreshold = 0.0', LOGIT_HINT),
    ("logistic_regression", 'label = "y"', LOGIT_HINT),
])
@pytest.mark.parametrize("intercept", [True, False])
def test_a_regression_on_no_covariate_is_refused_naming_what_to_use(tmp_path, kind, keys, hint, intercept):
    msg = refused(tmp_path, f'[[queries]]\nkind = "{kind}"\nname = "r"\n{keys}\ncovariates = []\n'
                            f'intercept = {str(intercept).lower()}\n')
    assert msg == f"queries.r.covariates: must name at least one numeric field, got []; {hint}"


# ------------------------------------------------------------------ 2. logistic threshold
def _threshold_message(t: float) -> str:
    low, high = BOUNDS["b"]
    return (f"queries.lg.threshold: must be in [{low:g}, {high:g}): b is clipped into its bounds "
            f"[{low:g}, {high:g}], so y = 1{{b > threshold}} would be constant, got {t}")


@pytest.mark.parametrize("where", ["above", "at_high", "below"])
def test_a_threshold_making_the_label_constant_is_refused(tmp_path, where):
    low, high = BOUNDS["b"]
    t = {"above": 1e9, "at_high": high, "below": math.nextafter(low, -math.inf)}[where]
    msg = refused(tmp_path, LOGIT + f"threshold = {t!r}\n")
    assert msg == _threshold_message(float(t))


@pytest.mark.parametrize("where", ["at_low", "below_high"])
def test_a_threshold_splitting_the_clipped_values_is_accepted(tmp_path, where):
    low, high = BOUNDS["b"]
    t = {"at_low": low, "below_high": math.nextafter(high, -math.inf)}[where]
    cfg = load(tmp_path, LOGIT + f"threshold = {t!r}\n")
    assert cfg.query("lg").threshold == t


# ------------------------------------------------------------------ 3. no coercion of TOML types
@pytest.mark.parametrize(("body", "message"), [
    ("[topics]\npartitions = true\n", "topics.partitions: must be an integer, got true"),
    ("[topics]\npartitions = 4.0\n", "topics.partitions: must be an integer, got 4.0"),
    ('[worker]\ncheckpoint_reports = "50000"\n',
     "worker.checkpoint_reports: must be an integer, got '50000'"),
    ('[worker]\ncheckpoint_interval_s = "5"\n', "worker.checkpoint_interval_s: must be a number, got '5'"),
    ("[worker]\ngroup_id = 5\n", "worker.group_id: must be a string, got 5"),
    ('[serve]\nport = "18080"\n', "serve.port: must be an integer, got '18080'"),
    ('[serve]\nrefresh_interval_s = "2"\n', "serve.refresh_interval_s: must be a number, got '2'"),
    ('[kafka]\nrequest_timeout_ms = "30000"\n', "kafka.request_timeout_ms: must be an integer, got '30000'"),
    ('[kafka]\nssl_check_hostname = "no"\n', "kafka.ssl_check_hostname: must be true or false, got 'no'"),
    ("[kafka]\nclient_id = 7\n", "kafka.client_id: must be a string, got 7"),
    ('[[queries]]\nkind = "mean"\nname = "x"\nfield = "a"\nlevel = "0.9"\n',
     "queries.x.level: must be a number, got '0.9'"),
    ('[[queries]]\nkind = "quantiles"\nname = "x"\nfield = "a"\nq = ["0.5"]\n',
     "queries.x.q[0]: must be a number, got '0.5'"),
    ('[[queries]]\nkind = "quantiles"\nname = "x"\nfield = "a"\nbins = true\n',
     "queries.x.bins: must be an integer, got true"),
    ('[[queries]]\nkind = "frequency"\nname = "x"\nfield = "c"\nlevel = true\n',
     "queries.x.level: must be a number, got true"),
    (MEDIAN + 'tau = "0.5"\n', "queries.qr.tau: must be a number, got '0.5'"),
    (MEDIAN + 'intercept = "yes"\n', "queries.qr.intercept: must be true or false, got 'yes'"),
    (MEDIAN + "intercept = 1\n", "queries.qr.intercept: must be true or false, got 1"),
    (MEDIAN.replace('["a"]', '"a"'), "queries.qr.covariates: must be an array, got 'a'"),
    (MEDIAN + 'renewable = { warm_up = "5000" }\n',
     "queries.qr.renewable.warm_up: must be an integer, got '5000'"),
    (MEDIAN + "renewable = { batch_size = 64.0 }\n",
     "queries.qr.renewable.batch_size: must be an integer, got 64.0"),
    (MEDIAN + "renewable = { warm_up = true }\n",
     "queries.qr.renewable.warm_up: must be an integer, got true"),
    (MEDIAN + "renewable = 5000\n", "queries.qr.renewable: must be a table, got 5000"),
    (LOGIT + 'threshold = "1"\n', "queries.lg.threshold: must be a number, got '1'"),
    ('[[queries]]\nkind = "custom"\nname = "c"\nloss = "mechanisms.losses:CheckLoss"\nfields = ["a"]\n'
     'init = ["1"]\n', "queries.c.init[0]: must be a number, got '1'"),
    ('[[queries]]\nkind = "linear_regression"\nname = "x"\nresponse = "b"\ncovariates = ["a"]\n'
     'intercept = "false"\n', "queries.x.intercept: must be true or false, got 'false'"),
])
def test_a_value_of_the_wrong_toml_type_is_refused(tmp_path, body, message):
    assert refused(tmp_path, body) == message


@pytest.mark.parametrize(("pipeline", "message"), [
    ('name = 5\nschema = "s.toml"', "pipeline.name: must be a string, got 5"),
    ('name = "t"\nschema = 5', "pipeline.schema: must be a path (a string), got 5"),
])
def test_a_pipeline_table_of_the_wrong_types_is_refused(tmp_path, pipeline, message):
    p = tmp_path / "p.toml"
    p.write_text(f"[pipeline]\n{pipeline}\n")
    with pytest.raises(ConfigError) as info:
        PipelineConfig.load(p, validate=False)
    assert str(info.value) == message


def test_ints_for_floats_arrays_for_tuples_and_paths_still_load(tmp_path):
    cfg = load(tmp_path, """
    [kafka]
    bootstrap_servers = ["127.0.0.1:9", "127.0.0.1:10"]
    extra = { api_version = [0, 10], retries = "5" }   # kafka-python options pass as written
    [worker]
    checkpoint_interval_s = 5
    [serve]
    refresh_interval_s = 2
    stale_after_s = 60
    [[queries]]
    kind = "logistic_regression"
    name = "lg"
    covariates = ["a"]
    label = "b"
    threshold = 1
    renewable = { warm_up = 2000, batch_size = 500 }
    [[queries]]
    kind = "quantiles"
    name = "q"
    field = "a"
    q = [0.5, 0.9]
    [[queries]]
    kind = "custom"
    name = "c"
    loss = "mechanisms.losses:CheckLoss"
    fields = ["a"]
    init = [0]
    """)
    assert cfg.worker.checkpoint_interval_s == 5.0 and isinstance(cfg.worker.checkpoint_interval_s, float)
    assert cfg.serve.refresh_interval_s == 2.0 and cfg.serve.stale_after_s == 60.0
    lg = cfg.query("lg")
    assert lg.threshold == 1.0 and lg.covariates == ("a",)
    assert (lg.renewable.warm_up, lg.renewable.batch_size) == (2000, 500)
    assert cfg.query("q").q == (0.5, 0.9) and cfg.query("c").init == (0.0,)
    assert cfg.schema_path == tmp_path / "s.toml"
    assert tuple(cfg.kafka.bootstrap_servers) == ("127.0.0.1:9", "127.0.0.1:10")
    assert cfg.kafka.extra == {"api_version": [0, 10], "retries": "5"}


# ------------------------------------------------------------------ 4. nan and inf
@pytest.mark.parametrize(("body", "message"), [
    ("[worker]\ncheckpoint_interval_s = nan\n",
     "worker.checkpoint_interval_s: must be a finite number in (0, 86400], got nan"),
    ("[worker]\ncheckpoint_interval_s = inf\n",
     "worker.checkpoint_interval_s: must be a finite number in (0, 86400], got inf"),
    ("[worker]\ncheckpoint_interval_s = 0\n",
     "worker.checkpoint_interval_s: must be a finite number in (0, 86400], got 0.0"),
    ("[serve]\nrefresh_interval_s = nan\n",
     "serve.refresh_interval_s: must be a finite number in (0, 86400], got nan"),
    ("[serve]\nstale_after_s = inf\n",
     "serve.stale_after_s: must be a finite number in (0, 604800], got inf"),
    (MEDIAN + "renewable = { warm_up = nan }\n", "queries.qr.renewable.warm_up: must be an integer, got nan"),
    (MEDIAN + "renewable = { batch_size = inf }\n",
     "queries.qr.renewable.batch_size: must be an integer, got inf"),
    (LOGIT + "threshold = nan\n", "queries.lg.threshold: must be a finite number, got nan"),
    ('[[queries]]\nkind = "custom"\nname = "c"\nloss = "mechanisms.losses:CheckLoss"\nfields = ["a"]\n'
     "init = [-inf]\n", "queries.c.init: must be finite numbers, got [-inf]"),
])
def test_nan_and_inf_settings_are_refused_naming_the_range(tmp_path, body, message):
    assert refused(tmp_path, body) == message


# ------------------------------------------------------------------ 5. pipeline name
def test_a_pipeline_name_with_a_slash_names_the_key(tmp_path, capsys):
    (tmp_path / "s.toml").write_text(SCHEMA.dumps_toml())
    p = tmp_path / "p.toml"
    p.write_text('[pipeline]\nname = "fl/ights"\nschema = "s.toml"\n'
                 '[kafka]\nbootstrap_servers = "127.0.0.1:9"\n'
                 '[[queries]]\nkind = "mean"\nname = "m"\nfield = "a"\n')
    expected = ("pipeline.name: must not contain '/' (checkpoints are keyed '<name>/<partition>' in "
                "the state topic), got 'fl/ights'")
    with pytest.raises(ConfigError) as info:
        PipelineConfig.load(p)
    assert str(info.value) == expected
    assert main(["work", "--config", str(p)]) == 2  # before any broker is contacted
    assert capsys.readouterr().err.strip().splitlines() == [f"ldp-stream work: error: {expected}"]


# ------------------------------------------------------------------ 6. custom losses
def _noised_message(key: str, spec: str, noised: tuple, fields: list[str]) -> str:
    every = tuple(range(len(fields)))
    return (f"{key}: the loss {spec!r} declares {len(noised)} noised column(s) {noised} but the "
            f"{len(fields)} field(s) {fields} all carry ZIL noise: it must declare noised = {every} "
            f"(for a built-in loss class, name a function that returns it built with noised={every}; "
            f'docs/configuration.md, "Custom losses")')


@pytest.mark.parametrize("cls", ["LinearRegressionLoss", "HuberLoss", "QuantileRegressionLoss"])
def test_a_builtin_regression_loss_named_directly_is_refused_readably(tmp_path, cls):
    spec = f"mechanisms.losses:{cls}"
    msg = refused(tmp_path, f'[[queries]]\nkind = "custom"\nname = "c"\nloss = "{spec}"\n'
                            'fields = ["a", "b"]\n')
    assert msg == _noised_message("queries.c.fields", spec, (), ["a", "b"])
    # the same check serves `analyze --loss … --fields …`
    with pytest.raises(ConfigError) as info:
        check_loss_fields(load_custom_loss(spec, key="--loss"), ["a", "b"], SCHEMA, key="--fields",
                          loss_name=spec)
    assert str(info.value) == _noised_message("--fields", spec, (), ["a", "b"])


def _docs_section() -> str:
    text = DOCS.read_text(encoding="utf-8")
    return text[text.index("## Custom losses"):]


def test_the_docs_list_every_abstract_member_of_loss():
    section = _docs_section()
    for name in sorted(Loss.__abstractmethods__):
        assert re.search(rf"`{name}\(", section), f"docs/configuration.md omits the abstract {name}()"


def test_the_docs_factory_example_loads_and_the_bare_class_does_not(tmp_path, monkeypatch):
    """The python and toml blocks of the docs' custom-loss example, run as written."""
    section = _docs_section()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    query = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    module, func = re.search(r'loss = "(\w+):(\w+)"', query).groups()
    (tmp_path / f"{module}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    fields = list(re.search(r"fields = \[(.*?)\]", query).group(1).replace('"', "").split(", "))
    # the example names flights fields: run it on the flights schema
    flights = ROOT / "examples" / "flights.schema.toml"
    p = tmp_path / "p.toml"
    p.write_text(f'[pipeline]\nname = "t"\nschema = "{flights}"\n' + query)
    cfg = PipelineConfig.load(p)
    q = cfg.queries[0]
    assert q.loss == f"{module}:{func}" and list(q.fields) == fields
    assert tuple(load_custom_loss(q.loss).noised) == tuple(range(len(fields)))
    cls = re.search(r"return (\w+)\(", code).group(1)
    p.write_text(p.read_text().replace(f"{module}:{func}", f"mechanisms.losses:{cls}"))
    with pytest.raises(ConfigError, match=r"declares 0 noised column\(s\)"):
        PipelineConfig.load(p)


def test_the_naive_estimator_takes_a_loss_without_noised_columns():
    """``naive`` fits ℓ(x̃₁, θ) as is: the noised-columns check is for the corrected losses only."""
    from ingest.client.schema import TelemetrySchema
    from mechanisms.losses import LinearRegressionLoss

    schema = TelemetrySchema.load(pathlib.Path(__file__).resolve().parents[2] / "examples"
                                  / "flights.schema.toml")
    loss = LinearRegressionLoss()  # noised = ()
    check_loss_fields(loss, ["dep_delay", "arr_delay"], schema, key="--fields", loss_name="L",
                      estimator="naive")
    with pytest.raises(ConfigError, match=r"--fields: the loss 'L' declares 0 noised column"):
        check_loss_fields(loss, ["dep_delay", "arr_delay"], schema, key="--fields", loss_name="L")


@pytest.mark.parametrize("params, message", [
    ('["a", "a"]', "queries.c.params: must be distinct names, got ['a', 'a']"),
    ('["", "x"]', "queries.c.params: names must start with a letter or '_' and contain only letters, "
                  "digits, '_', '.', '-' (at most 128 characters), got ''"),
    ('["ok", "x\\"y"]', "queries.c.params: names must start with a letter or '_' and contain only "
                        "letters, digits, '_', '.', '-' (at most 128 characters), got 'x\"y'"),
])
def test_custom_params_are_distinct_plain_names(params, message):
    """A repeated name made one coefficient vanish from /metrics (one series per param label)."""
    import tomllib

    from aggregator.queries import parse_query

    text = ('kind = "custom"\nname = "c"\nloss = "mechanisms.losses:CheckLoss"\nfields = ["a"]\n'
            f"params = {params}\n")
    with pytest.raises(ConfigError) as exc:
        parse_query(tomllib.loads(text))
    assert str(exc.value) == message


def test_a_loss_module_in_the_working_directory_is_found(tmp_path, monkeypatch):
    """docs/configuration.md: the working directory is searched (the installed script's sys.path
    does not hold it); appended, so it never shadows an installed module."""
    import sys

    (tmp_path / "wd_losses_s13.py").write_text(
        "from mechanisms.losses import CheckLoss\n\ndef median():\n    return CheckLoss()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    loss = load_custom_loss("wd_losses_s13:median", key="queries.m.loss")
    assert type(loss).__name__ == "CheckLoss"
    assert sys.path[-1] == str(tmp_path)
    with pytest.raises(ConfigError, match=r"queries\.m\.loss: cannot import module 'nowhere_s13': .*"
                                          r"searched: PYTHONPATH, installed packages, the working directory"):
        load_custom_loss("nowhere_s13:f", key="queries.m.loss")


def test_a_factory_that_exits_is_a_config_error_not_a_silent_exit():
    with pytest.raises(ConfigError, match=r"^loss: calling 'sys:exit' failed: SystemExit$"):
        load_custom_loss("sys:exit")


def test_a_mistyped_secret_is_not_echoed():
    from aggregator.config import check_kafka_types

    with pytest.raises(ConfigError) as exc:
        check_kafka_types({"sasl_plain_password": 9876543})
    assert str(exc.value) == ("kafka.sasl_plain_password: must be a string (the value is not shown: a "
                              "secret), got a int")
    assert "9876543" not in str(exc.value)


@pytest.mark.parametrize(("body", "message"), [
    ("[worker]\nmetrics_port = -1\n", "worker.metrics_port: must be >= 0, got -1"),
    ("[worker]\ncheckpoint_reports = 0\n", "worker.checkpoint_reports: must be >= 1, got 0"),
    ("[serve]\nport = 70000\n", "serve.port: must be <= 65535, got 70000"),
    (MEDIAN + "renewable = { warm_up = 99 }\n", "queries.qr.renewable.warm_up: must be >= 100, got 99"),
    (MEDIAN + "renewable = { warm_up = 1000001 }\n",
     "queries.qr.renewable.warm_up: must be <= 1000000, got 1000001"),
    (MEDIAN + "renewable = { batch_size = 9 }\n", "queries.qr.renewable.batch_size: must be >= 10, got 9"),
    (MEDIAN + "renewable = { batch_size = 1000001 }\n",
     "queries.qr.renewable.batch_size: must be <= 1000000, got 1000001"),
])
def test_a_value_out_of_its_bound_names_the_bound_and_the_value(tmp_path, body, message):
    """Not pydantic's 'Input should be greater than or equal to 0' without the value."""
    assert refused(tmp_path, body) == message
