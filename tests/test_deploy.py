"""Checks of deploy/: every file parses, docker-compose / Prometheus / Grafana / Kubernetes refer to
things that exist (services, files, ports, CLI flags, metric names), and the KEDA scaler never
scales past the partition count.

Metric names used by the dashboard and the alert rules are checked against what a real worker, a
real serve and a real collector expose over HTTP (``WorkerMetrics`` registers every family at
construction — checked here too — and serve's and the collector's ``/metrics`` routes are scraped
from uvicorn on 127.0.0.1). The collector's deployment (compose service and token-file init,
Kubernetes Deployment, Service, Secret copy and probes) is checked against its ``[collector]``
config. ``docker compose
config`` and ``promtool`` run where installed and are skipped otherwise. The dashboard's layout
(unique ids, no overlapping panels, defined variables, the same CI bands everywhere), the alert
tests' coverage and the metric tables of docs/deploy.md are checked against the same sources.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from tests.http_server import ServedApp

yaml = pytest.importorskip("yaml", reason="pyyaml is in the dev extras")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
CONFIG = DEPLOY / "config" / "flights.pipeline.toml"
K8S = DEPLOY / "k8s"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "ldp-stream.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROM = DEPLOY / "prometheus" / "prometheus.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
LDP_IMAGE = "ldp-stream"
IMAGE_ROOT = "/app"  # WORKDIR of deploy/Dockerfile: /app/<path> is <repo>/<path>


# ------------------------------------------------------------------------------------------ helpers
def _yaml_docs(path: Path) -> list:
    with path.open(encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


def _compose() -> dict:
    (doc,) = _yaml_docs(COMPOSE)
    return doc


def _pipeline() -> dict:
    return tomllib.loads(CONFIG.read_text(encoding="utf-8"))


def _k8s_objects() -> list[dict]:
    out = []
    for p in sorted(K8S.glob("*.yaml")):
        out.extend(d for d in _yaml_docs(p) if isinstance(d, dict) and "metadata" in d)
    return out


def _k8s(kind: str, name: str) -> dict:
    for obj in _k8s_objects():
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise AssertionError(f"no {kind} {name!r} in deploy/k8s")


def _ldp_services(compose: dict) -> dict[str, dict]:
    """Services running ``ldp-stream`` (the image with its entrypoint; an init step that overrides
    the entrypoint, such as ``collector-tokens``, runs a shell instead)."""
    return {n: s for n, s in compose["services"].items()
            if str(s.get("image", "")).startswith(LDP_IMAGE) and "entrypoint" not in s}


def _ldp_containers(pod: dict) -> list[dict]:
    """The containers of a pod spec that run ``ldp-stream`` (no ``command`` override)."""
    return [c for c in pod["containers"] if c["image"].startswith(LDP_IMAGE) and "command" not in c]


def _ldp_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after ``ldp-stream``) of every container running the ldp-stream image."""
    out = [(f"compose:{n}", [str(a) for a in s["command"]]) for n, s in _ldp_services(_compose()).items()]
    for obj in _k8s_objects():
        if obj["kind"] != "Deployment":
            continue
        for c in _ldp_containers(obj["spec"]["template"]["spec"]):
            out.append((f"k8s:{obj['metadata']['name']}/{c['name']}", [str(a) for a in c["args"]]))
    return out


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag:
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _cli_flags(subcommand: str) -> set[str]:
    """``--flags`` listed by ``ldp-stream <subcommand> --help`` (the real parser's help text)."""
    from aggregator.cli import build_parser

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as exc:
        build_parser().parse_args([subcommand, "--help"])
    assert exc.value.code == 0, f"ldp-stream {subcommand} --help failed"
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", buf.getvalue()))


def _subcommands() -> set[str]:
    from aggregator.cli import build_parser

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = buf.getvalue()
    block = text.split("positional arguments:", 1)[1].split("options:", 1)[0]
    names = set(re.findall(r"^ {4}([a-z][a-z0-9-]*)(?: {2,}|$)", block, re.M))
    assert "work" in names, text
    return names


