"""Loading a custom query's loss from its ``"module:callable"`` spec (docs/configuration.md).

This is the one place that imports user code for a query. The pipeline config resolves every
custom query's loss once, when it is loaded, and hands the objects to the states
(:func:`aggregator.state.build_state`'s ``loss``), so restoring a checkpoint imports nothing.
"""

from __future__ import annotations

import importlib

from aggregator.errors import ConfigError

__all__ = ["load_custom_loss"]


def load_custom_loss(spec: str, *, key: str = "loss"):
    """Import ``"module:callable"`` and return the loss object.

    If the attribute is a class or a zero-argument factory it is called; a ready loss object
    (one with ``value`` and ``grad``) is returned as is. Whether it fits the query's fields (their
    number, every one noised) is :func:`aggregator.config.check_loss_fields`' business.

    The module is searched on ``sys.path`` and then in the working directory (appended, so a
    file there never shadows an installed module): the ``ldp-stream`` script's ``sys.path``
    does not hold the working directory, as ``python`` run from it would.

    Raises
    ------
    ConfigError
        ``<key>: cannot import …`` if the module or attribute is missing, importing or calling it
        fails (``sys.exit`` included), or the object is not a loss (needs ``value`` and ``grad``).
    """
    mod_name, _, attr = spec.partition(":")
    try:
        module = _import_from_path_or_cwd(mod_name)
    except (Exception, SystemExit) as exc:  # any import-time failure is a config problem
        raise ConfigError(f"{key}: cannot import module {mod_name!r}: {_one_line(exc) or type(exc).__name__} "
                          "(searched: PYTHONPATH, installed packages, the working directory)") from None
    obj = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError(f"{key}: module {mod_name!r} has no attribute {attr!r}") from None
    if not (hasattr(obj, "value") and hasattr(obj, "grad")) or isinstance(obj, type):
        try:
            obj = obj()
        except (Exception, SystemExit) as exc:  # a factory that calls sys.exit ended the worker silently
            raise ConfigError(f"{key}: calling {spec!r} failed: "
                              f"{type(exc).__name__}: {_one_line(exc)}".rstrip(": ")) from None
    if not (hasattr(obj, "value") and hasattr(obj, "grad")):
        raise ConfigError(f"{key}: {spec!r} is not a loss object (needs value() and grad())")
    return obj


def _import_from_path_or_cwd(mod_name: str):
    """``importlib.import_module``, retried with the working directory appended to ``sys.path``
    when the module's top-level package is not found."""
    import os
    import sys

    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        top = mod_name.split(".")[0]
        if exc.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(mod_name)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
