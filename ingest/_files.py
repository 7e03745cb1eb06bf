"""Reading a user's text file: a schema, a pipeline config, a ``--kafka-config`` file.

One way to read one (UTF-8, universal newlines) and parse its TOML, each failure raised as the
caller's error type in one line that starts with the caller's prefix (the file's role and path),
so that every command reports an unreadable file the same way.
"""

from __future__ import annotations

import tomllib
from os import PathLike
from pathlib import Path

__all__ = ["parse_toml", "read_text_file", "read_toml_file"]


def read_text_file(path: str | PathLike, error: type[Exception], prefix: str) -> str:
    """The text of the UTF-8 file ``path``.

    Parameters
    ----------
    path : str or path-like
    error : type of Exception
        Raised on failure (``SchemaError``, ``ConfigError``, ``CLIError`` …).
    prefix : str
        Start of the message, e.g. ``"cannot read schema file 'x.toml'"``; ``": <reason>"`` follows.

    Raises
    ------
    error
        ``"<prefix>: <OS reason>"`` if the file cannot be opened or read,
        ``"<prefix>: not UTF-8 text (<reason> at byte <n>)"`` if it is not UTF-8.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{prefix}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{prefix}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_toml(text: str, error: type[Exception], prefix: str) -> dict:
    """``text`` parsed as TOML.

    Raises
    ------
    error
        ``"<prefix><tomllib's message>"`` (the message names line and column) on a syntax error.
    """
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{prefix}{exc}") from None


def read_toml_file(path: str | PathLike, error: type[Exception], *, read_prefix: str,
                   toml_prefix: str) -> dict:
    """:func:`read_text_file` then :func:`parse_toml`: the table of the TOML file ``path``.

    Parameters
    ----------
    path : str or path-like
    error : type of Exception
    read_prefix : str
        Prefix of the messages of :func:`read_text_file`.
    toml_prefix : str
        Prefix of the message of :func:`parse_toml` (ends with its separator, e.g. ``": "``).
    """
    return parse_toml(read_text_file(path, error, read_prefix), error, toml_prefix)
