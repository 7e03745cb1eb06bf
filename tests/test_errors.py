"""The project's exception hierarchy: one root, one ``ConfigError``, errors in ``errors.py``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import aggregator
import aggregator.errors
import ingest
import ingest.errors
import mechanisms
import mechanisms.errors
from mechanisms.errors import ConfigError, LdpStreamError

PACKAGES = (mechanisms, ingest, aggregator)


def _modules():
    """Every module of the three packages, imported."""
    for package in PACKAGES:
        yield package
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            if info.name.endswith("__main__"):
                continue
            yield importlib.import_module(info.name)


def _exception_classes():
    """``(module name, class)`` for every exception class (warnings aside) a module defines."""
    seen = set()
    for module in _modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (cls.__module__ == module.__name__ and issubclass(cls, BaseException)
                    and not issubclass(cls, Warning) and cls not in seen):
                seen.add(cls)
                yield module.__name__, cls


def test_every_error_derives_from_the_root_and_lives_in_errors_py():
    classes = list(_exception_classes())
    assert len(classes) > 10  # the walk found the hierarchy
    off_root = [f"{m}.{c.__qualname__}" for m, c in classes if not issubclass(c, LdpStreamError)]
    elsewhere = [f"{m}.{c.__qualname__}" for m, c in classes if m.rsplit(".", 1)[-1] != "errors"]
    assert not off_root, f"not derived from LdpStreamError: {off_root}"
    assert not elsewhere, f"defined outside an errors.py module: {elsewhere}"


def test_one_config_error():
    """``except ConfigError`` catches every package's configuration error."""
    assert ingest.errors.ConfigError is ConfigError
    assert aggregator.errors.ConfigError is ConfigError
    assert issubclass(ConfigError, ValueError)
    with pytest.raises(aggregator.errors.ConfigError):
        raise ingest.errors.ConfigError("x")


@pytest.mark.parametrize(("package", "root"), [(mechanisms, "MechanismError"), (ingest, "IngestError"),
                                               (aggregator, "AggregatorError")])
def test_package_roots(package, root):
    """Each package exports the project root and its own root derived from it."""
    assert package.LdpStreamError is LdpStreamError
    assert issubclass(getattr(package.errors, root), LdpStreamError)