# --------------------------------------------------------------------------- PromQL name extraction
_PROMQL_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
    "bool", "inf", "nan", "atan2",
}
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (or a Grafana ``label_values(metric, label)`` query).

    Removes string literals, label matchers ``{…}``, ranges/subqueries ``[…]``, the label lists
    of ``by/without/on/ignoring/group_left/group_right (…)``, then keeps identifiers that are
    neither function calls, keywords nor numbers/durations. Label-name arguments of
    ``label_values``/``label_replace``-like calls are string literals or bare names after the
    first argument; only ``label_values``'s first argument is a metric.
    """
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\blabel_values\s*\(\s*([A-Za-z_:][\w:]*)[^)]*\)", r"\1", s)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\$\w+|\$\{[^}]*\}", " ", s)  # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", s):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(name)
    return names


def family_name(series: str, histograms: set[str]) -> str:
    """Strip ``_bucket/_sum/_count`` when the rest is a histogram family."""
    for suf in _HISTOGRAM_SUFFIXES:
        if series.endswith(suf) and series[: -len(suf)] in histograms:
            return series[: -len(suf)]
    return series


def exposition_families(text: str) -> tuple[set[str], set[str]]:
    """(names usable in PromQL, histogram family names) from a Prometheus text exposition."""
    names: set[str] = set()
    histograms: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind.strip() == "histogram":
                histograms.add(name)
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][\w:]*", line).group(0))
    return names, histograms


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _dashboard_panels(dash: dict) -> list[dict]:
    """Every panel, rows and the panels of collapsed rows included, in file order."""
    out = []

    def walk(panels):
        for p in panels:
            out.append(p)
            walk(p.get("panels", []))

    walk(dash["panels"])
    return out


def _panel_exprs(panel: dict) -> str:
    return " ".join(t["expr"] for t in panel.get("targets", []) if t.get("expr"))


def _dashboard_exprs() -> list[str]:
    dash = _dashboard()
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        exprs.append(q["query"] if isinstance(q, dict) else q)
    return exprs


def _alert_exprs() -> list[str]:
    (doc,) = _yaml_docs(ALERTS)
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def test_promql_extraction_examples():
    hist = {"ldp_checkpoint_duration_seconds"}
    cases = {
        'sum by (reason) (increase(ldp_records_dead_lettered_total{job="w", reason=~"a|b"}[5m])) > 0':
            {"ldp_records_dead_lettered_total"},
        "histogram_quantile(0.95, sum by (le) (rate(ldp_checkpoint_duration_seconds_bucket[5m])))":
            {"ldp_checkpoint_duration_seconds_bucket"},
        'absent(up{job="ldp-worker"} == 1)': {"up"},
        "a_total / on (instance) group_left (x) b offset 5m and c unless d": {"a_total", "b", "c", "d"},
        "label_values(ldp_estimate, query)": {"ldp_estimate"},
        'ldp_estimate{query=~"$query"} * 1e3': {"ldp_estimate"},
        "deriv(ldp_consumer_lag_records[10m:1m])": {"ldp_consumer_lag_records"},
    }
    for expr, want in cases.items():
        assert promql_metric_names(expr) == want, expr
    assert family_name("ldp_checkpoint_duration_seconds_bucket", hist) == "ldp_checkpoint_duration_seconds"
    assert family_name("ldp_checkpoints_count", hist) == "ldp_checkpoints_count"


# ---------------------------------------------------------------------------------------- parsing
def test_every_yaml_and_json_file_in_deploy_parses():
    ymls = sorted([*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])
    jsons = sorted(DEPLOY.rglob("*.json"))
    assert len(ymls) >= 10 and jsons, (ymls, jsons)
    for p in ymls:
        docs = _yaml_docs(p)
        assert docs and all(isinstance(d, dict) for d in docs), p
    for p in jsons:
        assert isinstance(json.loads(p.read_text(encoding="utf-8")), dict), p
    for p in sorted(DEPLOY.rglob("*.toml")):
        tomllib.loads(p.read_text(encoding="utf-8"))


def test_pipeline_configs_load_and_match_the_example():
    from aggregator.config import PipelineConfig

    cfg = PipelineConfig.load(CONFIG)
    example = PipelineConfig.load(ROOT / "examples" / "flights.pipeline.toml")
    assert cfg.queries == example.queries
    assert cfg.schema_path.resolve() == example.schema_path.resolve()
    assert cfg.serve.host == "127.0.0.1", "0.0.0.0 must come from an explicit --host flag"
    secure = PipelineConfig.load(DEPLOY / "config" / "secure.pipeline.toml")
    assert secure.kafka.security_protocol == "SASL_SSL"
    # [collector]: loopback in the file, the token file at an absolute path of the container (a
    # relative one would resolve into the read-only config directory), one body fits a worker record
    for c in (cfg, secure):
        assert c.collector.host == "127.0.0.1", "0.0.0.0 must come from an explicit --host flag"
        assert c.collector.token_file is not None and c.collector.token_file.is_absolute()
        assert c.collector.max_body_bytes <= c.worker.max_record_bytes
    assert cfg.collector.token_file == secure.collector.token_file


# --------------------------------------------------------------------------------- docker compose
def test_compose_references_existing_services_files_and_ports():
    compose = _compose()
    services = compose["services"]
    assert {"kafka", "topic-init", "producer", "worker", "serve", "collector", "collector-tokens",
            "prometheus", "grafana"} <= set(services)
    named_volumes = set(compose.get("volumes") or {})
    pipe = _pipeline()
    for name, svc in services.items():
        deps = svc.get("depends_on") or []
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, f"{name} depends on unknown service {dep}"
        for vol in svc.get("volumes") or []:
            src = vol.split(":")[0]
            if src.startswith((".", "/")):
                assert not src.startswith("/"), f"{name}: absolute host path {src}"
                assert (DEPLOY / src).exists(), f"{name}: mounted {src} does not exist"
            else:
                assert src in named_volumes, f"{name}: unknown volume {src}"
        if "build" in svc:
            ctx = (DEPLOY / svc["build"]["context"]).resolve()
            assert ctx == ROOT
            assert (ctx / svc["build"]["dockerfile"]).is_file()
        for port in svc.get("ports") or []:
            host_ip, host_port, container_port = str(port).split(":")
            assert host_ip == "127.0.0.1", f"{name}: host port {port} must bind loopback only"
            assert host_port.isdigit() and container_port.isdigit()

    # workers scale: no fixed name, no host port, 2 replicas by default
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker
    assert worker["deploy"]["replicas"] == 2
    # published container ports are ones the services listen on
    serve_cmd = [str(a) for a in services["serve"]["command"]]
    serve_port = _flag_value(serve_cmd, "--port")
    assert services["serve"]["ports"] == [f"127.0.0.1:{pipe['serve']['port']}:{serve_port}"]
    assert _flag_value(serve_cmd, "--host") == "0.0.0.0"
    kafka_env = services["kafka"]["environment"]
    listeners = kafka_env["KAFKA_LISTENERS"]
    for port in services["kafka"]["ports"]:
        assert f"://:{str(port).split(':')[-1]}" in listeners
    assert services["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]
    assert services["grafana"]["ports"] == ["127.0.0.1:3000:3000"]
    # clients bootstrap through an advertised listener of the kafka service
    for server in pipe["kafka"]["bootstrap_servers"].split(","):
        assert f"PLAINTEXT://{server}" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]
        assert server.split(":")[0] in services
    # topic init creates exactly the config's topics and partition count
    env = services["topic-init"]["environment"]
    assert env["BOOTSTRAP"] == pipe["kafka"]["bootstrap_servers"]
    assert int(env["REPORTS_PARTITIONS"]) == pipe["topics"]["partitions"]
    assert (env["REPORTS_TOPIC"], env["STATE_TOPIC"], env["DEAD_LETTER_TOPIC"]) == (
        pipe["topics"]["reports"], pipe["topics"]["state"], pipe["topics"]["dead_letter"])
    script = services["topic-init"]["entrypoint"][-1]
    mounts = dict(v.split(":")[1::-1] for v in services["topic-init"]["volumes"])
    assert (DEPLOY / mounts[script]).is_file()
    for deps in (services["worker"]["depends_on"], services["serve"]["depends_on"],
                 services["producer"]["depends_on"], services["collector"]["depends_on"]):
        assert deps["topic-init"]["condition"] == "service_completed_successfully"


def _container_path_exists(path: str, volumes: list[str]) -> bool:
    """Whether a path inside an ldp-stream container exists: bind-mounted or COPY'd to /app."""
    for vol in volumes:
        src, dst = vol.split(":")[:2]
        if path == dst or path.startswith(dst.rstrip("/") + "/"):
            return (DEPLOY / src / Path(path).relative_to(dst)).exists()
    if path.startswith(IMAGE_ROOT + "/"):
        rel = Path(path).relative_to(IMAGE_ROOT)
        copied = re.findall(r"^COPY\s+(\S+)\s+\./(\S+)$", (DEPLOY / "Dockerfile").read_text(), re.M)
        return any(str(rel).startswith(dst) and (ROOT / src).exists() for src, dst in copied) and (
            ROOT / rel).exists()
    return False


