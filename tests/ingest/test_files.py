"""The one reader of a user's text file (``ingest.files``): the message of each failure, as the
schema, the pipeline config and ``produce --kafka-config`` report it."""

from __future__ import annotations

import pytest

from aggregator.config import PipelineConfig
from aggregator.errors import ConfigError
from ingest.client.schema import TelemetrySchema
from ingest.errors import SchemaError
from ingest.files import read_toml_file


class _Refused(Exception):
    pass


def test_each_failure_is_one_line_after_the_callers_prefix(tmp_path):
    missing, bad_utf8, bad_toml = tmp_path / "none.toml", tmp_path / "b.toml", tmp_path / "t.toml"
    bad_utf8.write_bytes(b"\xff\xfe")
    bad_toml.write_text("a = \n")
    kw = {"read_prefix": "R", "toml_prefix": "T: "}
    with pytest.raises(_Refused, match=r"^R: No such file or directory$"):
        read_toml_file(missing, _Refused, **kw)
    with pytest.raises(_Refused, match=r"^R: Is a directory$"):
        read_toml_file(tmp_path, _Refused, **kw)
    with pytest.raises(_Refused, match=r"^R: not UTF-8 text \(invalid start byte at byte 0\)$"):
        read_toml_file(bad_utf8, _Refused, **kw)
    with pytest.raises(_Refused, match=r"^T: Invalid value \(at line 1, column 5\)$"):
        read_toml_file(bad_toml, _Refused, **kw)
    ok = tmp_path / "ok.toml"
    ok.write_text("a = 1\n")
    assert read_toml_file(ok, _Refused, **kw) == {"a": 1}


def test_schema_and_config_messages(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text("a = \n")
    with pytest.raises(SchemaError, match=r"^cannot read schema file '.*none.toml': No such file"):
        TelemetrySchema.load(tmp_path / "none.toml")
    with pytest.raises(SchemaError, match=r"^schema is not valid TOML: Invalid value"):
        TelemetrySchema.load(bad)
    with pytest.raises(ConfigError, match=r"^cannot read pipeline config '.*none.toml': No such file"):
        PipelineConfig.load(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match=rf"^{str(bad)!r}: invalid TOML: Invalid value"):
        PipelineConfig.load(bad)
