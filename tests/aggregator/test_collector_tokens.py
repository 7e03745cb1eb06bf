"""The collector's token file (docs/collector.md §5): format, permissions, expiry, reload,
minting with ``ldp-stream collect-token``; nothing logs a token or a hash."""

from __future__ import annotations

import logging
import os
import stat
import time

import pytest

from aggregator.cli import main
from aggregator.collector.tokens import TokenStore, hash_token, mint_token, read_token_file
from aggregator.errors import RequestRefused
from ingest.errors import TokenFileError


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def write(path, text: str, mode: int = 0o600):
    path.write_text(text)
    os.chmod(path, mode)
    return path


def line(tid: str, token: str, expires: str = "") -> str:
    return f"{tid} sha256:{hash_token(token).hex()} {expires}".rstrip() + "\n"


def test_a_token_file_is_parsed_with_comments_and_expiries(tmp_path):
    p = write(tmp_path / "t", "# devices\n\n" + line("a", "tok-a")
              + line("b", "tok-b", "2030-01-01T00:00:00Z") + "   # indented comment\n")
    tokens = read_token_file(p)
    assert [(t.id, t.expires) for t in tokens] == [("a", None), ("b", 1893456000)]
    assert "sha256" not in repr(tokens) and hash_token("tok-a").hex() not in repr(tokens)


@pytest.mark.parametrize(("text", "words"), [
    ("a sha256:abc\n", "line 1"),
    ("# ok\nbad id! sha256:" + "0" * 64 + "\n", "line 2"),
    ("a md5:" + "0" * 64 + "\n", "hash must be"),
    ("a sha256:" + "0" * 64 + " tomorrow\n", "ISO-8601"),
    ("a sha256:" + "0" * 64 + " 2030-01-01 extra\n", "4 field"),
    ("a sha256:" + "0" * 64 + "\na sha256:" + "1" * 64 + "\n", "used twice"),
    ("a sha256:" + "0" * 64 + "\nb sha256:" + "0" * 64 + "\n", "listed twice"),
], ids=["short-hash", "bad-id", "md5", "bad-expiry", "extra-field", "dup-id", "dup-hash"])
def test_a_malformed_line_is_refused_naming_the_line(tmp_path, text, words):
    p = write(tmp_path / "t", text)
    with pytest.raises(TokenFileError) as info:
        read_token_file(p)
    assert words in str(info.value) and str(p) in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_file_group_or_others_may_read_is_refused(tmp_path, mode):
    p = write(tmp_path / "t", line("a", "x"), mode)
    with pytest.raises(TokenFileError, match=f"mode {mode:04o}.*chmod 600"):
        TokenStore(p)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(TokenFileError, match="cannot be read"):
        TokenStore(tmp_path / "nope")


def test_authentication_compares_every_hash_and_checks_the_expiry(tmp_path):
    now = Clock(1_900_000_000.0)
    p = write(tmp_path / "t", line("a", "tok-a") + line("old", "tok-old", "2030-01-01T00:00:00Z"))
    store = TokenStore(p, wall=now)
    assert store.authenticate("Bearer tok-a").id == "a"
    assert store.authenticate("bearer   tok-a ").id == "a"
    for header, code in [(None, "missing_token"), ("", "missing_token"), ("Bearer tok-b", "invalid_token"),
                         ("Basic tok-a", "invalid_token"), ("Bearer", "invalid_token"),
                         ("Bearer " + "x" * 600, "invalid_token")]:
        with pytest.raises(RequestRefused) as info:
            store.authenticate(header)
        assert (info.value.code, info.value.status) == (code, 401)
    with pytest.raises(RequestRefused, match="'old' expired at 2030-01-01T00:00:00Z"):
        store.authenticate("Bearer tok-old")
    now.t = 1_800_000_000.0
    assert store.authenticate("Bearer tok-old").id == "old"