def test_compose_config_paths_exist_in_the_container():
    compose = _compose()
    for name, svc in _ldp_services(compose).items():
        cfg = _flag_value([str(a) for a in svc["command"]], "--config")
        assert cfg, f"{name} has no --config"
        assert _container_path_exists(cfg, svc.get("volumes") or []), f"{name}: {cfg} missing"
        assert Path(cfg).relative_to(IMAGE_ROOT) == CONFIG.relative_to(ROOT)


def _compose_cli() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        r = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return cmd
    return None


def test_docker_compose_config_succeeds():
    cmd = _compose_cli()
    if cmd is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    r = subprocess.run([*cmd, "-f", str(COMPOSE), "config"], capture_output=True, text=True,
                       timeout=120, cwd=DEPLOY)
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load(r.stdout)
    assert set(resolved["services"]) == set(_compose()["services"])
    # anchors/merge keys resolved: every ldp-stream service builds the same image
    assert {s["image"] for s in _ldp_services(resolved).values()} == {"ldp-stream:0.1.0"}


def test_dockerfile_builds_one_non_root_image_with_pip_install():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^RUN pip install \.", text, re.M)
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert re.search(r'^ENTRYPOINT \["ldp-stream"\]', text, re.M)
    # the numba kernels are compiled at build time into a cache the runtime user owns
    assert re.search(r"^ENV NUMBA_CACHE_DIR=\S+", text, re.M)
    assert re.search(r"python -m aggregator\.warm\b", text)
    for src in re.findall(r"^COPY\s+(.+)\s+\S+$", text, re.M):
        for s in src.split():
            assert (ROOT / s).exists(), f"COPY {s}: not in the repository"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    for pkg in packages:
        assert re.search(rf"^COPY {pkg.rstrip('*')} ", text, re.M), f"package {pkg} not copied"


