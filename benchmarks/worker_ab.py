"""The worker of this checkout against the worker of an earlier commit, on the same records in one run.

Run ``python -m benchmarks.worker_ab --base REV [--drop KIND,…] [--repeats 7] [--records 12000]``;
prints the passes and writes ``benchmarks/results/worker_ab_<REV>.json``.

A change that must not slow the worker down (a restructuring, a new state) is measured against the
commit before it on the same machine, in the same minutes and on the same records: one embedded
broker, one reports topic of ``--records`` records of 1000 reports, and per repeat three passes back
to back — the raw kafka-python consume loop, this checkout's worker and the base commit's worker
(the two workers in alternating order) — each worker in a fresh consumer group and state topic,
after one pass of each that is not kept (it compiles the base tree's kernels).
Reported: worker / raw per pass and their medians (the paired ratios of docs/benchmarks.md §3, so
that the machine's slow and fast phases cancel), and this checkout / base per repeat.

The base commit's tree is exported with ``git archive`` into a temporary directory and its worker
runs from there (its own ``benchmarks.pipeline _worker``, ``PYTHONPATH`` = that tree) with the
packages of this environment. Both workers read the base commit's demo pipeline and schema
(``examples/``) less the query kinds in ``--drop``: the reports carry the base schema's
fingerprint, which both decoders know (the wire format did not change). The query sets of the two
must match: a kind the base commit does not have must be dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._common import ROOT, machine_info, table, write_json

RECORD = 1000
#: Query kinds of the demo pipeline that ``--drop closed`` leaves out (the five closed-form and
#: count queries remain).
NOT_CLOSED = ("logistic_regression", "quantile_regression", "custom", "kmeans", "gaussian_mixture")

# Runs in the base tree: its own config writer, topic creation and group renaming.
_BASE_CONFIGS = r"""
import json, re, sys
from pathlib import Path
try:
    from benchmarks._pipeline_common import write_pipeline, load_config
except ImportError:
    from benchmarks.pipeline import write_pipeline, load_config
try:
    from aggregator.topics import ensure_topics
except ImportError:
    from aggregator.worker import ensure_topics
tmp, boot, tag, topic, drop, n = sys.argv[1:7]
drop = tuple(k for k in drop.split(",") if k)
base = write_pipeline(Path(tmp), boot, tag, drop_kinds=drop)
text = re.sub(r'reports = "[^"]*"', f'reports = "{topic}"', base.read_text(), count=1)
out = []
for i in range(int(n)):
    t = re.sub(r'(group_id|state|dead_letter) = "([^"]*)"', rf'\1 = "\2-b{i}"', text)
    p = Path(tmp) / f"{tag}.b{i}.pipeline.toml"
    p.write_text(t)
    ensure_topics(load_config(p))
    out.append(str(p))
print(json.dumps({"configs": out, "schema": str(Path("examples/flights.schema.toml").resolve())}))
"""


def export_tree(rev: str, dest: Path) -> str:
    """Export commit ``rev`` of this repository into ``dest``; returns its full hash."""
    full = subprocess.run(["git", "rev-parse", "--verify", rev + "^{commit}"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dest.mkdir(parents=True)
    with subprocess.Popen(["git", "archive", full], cwd=ROOT, stdout=subprocess.PIPE) as archive:
        subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
        archive.stdout.close()
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {rev} failed")
    return full


def _worker_pass(tree: Path, cfg: Path, tmp: Path, tag: str, max_reports: int) -> dict:
    """One pass of ``tree``'s timed worker (its ``python -m benchmarks.pipeline _worker``)."""
    from benchmarks import pipeline as P
    from benchmarks._pipeline_common import reap

    proc, files = P._run_worker(tmp, cfg, tag, max_reports, tree=tree)
    reap([proc], 1800)
    if not files["out"].exists():
        raise RuntimeError(f"the worker of {tree} wrote no result; see {files['log']}")
    out = json.loads(files["out"].read_text())
    if out["reports"] != max_reports:
        raise RuntimeError(f"the worker of {tree} folded {out['reports']} of {max_reports} reports; "
                           f"see {files['log']}")
    return out


def _rate(out: dict) -> float:
    return out["reports"] / (out["last"] - out["first"])