def test_a_changed_file_is_reloaded_at_most_every_check_interval(tmp_path, caplog):
    clock = Clock()
    p = write(tmp_path / "t", line("a", "tok-a"))
    seen = []
    store = TokenStore(p, check_every_s=2.0, clock=clock, on_reload=seen.append)
    write(p, line("b", "tok-b"))
    os.utime(p, ns=(time.time_ns(), time.time_ns() + 10**9))
    clock.t = 1.0
    assert store.authenticate("Bearer tok-a").id == "a"  # not looked at yet
    clock.t = 2.5
    assert store.authenticate("Bearer tok-b").id == "b"
    assert store.reloads == 1 and seen == [True]
    # a broken rotation keeps the tokens of before and says so
    write(p, "garbage\n")
    os.utime(p, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    clock.t = 5.0
    with caplog.at_level(logging.ERROR):
        assert store.authenticate("Bearer tok-b").id == "b"
    assert seen == [True, False] and "line 1" in store.last_error
    assert "tok-b" not in caplog.text and hash_token("tok-b").hex() not in caplog.text


def test_mint_creates_a_private_file_and_appends(tmp_path):
    p = tmp_path / "tokens"
    t1 = mint_token(p, "dev-1")
    t2 = mint_token(p, "dev-2", expires=2_000_000_000)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert len(t1) >= 43 and t1 != t2 and t1 not in p.read_text()
    store = TokenStore(p)
    assert store.authenticate(f"Bearer {t1}").id == "dev-1"
    assert [t.expires for t in store.tokens] == [None, 2_000_000_000]
    with pytest.raises(TokenFileError, match="already has the id 'dev-1'"):
        mint_token(p, "dev-1")
    os.chmod(p, 0o644)
    with pytest.raises(TokenFileError, match="mode 0644"):
        mint_token(p, "dev-3")


def test_collect_token_prints_the_token_once_on_stdout(tmp_path, capsys):
    p = tmp_path / "tokens"
    assert main(["collect-token", "--token-file", str(p), "--id", "fleet", "--expires", "90d"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert out.count("\n") == 1 and token not in err and "'fleet'" in err
    info = TokenStore(p).authenticate(f"Bearer {token}")
    assert info.id == "fleet" and abs(info.expires - (time.time() + 90 * 86400)) < 60


@pytest.mark.parametrize(("args", "words"), [
    (["--id", "bad id"], "--id must be"),
    (["--id", "x", "--expires", "soon"], "--expires"),
])
def test_collect_token_bad_arguments_are_one_line_exit_2(tmp_path, capsys, args, words):
    assert main(["collect-token", "--token-file", str(tmp_path / "t"), *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err


def _pipeline_in(directory, collector: str):
    from pathlib import Path

    schema = Path(__file__).resolve().parents[2] / "examples" / "flights.schema.toml"
    directory.mkdir(parents=True, exist_ok=True)
    p = directory / "p.pipeline.toml"
    p.write_text(f'[pipeline]\nname = "p"\nschema = "{schema}"\n[collector]\n{collector}')
    return p


def test_collect_token_with_config_writes_the_token_file_the_collector_reads(tmp_path, capsys,
                                                                             monkeypatch):
    """``--config`` mints into ``[collector] token_file`` resolved as ``collect`` resolves it
    (relative to the pipeline file), not relative to the working directory."""
    from aggregator.config import PipelineConfig

    config = _pipeline_in(tmp_path / "conf", 'token_file = "collector.tokens"\n')
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["collect-token", "--config", str(config), "--id", "fleet-a"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    expected = tmp_path / "conf" / "collector.tokens"
    assert PipelineConfig.load(config).collector.token_file == expected
    assert list(elsewhere.iterdir()) == [] and str(expected) in err
    assert TokenStore(expected).authenticate(f"Bearer {token}").id == "fleet-a"


def test_collect_token_config_refusals_are_one_line_exit_2(tmp_path, capsys):
    config = _pipeline_in(tmp_path, "")
    assert main(["collect-token", "--config", str(config), "--id", "x"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "collector.token_file is not set" in err, err
    with pytest.raises(SystemExit) as info:  # one token file: from the config or the flag
        main(["collect-token", "--config", str(config), "--token-file", str(tmp_path / "t"), "--id", "x"])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "" and err.count("\n") == 1 and "not allowed with" in err
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p.pipeline.toml"]
