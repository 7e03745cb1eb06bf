"""``ldp-stream`` command line.

Each subcommand lives in its own module of this package and exposes
``register(subparsers) -> None``; the parser it adds sets ``func`` (called with the parsed
namespace, returns an exit status). Errors that a user can fix — the project's errors
(``mechanisms.errors.LdpStreamError``: ``ConfigError``, ``CLIError``, …), any other ``ValueError``,
an ``OSError`` about a path given on the command line (missing file, directory, permission) — are
printed as one line with exit status 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys

from ingest.local.processes import exit_with_parent
from mechanisms.errors import LdpStreamError

# module name under aggregator.cli, in --help order
SUBCOMMANDS = ("demo", "privacy", "broker", "produce", "work", "serve", "collect", "analyze")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _version() -> str:
    """The installed distribution's version (``unknown`` when run from a tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ldp-stream")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every available subcommand registered."""
    parser = _Parser(
        prog="ldp-stream",
        description="Streaming engine for locally differentially private telemetry.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        importlib.import_module(f"aggregator.cli.{name}").register(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost parser of the (sub)command ``args`` came from (``privacy calibrate``'s for
    ``ldp-stream privacy calibrate …``), or ``parser`` itself."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                return _subparser(action.choices[chosen], args)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ldp-stream`` console script; returns the exit status."""
    exit_with_parent()  # when started by the demo: stop if it dies (ingest.local.processes.exit_with_parent)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    sub = _subparser(parser, args)  # errors name the (sub)command, not the top-level program
    if extra:
        verbose = any(re.fullmatch(r"-v+|--verbose", e) for e in extra)
        hint = (" (-v/--verbose goes before the subcommand: ldp-stream -v COMMAND …)"
                if sub is not parser and verbose else "")
        sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("ldp-stream: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ldp-stream analyze --json | head`: the reader has what it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except (LdpStreamError, ValueError) as exc:
        print(f"{sub.prog}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.filename is None:  # not a path the user gave (sockets, …): not ours to word
            raise
        print(f"{sub.prog}: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