# ------------------------------------------------------------------------------- CLI flags used
def test_container_commands_use_real_cli_options():
    commands = _ldp_commands()
    assert len(commands) >= 5, commands
    available = _subcommands()
    flags: dict[str, set[str]] = {}
    pending = set()
    for where, argv in commands:
        sub = argv[0]
        if sub == "produce" and sub not in available:
            pending.add(where)  # aggregator/cli/produce.py is being written: checked once it exists
            continue
        assert sub in available, f"{where}: `ldp-stream {sub}` does not exist (have {sorted(available)})"
        if sub not in flags:
            flags[sub] = _cli_flags(sub)
        used = {a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")}
        unknown = used - flags[sub]
        assert not unknown, f"{where}: ldp-stream {sub} has no {sorted(unknown)}"
    assert {"produce", "work", "serve", "collect"} <= {argv[0] for _, argv in commands}
    if pending:
        pytest.skip(f"`ldp-stream produce` is not registered yet; not checked: {sorted(pending)}")


def test_serve_binds_loopback_unless_told_otherwise():
    from aggregator.config import ServeSection

    assert ServeSection().host == "127.0.0.1"
    from aggregator.cli import build_parser

    args = build_parser().parse_args(["serve", "--config", "x.toml"])
    assert args.host in (None, "127.0.0.1")
    args = build_parser().parse_args(["work", "--config", "x.toml"])
    assert args.metrics_host == "127.0.0.1"
    from aggregator.collector.config import CollectorSection

    assert CollectorSection().host == "127.0.0.1"
    assert build_parser().parse_args(["collect", "--config", "x.toml"]).host is None
    for where, argv in _ldp_commands():
        if argv[0] in ("serve", "collect"):
            assert _flag_value(argv, "--host") == "0.0.0.0", where


# ---------------------------------------------------------------------------- Prometheus/Grafana
def test_prometheus_targets_are_compose_services_and_ports():
    (prom,) = _yaml_docs(PROM)
    services = _compose()["services"]
    pipe = _pipeline()
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    worker = jobs["ldp-worker"]
    (sd,) = worker["dns_sd_configs"]
    assert sd["names"] == ["worker"] and sd["type"] == "A"
    worker_cmd = [str(a) for a in services["worker"]["command"]]
    metrics_port = int(_flag_value(worker_cmd, "--metrics-port") or pipe["worker"]["metrics_port"])
    assert sd["port"] == metrics_port == pipe["worker"]["metrics_port"]
    assert str(metrics_port) in [str(p) for p in services["worker"]["expose"]]
    assert _flag_value(worker_cmd, "--metrics-host") == "0.0.0.0"
    (static,) = jobs["ldp-serve"]["static_configs"]
    assert static["targets"] == [f"serve:{pipe['serve']['port']}"]
    (static,) = jobs["ldp-collector"]["static_configs"]
    assert jobs["ldp-collector"].get("metrics_path", "/metrics") == "/metrics"
    assert static["targets"] == [f"collector:{pipe['collector']['port']}"]
    assert _flag_value([str(a) for a in services["collector"]["command"]], "--port") == str(
        pipe["collector"]["port"])
    for rf in prom["rule_files"]:
        assert (PROM.parent / rf).is_file()
    mounts = [v.split(":")[:2] for v in services["prometheus"]["volumes"]]
    container = {dst: src for src, dst in mounts}
    assert container["/etc/prometheus/prometheus.yml"] == "./prometheus/prometheus.yml"
    for rf in prom["rule_files"]:
        assert f"/etc/prometheus/{rf}" in container


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard():
    services = _compose()["services"]
    (ds_doc,) = _yaml_docs(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    (ds,) = ds_doc["datasources"]
    host, port = re.match(r"http://([\w-]+):(\d+)$", ds["url"]).groups()
    assert host in services and f"127.0.0.1:{port}:{port}" in services[host]["ports"]
    (prov_doc,) = _yaml_docs(DEPLOY / "grafana" / "provisioning" / "dashboards" / "ldp-stream.yml")
    (prov,) = prov_doc["providers"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert (DEPLOY / mounts[prov["options"]["path"]] / DASHBOARD.name).is_file()
    assert (DEPLOY / mounts["/etc/grafana/provisioning"]).is_dir()
    dash = json.loads(DASHBOARD.read_text())
    uids = set()

    def walk(panels):
        for p in panels:
            for obj in [p, *p.get("targets", [])]:
                if isinstance(obj.get("datasource"), dict):
                    uids.add(obj["datasource"]["uid"])
            walk(p.get("panels", []))

    walk(dash["panels"])
    assert uids == {ds["uid"]}
    exprs = " ".join(_dashboard_exprs())
    for needed in ("ldp_estimate", "ldp_estimate_ci_lower", "ldp_estimate_ci_upper",
                   "rate(ldp_reports_processed_total", "ldp_consumer_lag_records",
                   "ldp_records_dead_lettered_total", "ldp_checkpoint_duration_seconds",
                   'ldp_window_estimate{query=~"$window_query"', "ldp_window_estimate_ci_lower",
                   "ldp_window_estimate_ci_upper", "ldp_window_estimate_stderr", "ldp_window_reports",
                   "time() - ldp_window_end_timestamp_seconds",
                   "sum by (query) (rate(ldp_reports_late_total[5m]))",
                   "label_values(ldp_window_estimate, query)",
                   "rate(ldp_collector_reports_accepted_total",
                   "sum by (outcome) (rate(ldp_collector_batches_total",
                   "sum by (reason) (rate(ldp_collector_refused_total",
                   "histogram_quantile(0.5, sum by (le) (rate(ldp_collector_request_seconds_bucket",
                   "histogram_quantile(0.99, sum by (le) (rate(ldp_collector_request_seconds_bucket",
                   "ldp_collector_inflight_bytes", "ldp_collector_token_reloads_total",
                   'up{job="ldp-collector"}'):
        assert needed in exprs, needed
    assert "by (partition)" in exprs and "by (reason)" in exprs


_GRAFANA_VARIABLES = {"__all", "__interval", "__interval_ms", "__rate_interval", "__range",
                      "__range_s", "__dashboard", "__from", "__to", "__name", "__org", "__user"}


def _row_of(panels: list[dict], panel: dict) -> str:
    """Title of the row a top-level panel sits in (the last row above it)."""
    rows = [p for p in panels if p["type"] == "row" and p["gridPos"]["y"] <= panel["gridPos"]["y"]]
    return max(rows, key=lambda r: r["gridPos"]["y"])["title"] if rows else ""


def test_dashboard_layout_ids_variables_and_ci_bands():
    dash = _dashboard()
    panels = _dashboard_panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    # no two panels overlap; a panel repeated horizontally fills its line up to the right edge
    cells: dict[tuple[int, int], int] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] >= 1 and g["x"] + g["w"] <= 24, (p["id"], g)
        right = 24 if p.get("repeat") and p.get("repeatDirection", "h") == "h" else g["x"] + g["w"]
        for y in range(g["y"], g["y"] + g["h"]):
            for x in range(g["x"], right):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {p['id']} overlap at {(x, y)}"
                cells[(x, y)] = p["id"]
    # every $variable used is defined (or a Grafana built-in)
    defined = {v["name"] for v in dash["templating"]["list"]}
    texts = [json.dumps(p) for p in panels] + [json.dumps(dash["templating"])]
    used = {m.group(1) or m.group(2) for t in texts for m in re.finditer(r"\$\{(\w+)[^}]*\}|\$(\w+)", t)}
    assert used - defined - _GRAFANA_VARIABLES == set(), used - defined
    assert {p["repeat"] for p in panels if p.get("repeat")} <= defined
    # the windowed queries have their own variables: ldp_estimate does not carry them
    var = {v["name"]: v for v in dash["templating"]["list"]}
    assert var["window_query"]["query"]["query"] == "label_values(ldp_window_estimate, query)"
    assert "ldp_window_estimate{" in var["window_param"]["query"]["query"]
    # rows: the window panels sit in the windows row, late reports in the workers row
    top = dash["panels"]
    titles = {p["title"] for p in top if p["type"] == "row"}
    assert "Windows (event time)" in titles
    for p in top:
        e = _panel_exprs(p)
        if "ldp_window_estimate" in e or "ldp_window_reports" in e or "ldp_window_end_timestamp" in e:
            assert _row_of(top, p) == "Windows (event time)", p["title"]
            assert "$window_query" in e, p["title"]
        if "ldp_reports_late_total" in e:
            assert _row_of(top, p).startswith("Workers"), p["title"]
        if "ldp_collector_" in e or "ldp-collector" in e:
            assert _row_of(top, p).startswith("Collector"), p["title"]
    # every panel drawing confidence bounds draws them alike: dashed, the scalar bands filled
    ci_panels = [p for p in panels if "_ci_upper" in _panel_exprs(p)]
    assert len(ci_panels) >= 2
    for p in ci_panels:
        assert p["fieldConfig"]["overrides"] == ci_panels[0]["fieldConfig"]["overrides"], p["title"]
        legends = {t["legendFormat"] for t in p["targets"]}
        assert {"{{param}}", "{{param}} ci_low", "{{param}} ci_high"} <= legends, p["title"]
    fills = [(o["matcher"]["options"], pr["value"]) for o in ci_panels[0]["fieldConfig"]["overrides"]
             for pr in o["properties"] if pr["id"] == "custom.fillBelowTo"]
    assert fills and all(hi.endswith(" ci_high") and lo == hi[: -len("high")] + "low" for hi, lo in fills)


def test_alert_rules_cover_the_required_conditions():
    (doc,) = _yaml_docs(ALERTS)
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    assert {"LdpConsumerLagGrowing", "LdpDeadLetters", "LdpNoCheckpoint", "LdpWorkerDown"} <= set(rules)
    assert {"LdpCollectorDown", "LdpCollectorRefusingOnItsSide", "LdpCollectorRefusingDevices",
            "LdpCollectorSlow", "LdpCollectorNoAcceptedReports", "LdpCollectorTokenReloadFailed",
            "LdpCollectorIdempotencyEvictions"} <= set(rules)
    assert 'up{job="ldp-collector"}' in rules["LdpCollectorDown"]["expr"]
    assert "ldp_collector_request_seconds_bucket" in rules["LdpCollectorSlow"]["expr"]
    assert "ldp_collector_reports_accepted_total" in rules["LdpCollectorNoAcceptedReports"]["expr"]
    assert "ldp_consumer_lag_records" in rules["LdpConsumerLagGrowing"]["expr"]
    assert "ldp_records_dead_lettered_total" in rules["LdpDeadLetters"]["expr"]
    assert "ldp_checkpoints_total[5m]" in rules["LdpNoCheckpoint"]["expr"]
    assert 'up{job="ldp-worker"}' in rules["LdpWorkerDown"]["expr"]
    late = rules["LdpLateReports"]
    assert "increase(ldp_reports_late_total[10m])" in late["expr"] and "by (query)" in late["expr"]
    assert late["labels"]["severity"] == "warning" and late.get("for")
    assert "grace" in late["annotations"]["description"]
    for name, rule in rules.items():
        assert {"summary", "description"} <= set(rule["annotations"]), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name


def test_every_alert_has_a_unit_test():
    (doc,) = _yaml_docs(ALERTS)
    rules = {r["alert"] for g in doc["groups"] for r in g["rules"]}
    (tests,) = _yaml_docs(ALERT_TESTS)
    assert tests["rule_files"] == [ALERTS.name]
    tested = {a["alertname"] for t in tests["tests"] for a in t["alert_rule_test"]}
    firing = {a["alertname"] for t in tests["tests"] for a in t["alert_rule_test"] if a["exp_alerts"]}
    assert rules <= tested, f"alerts without a test in {ALERT_TESTS.name}: {sorted(rules - tested)}"
    assert {"LdpLateReports", "LdpDeadLetters", "LdpNoCheckpoint"} <= firing
    assert {r for r in rules if r.startswith("LdpCollector")} <= firing


def test_promtool_checks_config_and_alert_unit_tests():
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`)")
    d = PROM.parent
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"],
                 ["test", "rules", "alerts.test.yml"]):
        r = subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=d, timeout=120)
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"


# ------------------------------------------------------------------------- metric names are real
@pytest.fixture(scope="module")
def worker_exposition():
    """Scrape a worker built from the deploy config exactly like ``ldp-stream work`` builds it."""
    from aggregator.config import PipelineConfig
    from aggregator.metrics import WORKER_METRIC_NAMES, WorkerMetrics, read_metrics, start_metrics_server
    from aggregator.worker import worker_from_config

    cfg = PipelineConfig.load(CONFIG)
    metrics = WorkerMetrics()
    worker = worker_from_config(cfg, metrics=metrics)  # constructing does not connect
    assert worker.metrics is metrics
    before, _ = exposition_families(metrics.exposition().decode())
    # every declared family is registered at construction (nothing appears only once running)
    assert set(WORKER_METRIC_NAMES) <= before
    server, _ = start_metrics_server(metrics.registry, 0, host="127.0.0.1")
    try:
        return read_metrics(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10)
    finally:
        server.shutdown()
        server.server_close()


def _encoded_records(schema, n_records: int, per_record: int, seed: int) -> list[bytes]:
    from ingest.client.codec import encode
    from ingest.client.privatizer import Privatizer

    rng = np.random.default_rng(seed)
    priv = Privatizer(schema, rng=rng)
    out = []
    for _ in range(n_records):
        cols = {f.name: rng.uniform(f.low, f.high, per_record) for f in schema.numeric.fields}
        for c in schema.categorical:
            cats = np.asarray(list(c.categories), dtype=object)
            cols[c.name] = cats[rng.integers(0, len(cats), per_record)]
        if schema.event_time is not None:  # one hour of 2013 per record
            cols[schema.event_time.field] = np.full(per_record, 1356998400 + 3600 * len(out))
        out.append(encode(priv.privatize_batch(cols), time_resolution=schema.time_resolution_s))
    return out


#: Windowed queries of the demo pipeline (docs/windows.md §2), added to the deploy config's
#: queries by ``serve_exposition`` where it does not have them.
_WINDOWED_QUERIES = (
    {"kind": "mean", "name": "arr_delay_mean_daily", "field": "arr_delay",
     "window": {"size": "1d", "grace": "6h"}},
    {"kind": "frequency", "name": "carrier_weekly", "field": "carrier",
     "window": {"size": "7d", "hop": "1d", "grace": "6h"}},
)
#: Event time of the reports of record i: 2013-01-01T01:00:00Z + i days.
_DAY0 = 1_356_998_400


def _record_event_time(i: int) -> int:
    return _DAY0 + i * 86_400 + 3_600


@pytest.fixture(scope="module")
def serve_runtime():
    """The deploy config's runtime, with the demo's windowed queries if it has none."""
    from aggregator.config import PipelineConfig
    from aggregator.worker import PipelineRuntime

    data = _pipeline()
    have = {q["name"] for q in data["queries"]}
    if not any("window" in q for q in data["queries"]):
        data["queries"] = [*data["queries"], *(dict(q) for q in _WINDOWED_QUERIES if q["name"] not in have)]
    runtime = PipelineRuntime.from_config(PipelineConfig.from_dict(data, base_dir=CONFIG.parent))
    assert runtime.windowed
    return runtime


@pytest.fixture(scope="module")
def serve_exposition(serve_runtime):
    """Scrape ``GET /metrics`` of serve's app (uvicorn on 127.0.0.1) holding real estimates and,
    for the windowed queries, final windows: record i holds 200 reports at event time
    :func:`_record_event_time` (set as the worker sets it), one partition, no reports topic (the
    partition holds windows open until its watermark passes them)."""
    from aggregator.metrics import read_metrics
    from aggregator.serve import EstimateStore, build_app
    from aggregator.worker import PartitionState
    from ingest.client.batch import with_event_time

    runtime = serve_runtime
    records = _encoded_records(runtime.schema, n_records=4, per_record=200, seed=20240)
    st = PartitionState(0, len(records), runtime.new_states(), reports=200 * len(records))
    for i, r in enumerate(records):
        b = runtime.decode(r)
        b = with_event_time(b, np.full(b.n, _record_event_time(i), dtype=np.int64))
        x2 = runtime.double(b, r)
        for s in st.states.values():
            s.update(b, x2)
    ck = st.to_checkpoint(runtime)
    store = EstimateStore(runtime)
    store.set_checkpoints({ck.key: ck.to_bytes()})
    with ServedApp(build_app(store), timeout=15) as srv:
        return read_metrics(f"{srv.url}/metrics", timeout=10)


def test_serve_exposes_estimate_gauges(serve_exposition):
    names, _ = exposition_families(serve_exposition)
    assert {"ldp_estimate", "ldp_estimate_ci_lower", "ldp_estimate_ci_upper"} <= names
    sample = r'^ldp_estimate\{param="[^"]+",query="arr_delay_mean"\} [-+0-9.e]+$'
    assert re.search(sample, serve_exposition, re.M)


def test_serve_exposes_the_latest_final_window(serve_runtime, serve_exposition):
    from aggregator.metrics import metric_value

    last = _record_event_time(3)
    for name in serve_runtime.windowed:
        w = serve_runtime.queries[name].window
        end = (last - w.grace_s) // w.hop_s * w.hop_s  # the last window end at or before the watermark
        n = 200 * sum(end - w.size_s <= _record_event_time(i) < end for i in range(4))
        label = f'query="{name}"'
        assert metric_value(serve_exposition, "ldp_window_end_timestamp_seconds", label) == end, name
        assert metric_value(serve_exposition, "ldp_window_reports", label) == n, name
        for gauge in ("ldp_window_estimate", "ldp_window_estimate_stderr", "ldp_window_estimate_ci_lower",
                      "ldp_window_estimate_ci_upper"):
            assert re.search(rf'^{gauge}\{{param="[^"]+",{label}\}} [-+0-9.e]+$', serve_exposition, re.M), \
                (gauge, name)
        # a windowed query has no cumulative gauges: the dashboard's $query never lists it
        assert not re.search(rf'^ldp_estimate\{{param="[^"]+",{label}\}}', serve_exposition, re.M), name


def _documented_metrics(table: str) -> set[str]:
    """Metric names in the first column of the docs/deploy.md table headed ``| metric (table) |``."""
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    block = text.split(f"| metric ({table}) |", 1)[1].split("\n\n", 1)[0]
    names = set()
    for line in block.splitlines()[2:]:
        first = line.split("|")[1]
        names.update(re.findall(r"`(ldp_\w+)", first))
    return names


def test_the_metric_tables_of_deploy_md_match_the_expositions(worker_exposition, serve_exposition):
    w_names, w_hist = exposition_families(worker_exposition)
    s_names, s_hist = exposition_families(serve_exposition)
    worker_doc, serve_doc = _documented_metrics("worker"), _documented_metrics("serve")
    assert worker_doc - w_names == set(), "documented as a worker metric, not exposed by a worker"
    assert serve_doc - s_names == set(), "documented as a serve metric, not exposed by serve"
    exposed = {family_name(n, w_hist | s_hist) for n in w_names | s_names if not n.endswith("_created")}
    assert exposed - worker_doc - serve_doc == set(), "exposed but not in docs/deploy.md, \"Metrics\""


def test_dashboard_and_alert_metric_names_are_registered(worker_exposition, serve_exposition,
                                                         collector_exposition):
    from aggregator.collector.metrics import COLLECTOR_METRIC_NAMES

    w_names, w_hist = exposition_families(worker_exposition)
    s_names, s_hist = exposition_families(serve_exposition)
    c_names, c_hist = exposition_families(collector_exposition)
    registered, histograms = w_names | s_names | c_names, w_hist | s_hist | c_hist
    builtin = {"up"}  # added by Prometheus to every target
    used: dict[str, set[str]] = {}
    for source, exprs in (("dashboard", _dashboard_exprs()), ("alerts", _alert_exprs())):
        for expr in exprs:
            for name in promql_metric_names(expr):
                used.setdefault(family_name(name, histograms), set()).add(source)
    assert len(used) >= 8, used
    unknown = {n: src for n, src in used.items() if n not in registered and n not in builtin}
    assert not unknown, f"metric names not exposed by worker or serve: {unknown}"
    # the worker-side names really come from the worker, the estimates from serve
    assert "ldp_reports_processed_total" in w_names and "ldp_estimate" in s_names
    assert {"ldp_reports_late_total", "ldp_window_pane_records_total"} <= w_names
    assert {"ldp_window_estimate", "ldp_window_end_timestamp_seconds", "ldp_window_reports"} <= s_names
    # the collector's names come from the collector, all declared in aggregator/collector/metrics.py
    assert set(COLLECTOR_METRIC_NAMES) <= c_names
    collector_used = {n for n in used if n.startswith("ldp_collector_")}
    assert collector_used <= set(COLLECTOR_METRIC_NAMES), collector_used - set(COLLECTOR_METRIC_NAMES)
    assert collector_used == set(COLLECTOR_METRIC_NAMES), "a collector family on neither dashboard nor alerts"


# ---------------------------------------------------------------------------------- Kubernetes
def test_k8s_objects_are_complete_and_consistent():
    kinds = {(o["kind"], o["metadata"]["name"]) for o in _k8s_objects()}
    assert {("Deployment", "ldp-worker"), ("Deployment", "ldp-serve"), ("Service", "ldp-serve"),
            ("Deployment", "ldp-collector"), ("Service", "ldp-collector"),
            ("ConfigMap", "ldp-flights-pipeline"), ("ScaledObject", "ldp-worker")} <= kinds
    (kust,) = _yaml_docs(K8S / "kustomization.yaml")
    manifests = [p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"]
    assert sorted(kust["resources"]) == sorted(manifests)
    cm = _k8s("ConfigMap", "ldp-flights-pipeline")
    assert cm["data"]["flights.schema.toml"] == (ROOT / "examples" / "flights.schema.toml").read_text()
    pipe = tomllib.loads(cm["data"]["flights.pipeline.toml"])
    assert pipe["queries"] == _pipeline()["queries"]
    assert pipe["pipeline"]["schema"] in cm["data"]
    for dep in ("ldp-worker", "ldp-serve", "ldp-collector"):
        spec = _k8s("Deployment", dep)["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (c,) = _ldp_containers(pod)
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        vols = {v["name"]: v for v in pod["volumes"]}
        cfg = _flag_value(c["args"], "--config")
        (vol,) = [n for n, p in mounts.items() if cfg.startswith(p + "/")]
        assert vols[vol]["configMap"]["name"] == "ldp-flights-pipeline"
        assert Path(cfg).name in cm["data"]
        if c["securityContext"].get("readOnlyRootFilesystem"):
            # numba refuses to load or write its cache without a writable directory
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            cache = env.get("NUMBA_CACHE_DIR", "")
            writable = [n for n, p in mounts.items() if cache.startswith(p + "/") and "emptyDir" in vols[n]]
            assert writable, f"{dep}: NUMBA_CACHE_DIR {cache!r} is not on an emptyDir volume"
        ports = {p["containerPort"] for p in c["ports"]}
        if dep == "ldp-worker":
            assert int(_flag_value(c["args"], "--metrics-port")) in ports
            assert pipe["worker"]["metrics_port"] in ports
        else:
            assert int(_flag_value(c["args"], "--port")) in ports
    for name in ("ldp-serve", "ldp-collector"):
        svc = _k8s("Service", name)
        dep_spec = _k8s("Deployment", name)["spec"]
        assert svc["spec"]["selector"].items() <= dep_spec["template"]["metadata"]["labels"].items()
        (c,) = _ldp_containers(dep_spec["template"]["spec"])
        port_names = {p["name"] for p in c["ports"]}
        assert all(p["targetPort"] in port_names for p in svc["spec"]["ports"]), name


def test_keda_max_replicas_never_exceed_partitions():
    cm = _k8s("ConfigMap", "ldp-flights-pipeline")
    pipe = tomllib.loads(cm["data"]["flights.pipeline.toml"])
    so = _k8s("ScaledObject", "ldp-worker")
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == "ldp-worker"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= pipe["topics"]["partitions"]
    assert _k8s("Deployment", "ldp-worker")["spec"]["replicas"] <= pipe["topics"]["partitions"]
    (trig,) = spec["triggers"]
    assert trig["type"] == "kafka"
    md = trig["metadata"]
    assert md["topic"] == pipe["topics"]["reports"]
    assert md["consumerGroup"] == pipe["worker"]["group_id"]
    assert md["bootstrapServers"] == pipe["kafka"]["bootstrap_servers"]
    assert md["allowIdleConsumers"] == "false"
    assert "partition" in (K8S / "keda.yaml").read_text().split("apiVersion")[0]  # the comment says why
    # compose: the default worker count also stays within the partitions
    assert _compose()["services"]["worker"]["deploy"]["replicas"] <= _pipeline()["topics"]["partitions"]


# ------------------------------------------------------------------------------ Kafka security
_SECURITY_KEYS = ("security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
                  "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname")


def _secure_variants(tls_dir: Path):
    """The secure example config and an mTLS variant, with their TLS files (mounted at
    /etc/ldp-stream/tls in a deployment) moved to readable stand-ins in ``tls_dir``: the files
    are opened when a client is built."""
    from aggregator.config import PipelineConfig

    def here(path: str) -> str:
        local = tls_dir / Path(path).name
        local.write_text("-----BEGIN CERTIFICATE-----\n")
        return str(local)

    base = tomllib.loads((DEPLOY / "config" / "secure.pipeline.toml").read_text())
    assert base["kafka"]["ssl_cafile"].startswith("/etc/ldp-stream/tls/")
    base["kafka"]["ssl_cafile"] = here(base["kafka"]["ssl_cafile"])
    mtls = dict(base)
    mtls["kafka"] = {
        "bootstrap_servers": base["kafka"]["bootstrap_servers"], "security_protocol": "SSL",
        "ssl_cafile": here("/etc/ldp-stream/tls/ca.crt"),
        "ssl_certfile": here("/etc/ldp-stream/tls/client.crt"),
        "ssl_keyfile": here("/etc/ldp-stream/tls/client.key"), "ssl_password": "key-pass",
    }
    out = {}
    for name, data in (("sasl_ssl", base), ("mtls", mtls)):
        out[name] = PipelineConfig.from_dict(data, base_dir=DEPLOY / "config")
    return out


@pytest.mark.parametrize("variant", ["sasl_ssl", "mtls"])
def test_kafka_security_reaches_every_worker_and_serve_client(variant, monkeypatch, tmp_path):
    """The ``[kafka]`` TLS/SASL settings reach the worker's consumer, checkpoint producer and
    state reader, and serve's state reader (clients recorded instead of connecting)."""
    import kafka

    from aggregator.checkpoint import StateTopicReader
    from aggregator.worker import worker_from_config

    cfg = _secure_variants(tmp_path)[variant]
    want = {k: v for k, v in cfg.kafka.consumer_config().items() if k in _SECURITY_KEYS}
    assert want["security_protocol"] == cfg.kafka.security_protocol
    made: list[tuple[str, dict]] = []

    class Recorder:
        def __init__(self, *args, **kwargs):
            made.append((type(self).__name__, kwargs))

        def subscribe(self, *a, **k):
            pass

    class KafkaConsumer(Recorder):
        pass

    class KafkaProducer(Recorder):
        pass

    monkeypatch.setattr(kafka, "KafkaConsumer", KafkaConsumer)
    monkeypatch.setattr(kafka, "KafkaProducer", KafkaProducer)
    worker_from_config(cfg).open()  # builds the consumer, checkpoint producer and state reader
    assert sorted(kind for kind, _ in made) == ["KafkaConsumer", "KafkaConsumer", "KafkaProducer"]
    # serve's state-topic reader, built as aggregator/cli/serve.py builds it
    StateTopicReader.connect(cfg.kafka, cfg.topics.state, cfg.pipeline.name)
    assert len(made) == 4 and made[-1][0] == "KafkaConsumer"
    for kind, kwargs in made:
        got = {k: kwargs.get(k) for k in want}
        assert got == want, f"{variant}: {kind} is missing security settings"


# ------------------------------------------------------------------------------------ collector
@pytest.fixture(scope="module")
def collector_exposition(tmp_path_factory):
    """Scrape ``GET /metrics`` of a collector app (uvicorn on 127.0.0.1, a fake Kafka transport)
    that accepted one batch and refused one request, so the labelled families have children."""
    from aggregator.metrics import read_metrics
    from tests.aggregator.collector_support import Served, body

    srv = Served(tmp_path_factory.mktemp("collector"))
    try:
        status, _, _ = srv.post(body(5))
        assert status == 202
        status, _, _ = srv.post(body(5), key="k-2", headers=srv.headers("k-2", token="nope"))
        assert status == 401
        return read_metrics(f"http://127.0.0.1:{srv.port}/metrics", timeout=10)
    finally:
        srv.close()


def _collector_section(pipe: dict):
    from aggregator.collector.config import CollectorSection

    return CollectorSection(**pipe["collector"])


def _token_script(svc: dict) -> str:
    """The shell script of the compose token-file init step, ``$$`` unescaped."""
    assert svc["entrypoint"] == ["/bin/sh", "-c"]
    (script,) = svc["command"]
    return script.replace("$$", "$")


def test_compose_collector_service_ports_probe_and_token_file():
    services = _compose()["services"]
    pipe = _pipeline()
    section = _collector_section(pipe)
    col = services["collector"]
    cmd = [str(a) for a in col["command"]]
    assert cmd[0] == "collect" and _flag_value(cmd, "--host") == "0.0.0.0"
    port = int(_flag_value(cmd, "--port"))
    assert port == section.port
    assert col["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert "container_name" not in col and col["image"] == services["serve"]["image"]
    # the healthcheck asks /readyz on the port the collector listens on
    probe = " ".join(col["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/readyz" in probe
    # SIGTERM: requests in progress (ack_timeout_s + 1 s), then the producer flush (<= 30 s)
    grace = int(str(col["stop_grace_period"]).rstrip("s"))
    assert grace >= section.ack_timeout_s + 1 + min(section.delivery_timeout_s, 30.0)
    # the token file: a named volume, mounted read-only at the token file's directory, written
    # by the init step the collector waits for
    token_dir = str(section.token_file.parent)
    mounts = {v.split(":")[1]: v.split(":") for v in col["volumes"]}
    src, _, mode = mounts[token_dir]
    assert mode == "ro" and src in (_compose().get("volumes") or {})
    assert col["depends_on"]["collector-tokens"]["condition"] == "service_completed_successfully"
    init = services["collector-tokens"]
    assert init["image"] == col["image"] and init["restart"] == "no"
    init_mounts = {v.split(":")[1]: v.split(":")[0] for v in init["volumes"]}
    assert init_mounts[token_dir] == src
    script = _token_script(init)
    assert f"dst={section.token_file}" in script
    assert re.search(r"install -m 0600 -o 10001 -g 10001 ", script)
    # 10001 = the image's user (the collector runs as it and must be able to read the file)
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.findall(r"^USER\s+(\S+)", dockerfile, re.M)[-1] == "10001:10001"
    src_dir = init_mounts["/secrets"]
    assert (DEPLOY / src_dir).is_dir() and "*" in (DEPLOY / src_dir / ".gitignore").read_text()
    assert "deploy/secrets" in (DEPLOY / "Dockerfile.dockerignore").read_text()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="the init step chowns to uid 10001: needs root")
def test_compose_token_init_writes_a_file_the_collector_accepts(tmp_path):
    """Run the init step's script (paths moved into tmp_path): without a source file it mints a
    token; with one it copies it; both times the result is mode 0600, uid 10001, and loads."""
    from aggregator.collector.tokens import TokenStore, mint_token

    section = _collector_section(_pipeline())
    script = _token_script(_compose()["services"]["collector-tokens"])
    (tmp_path / "secrets").mkdir()
    (tmp_path / "vol").mkdir()
    script = script.replace(f"dst={section.token_file}", f"dst={tmp_path / 'vol' / section.token_file.name}")
    script = script.replace("src=/secrets/", f"src={tmp_path / 'secrets'}/")
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    dst = tmp_path / "vol" / section.token_file.name

    def run():
        r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        st = dst.stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 10001
        return r, TokenStore(dst)

    r, store = run()
    token = r.stdout.strip().splitlines()[0]
    assert store.authenticate(f"Bearer {token}").id == "compose-demo"
    inode = dst.stat().st_ino
    src = tmp_path / "secrets" / "collector.tokens"
    mint_token(src, "fleet-a")
    run()
    assert "fleet-a" in dst.read_text() and dst.stat().st_ino != inode  # replaced by rename


def test_k8s_collector_deployment_service_and_token_secret():
    cm = _k8s("ConfigMap", "ldp-flights-pipeline")
    pipe = tomllib.loads(cm["data"]["flights.pipeline.toml"])
    section = _collector_section(pipe)
    assert section.host == "127.0.0.1"
    dep = _k8s("Deployment", "ldp-collector")
    assert dep["spec"]["replicas"] >= 2
    pod = dep["spec"]["template"]["spec"]
    (c,) = _ldp_containers(pod)
    assert c["args"][0] == "collect" and _flag_value(c["args"], "--host") == "0.0.0.0"
    port = int(_flag_value(c["args"], "--port"))
    assert port == section.port
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == port
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/port"] == str(port) and ann["prometheus.io/path"] == "/metrics"
    # probes on the collector's own routes and port
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    for key in ("requests", "limits"):
        assert c["resources"][key].get("memory"), key
    assert c["resources"]["requests"].get("cpu")
    assert pod["terminationGracePeriodSeconds"] >= (
        section.ack_timeout_s + 1 + min(section.delivery_timeout_s, 30.0))
    # token_file sits on a read-only mount of an emptyDir that an init container fills from the
    # Secret (mounted 0400) with `install -m 0600`, as the image's user
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    token_dir = str(section.token_file.parent)
    assert mounts[token_dir].get("readOnly") is True
    tokens_vol = mounts[token_dir]["name"]
    assert "emptyDir" in vols[tokens_vol]
    secrets = [v for v in vols.values() if "secret" in v]
    (secret,) = secrets
    assert secret["secret"]["secretName"] == "ldp-collector-tokens"
    assert secret["secret"]["defaultMode"] in (0o400, 0o600)
    assert pod["securityContext"]["runAsUser"] == 10001
    (init,) = pod["initContainers"]
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert init_mounts[tokens_vol] == token_dir
    secret_file = f"{init_mounts[secret['name']]}/collector.tokens"
    assert " ".join(init["args"]) == f"install -m 0600 {secret_file} {section.token_file}"
    # the sidecar repeats the copy when the Secret changes, by rename
    (sync,) = [x for x in pod["containers"] if x["name"] == "tokens-sync"]
    script = " ".join(sync["args"])
    assert f"src={secret_file}" in script and f"dst={section.token_file}" in script
    assert 'install -m 0600 "$src" "$dst.new" && mv -f "$dst.new" "$dst"' in script
    for x in (init, sync, c):
        assert x["securityContext"]["readOnlyRootFilesystem"] is True, x["name"]
    # the Service keeps a client on one replica for longer than the idempotency window
    svc = _k8s("Service", "ldp-collector")["spec"]
    assert svc["sessionAffinity"] == "ClientIP"
    assert svc["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] > section.idempotency_window_s
    assert {p["port"] for p in svc["ports"]} == {port}
    text = (K8S / "collector.yaml").read_text()
    assert "sessionAffinity" in text.split("kind: Service", 1)[0].rsplit("---", 1)[-1]  # why: commented
    pdb = _k8s("PodDisruptionBudget", "ldp-collector")["spec"]
    assert pdb["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert pdb["minAvailable"] < dep["spec"]["replicas"]


def test_alert_refusal_reasons_are_collector_error_codes():
    """The ``reason=~`` lists of the refusal alerts name real error codes: the server-side alert
    every 5xx code, the device-side alert every 4xx code a device does not retry (and not 404/405,
    which no device sends) and every decoder reason."""
    from ingest.client.codec import DECODE_REASONS
    from ingest.device.http_protocol import ERROR_CODES, RETRYABLE_STATUSES

    (doc,) = _yaml_docs(ALERTS)
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}

    def reasons(name):
        (m,) = re.findall(r'reason=~"([^"]+)"', rules[name]["expr"])
        return set(m.split("|"))

    known = set(ERROR_CODES) | set(DECODE_REASONS)
    server = {c for c, st in ERROR_CODES.items() if st >= 500} | {"internal_error"}
    device = ({c for c, st in ERROR_CODES.items() if 400 <= st < 500 and st not in RETRYABLE_STATUSES
               and st not in (404, 405)} | set(DECODE_REASONS)) - {"internal_error"}
    assert reasons("LdpCollectorRefusingOnItsSide") == server
    assert reasons("LdpCollectorRefusingDevices") == device
    assert (server | device) <= known