def run(base: str, drop: tuple[str, ...], repeats: int, n_records: int) -> dict:
    """Measure (module docstring); returns the results dict."""
    from aggregator.topics import ensure_topics
    from benchmarks import pipeline as P
    from benchmarks._pipeline_common import load_config, raw_produce, stream_records, write_pipeline
    from benchmarks.produce import report_pool
    from ingest.client.schema import TelemetrySchema
    from ingest.local.broker import EmbeddedBroker

    tmp = Path(tempfile.mkdtemp(prefix="ldp-ab-"))
    tree = tmp / "base"
    full = export_tree(base, tree)
    tag = f"ab{time.monotonic_ns()}"
    passes = []
    with EmbeddedBroker() as broker:
        boot = broker.bootstrap_servers
        topic = f"bench.{tag}.reports"
        made = subprocess.run([sys.executable, "-c", _BASE_CONFIGS, str(tmp), boot, tag + "b", topic,
                               ",".join(drop), str(repeats + 1)], cwd=tree, check=True, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(tree)})
        made = json.loads(made.stdout.strip().splitlines()[-1])
        schema = TelemetrySchema.load(made["schema"])
        # this checkout's config: its demo pipeline less ``drop``, on the base schema and topic
        cfg = write_pipeline(tmp, boot, tag, drop_kinds=drop)
        text = re.sub(r'schema = "[^"]*"', f'schema = "{made["schema"]}"', cfg.read_text(), count=1)
        cfg.write_text(re.sub(r'reports = "[^"]*"', f'reports = "{topic}"', text, count=1))
        config = load_config(cfg)
        ensure_topics(config)
        pool = report_pool(schema, 100_000)
        raw_produce(boot, topic, stream_records(pool, RECORD, n_records), n_records)
        trim = config.worker.malloc_trim_threshold_mib
        n = n_records * RECORD
        # one pass of each worker first, not kept: it compiles the base tree's numba kernels into
        # that tree's cache (this checkout's are compiled by ``make``)
        _worker_pass(ROOT, P._fresh_group(tmp, cfg, "hw"), tmp, f"{tag}.hw", n)
        _worker_pass(tree, Path(made["configs"][repeats]), tmp, f"{tag}.bw", n)
        for i in range(repeats):
            raw = P._raw_pass(tmp, boot, topic, n_records, f"{tag}.{i}", trim)
            order = ("head", "base") if i % 2 == 0 else ("base", "head")
            got = {}
            for who in order:
                if who == "head":
                    got[who] = _worker_pass(ROOT, P._fresh_group(tmp, cfg, f"h{i}"), tmp, f"{tag}.h{i}", n)
                else:
                    got[who] = _worker_pass(tree, Path(made["configs"][i]), tmp, f"{tag}.b{i}", n)
            r_raw = n / (raw["last"] - raw["first"])
            row = {"raw": r_raw, "head": _rate(got["head"]), "base": _rate(got["base"]), "order": order,
                   "head_cpu_s": got["head"]["cpu_last"] - got["head"]["cpu_first"],
                   "base_cpu_s": got["base"]["cpu_last"] - got["base"]["cpu_first"]}
            passes.append(row)
            print(f"  repeat {i + 1}/{repeats}: raw {r_raw:,.0f}/s, this checkout {row['head']:,.0f}/s "
                  f"({row['head'] / r_raw:.0%}), base {row['base']:,.0f}/s ({row['base'] / r_raw:.0%})",
                  flush=True)
        queries = [q.name for q in config.queries]
    med = lambda k: float(np.median([p[k] / p["raw"] for p in passes]))  # noqa: E731
    return {
        "base": full, "head": _head(), "drop": list(drop), "queries": queries, "records": n_records,
        "reports_per_record": RECORD, "repeats": repeats, "passes": passes,
        "head_vs_raw_paired_median": med("head"), "base_vs_raw_paired_median": med("base"),
        "head_vs_base_paired_median": float(np.median([p["head"] / p["base"] for p in passes])),
    }


def _head() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def _drop(text: str) -> tuple[str, ...]:
    if text == "closed":
        return NOT_CLOSED
    kinds = tuple(k for k in text.split(",") if k)
    bad = [k for k in kinds if not re.fullmatch(r"[a-z_]+", k)]
    if bad:
        raise argparse.ArgumentTypeError(f"query kinds are lower-case words, got {bad}")
    return kinds


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {v}")
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (any git revision)")
    ap.add_argument("--drop", type=_drop, default=(),
                    help="query kinds to leave out of both pipelines, comma-separated, or 'closed' "
                         "(keep only the closed-form and count queries)")
    ap.add_argument("--repeats", type=_positive, default=7, help="raw / worker / worker repeats (default 7)")
    ap.add_argument("--records", type=_positive, default=12_000,
                    help="records of 1000 reports per pass (default 12000)")
    args = ap.parse_args(argv)
    start = machine_info()
    try:
        res = run(args.base, args.drop, args.repeats, args.records)
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(map(str, exc.cmd[:3]))}… failed: {(exc.stderr or '').strip()[-500:]}",
              file=sys.stderr)
        return 2
    cmd = (f"python -m benchmarks.worker_ab --base {args.base}"
           + (f" --drop {','.join(args.drop)}" if args.drop else "")
           + f" --repeats {args.repeats} --records {args.records}")
    res = {"command": cmd, "machine_start": start, **res, "machine_end": machine_info()}
    print(table(["", "paired median"],
                [("this checkout / raw", f"{res['head_vs_raw_paired_median']:.3f}"),
                 (f"base {res['base'][:10]} / raw", f"{res['base_vs_raw_paired_median']:.3f}"),
                 ("this checkout / base", f"{res['head_vs_base_paired_median']:.3f}")],
                title=f"{len(res['queries'])} queries: {', '.join(res['queries'])}"))
    path = write_json(f"worker_ab_{res['base'][:7]}", res)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
