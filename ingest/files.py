"""Reading a user's file: a schema, a pipeline config, a ``--kafka-config`` file, a secret.

One way to read a text file (UTF-8, universal newlines) and parse its TOML, and one way to check
that a secret's file (a device secret, a device token, a collector's token file) is private;
each failure is raised as the caller's error in one line that names the file's role and path, so
that every command reports a bad file the same way.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Callable
from os import PathLike
from pathlib import Path

__all__ = ["check_private_file", "check_readable", "parse_toml", "read_text_file", "read_toml_file"]


def check_readable(path: str | PathLike, fail: Callable[[str], Exception]) -> None:
    """Open ``path`` for reading once, so that a missing or unreadable file is named now rather
    than by whichever library reads it later.

    Raises
    ------
    Exception
        ``fail(reason)`` with the OS reason (``"No such file or directory"``).
    """
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise fail(str(exc.strerror or exc)) from None


def check_private_file(path: str | PathLike, what: str, fail: Callable[[str], Exception],
                       suffix: str = "") -> os.stat_result:
    """``os.stat`` of ``path`` once it is known to be a regular file only its owner may read.

    Parameters
    ----------
    path : str or path-like
    what : str
        The file's role, starting the message (``"token file"``, ``"device secret file"``).
    fail : callable str → Exception
        Builds the error to raise from its message (the caller's type, e.g. with the path).
    suffix : str
        Appended to every message (``"; nothing was sent"``).

    Raises
    ------
    Exception
        ``fail(message)``: the file cannot be stat'ed (the OS reason), is not a regular file, or
        (POSIX) has a group or other permission bit (``has mode 0644: group or others may read
        it; run chmod 600 PATH``).
    """
    p = str(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise fail(f"{what} {p!r} cannot be read: {exc.strerror}{suffix}") from None
    if not stat.S_ISREG(st.st_mode):
        raise fail(f"{what} {p!r} is not a regular file{suffix}")
    if os.name == "posix" and st.st_mode & 0o077:
        raise fail(f"{what} {p!r} has mode {stat.S_IMODE(st.st_mode):04o}: group or others may read "
                   f"it; run chmod 600 {p}{suffix}")
    return st


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
