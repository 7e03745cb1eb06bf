"""The demo's regressions on the 2013 flights: the worker's online estimates against ``analyze``.

Run ``python -m benchmarks.flights_online [--limit N] [--partitions 4,1] [--seeds S1,S2,…]
[--queries Q1,Q2,…] [--truth]``;
prints a table per (seed, partitions) and writes ``benchmarks/results/flights_online[_<N>].json``.

Every flight is privatized with ``examples/flights.schema.toml`` (seeded), encoded in records of
1000 reports, and the records are dealt round-robin to the partitions. Each partition's records go
through the worker's own path — ``PipelineRuntime.decode_many`` and ``double_many`` (X̃₂ drawn from
the record bytes), then every state's ``update``, in polls of 500 records — and the partition
states are merged as serve merges checkpoints. The batch reference is
``aggregator.analyze.analyze_query`` over the same records (``replay_records``), the fit
``ldp-stream analyze`` runs. Kafka moves the same bytes in the same order per partition
(exactly-once is tested elsewhere), so it is left out.

Reported per parameter of the queries (default the regressions ``late_arrival_logit`` and
``arr_on_dep_median``; ``--queries`` may add the k-means query ``flight_clusters``): online value ±
stderr, batch value ± stderr, online SE / batch SE, and (online − batch) / batch SE; with
``--truth``, also each one's error against the fit of the raw (unprivatized) flights
(``aggregator.demo.truth``) in units of its own SE, and whether its 95 % interval covers it.

With more than one partition, also the **pooled partition fits**: every partition's batch fit of
all its reports (a state whose warm-up is the whole partition), merged as serve merges states —
the estimate a renewal that matched its partition's batch fit exactly would give, so
|pooled partition fits − batch| is what pooling per-partition fits costs by itself. And the
**pooled warm-up fits**: the fits of every partition's first ``warm_up`` reports that its renewal
starts from, merged likewise. The table gives signed differences (estimate − batch) / batch SE.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks._common import table, write_json

QUERIES = ("late_arrival_logit", "arr_on_dep_median")
#: The queries ``--queries`` may name.
KNOWN = (*QUERIES, "flight_clusters")
RECORD = 1000
POLL = 500


def records_of_flights(schema, limit: int | None, seed: int) -> tuple[list[bytes], dict]:
    """The demo's privatized flights (``aggregator.demo.run._prepare``, seeded) as encoded records
    of :data:`RECORD` reports, and the raw values of the flights kept."""
    from aggregator.demo.run import _prepare
    from ingest.client.batch import slice_batch
    from ingest.client.codec import encode

    prepared = _prepare(schema, limit, rng=seed)
    records = [encode(slice_batch(b, s, min(s + RECORD, b.n)), time_resolution=schema.time_resolution_s)
               for b in prepared.batches for s in range(0, b.n, RECORD)]
    return records, prepared.raw


def fold_partition(runtime, records: list[bytes], states: dict | None = None) -> dict:
    """The states of one partition after its records, folded as the worker folds a poll
    (``states``: these, else the runtime's new states)."""
    states = runtime.new_states() if states is None else states
    for s in range(0, len(records), POLL):
        poll = records[s:s + POLL]
        batch, counts = runtime.decode_many(poll)
        x2 = runtime.double_many(batch, poll, counts)
        for st in states.values():
            st.update(batch, x2)
    return states


def _query_states(runtime, config, queries: tuple[str, ...], **renewable) -> dict:
    """New states of ``queries`` with ``renewable`` options changed."""
    from aggregator.state import build_state

    states = {}
    for name in queries:
        q = next(x for x in config.queries if x.name == name)
        if renewable:
            q = q.model_copy(update={"renewable": q.renewable.model_copy(update=renewable)})
        states[name] = build_state(q, runtime.schema, loss=config.losses.get(name))
    return states


def warm_up_fit_states(runtime, config, parts: list[list[bytes]], queries: tuple[str, ...]) -> list[dict]:
    """Per partition, the states of ``queries`` after the records of its first ``warm_up``
    reports only: each holds the warm-up fit the renewal starts from."""
    out = []
    for p in parts:
        states = _query_states(runtime, config, queries)
        need = max(st.opts.warm_up for st in states.values())
        out.append(fold_partition(runtime, p[:-(-need // RECORD)], states))
    return out


def partition_fit_states(runtime, config, parts: list[list[bytes]], queries: tuple[str, ...]) -> list[dict]:
    """Per partition, the states of ``queries`` with a warm-up as long as the smallest partition:
    each holds its partition's batch fit (of all its reports but the few hundred that the larger
    partitions hold beyond the smallest, which renew it), not a renewal over blocks. Merged as
    serve merges them, they are what pooling per-partition batch fits gives."""
    n = min(sum(runtime.decode_many(p)[1]) for p in parts)
    return [fold_partition(runtime, p, _query_states(runtime, config, queries, warm_up=n)) for p in parts]


def run(config, runtime, records: list[bytes], partitions: int, seed: int, limit: int | None,
        queries: tuple[str, ...] = QUERIES) -> dict:
    """Fold ``records`` over ``partitions`` partitions and compare with ``analyze`` (module docstring)."""
    from aggregator.analyze import analyze_query, replay_records

    parts = [records[k::partitions] for k in range(partitions)]
    cpu = {}
    t0 = time.process_time()
    states = [fold_partition(runtime, p) for p in parts]
    cpu["online_fold_s"] = time.process_time() - t0
    merged = {name: _merge([s[name] for s in states]) for name in queries}
    pooled = {}
    if partitions > 1:  # on one partition this is the batch fit itself
        t0 = time.process_time()
        fits = partition_fit_states(runtime, config, parts, queries)
        cpu["partition_fits_s"] = time.process_time() - t0
        pooled = {name: _merge([f[name] for f in fits]) for name in queries}
    warm = warm_up_fit_states(runtime, config, parts, queries)
    warm = {name: _merge([w[name] for w in warm]) for name in queries}
    t0 = time.process_time()
    rep = replay_records(runtime, [r for p in parts for r in p])
    cpu["replay_s"] = time.process_time() - t0
    rows, out = [], {"limit": limit, "partitions": partitions, "seed": seed, "reports": rep.n,
                     "records": len(records), "queries": {}}
    for name in queries:
        q = next(x for x in config.queries if x.name == name)
        t0 = time.process_time()
        batch = analyze_query(rep, runtime, q)
        cpu[f"analyze_{name}_s"] = time.process_time() - t0
        t0 = time.process_time()
        try:
            est = merged[name].estimate().to_dict()
        except Exception as exc:  # reported, not raised: "not estimated" is a result here
            est = {"error": str(exc)}
        cpu[f"estimate_{name}_s"] = time.process_time() - t0
        entry = {"online": est, "batch": batch, "guarded": merged[name].guarded,
                 "state": repr(merged[name])}
        if pooled:
            entry["pooled_partition_fits"] = pooled[name].estimate().to_dict()
        entry["warm_up_fits"] = warm[name].estimate().to_dict()
        out["queries"][name] = entry
        if "error" in est:
            rows.append((name, "—", "not estimated: " + est["error"], "", "", "", "", ""))
            continue
        for j, p in enumerate(est["params"]):
            v, se = est["value"][j], est["stderr"][j]
            bv, bse = batch["value"][j], batch["stderr"][j]
            pf = entry.get("pooled_partition_fits")
            rows.append((name, p, f"{v:.5g} ± {se:.3g}", f"{bv:.5g} ± {bse:.3g}", se / bse,
                         (v - bv) / bse, (pf["value"][j] - bv) / bse if pf else "",
                         (entry["warm_up_fits"]["value"][j] - bv) / bse))
    out["cpu"] = cpu
    out["rows"] = [dict(zip(("query", "param", "online", "batch", "se_ratio", "z_online",
                             "z_pooled_partition_fits", "z_warm_up_fits"), r)) for r in rows]
    print(table(["query", "param", "online ± SE", "analyze (batch) ± SE", "online SE / batch SE",
                 "(online − batch) / batch SE", "(pooled partition fits − batch) / batch SE",
                 "(pooled warm-up fits − batch) / batch SE"], rows,
                title=f"{rep.n:,} flights, {partitions} partitions"))
    return out


def _merge(states: list):
    """``states`` merged as serve merges partition checkpoints."""
    m = states[0].copy()
    for s in states[1:]:
        m += s
    return m


def raw_truth(config, runtime, raw: dict, queries: tuple[str, ...] = QUERIES) -> dict:
    """The demo's raw-data fits of ``queries`` (``aggregator.demo.truth``) on ``raw``."""
    from aggregator.demo.truth import compute_truth

    truth = compute_truth(config, runtime.schema, raw)
    return {q: truth[q] for q in queries}


def against_truth(run_out: dict, truth: dict) -> list[dict]:
    """Per parameter of a run: the online and the batch estimate's error against the raw-data fit
    in units of its own SE, and whether its 95 % interval covers the raw-data value."""
    rows = []
    for name, entry in run_out["queries"].items():
        for which in ("online", "batch", "pooled_partition_fits"):
            est = entry.get(which)
            if est is None:
                continue
            if "error" in est:
                continue
            for p, v, se, lo, hi in zip(est["params"], est["value"], est["stderr"], est["ci_low"],
                                        est["ci_high"], strict=True):
                t = truth[name].get(p)
                if t is None or se is None:
                    continue
                rows.append({"query": name, "param": p, "estimate": which, "value": v, "truth": t,
                             "z": (v - t) / se, "covered": bool(lo <= t <= hi)})
    return rows


def _ints(text: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="first N flights (default: all)")
    ap.add_argument("--partitions", type=_ints, default=[4], help="partition counts, e.g. 4,1 (default 4)")
    ap.add_argument("--seeds", type=_ints, default=[20261201], help="privatization seeds (default 20261201)")
    ap.add_argument("--queries", default=",".join(QUERIES),
                    help=f"comma-separated, of {', '.join(KNOWN)} (default: the two regressions)")
    ap.add_argument("--truth", action="store_true", help="also fit the raw flights (the demo's truth)")
    args = ap.parse_args(argv)
    queries = tuple(q for q in args.queries.split(",") if q)
    if not queries or not set(queries) <= set(KNOWN):
        print(f"error: --queries must name some of {', '.join(KNOWN)}, got {args.queries!r}",
              file=sys.stderr)
        return 2
    if args.limit is not None and args.limit < 1:
        print("error: --limit must be >= 1", file=sys.stderr)
        return 2
    from aggregator.config import PipelineConfig
    from aggregator.demo.run import data_dir
    from aggregator.plan import PipelineRuntime
    from benchmarks._common import machine_info

    config = PipelineConfig.load(data_dir() / "flights.pipeline.toml")
    runtime = PipelineRuntime.from_config(config)
    runs, raw = [], None
    for seed in args.seeds:  # the raw flights kept do not depend on the noise seed
        t0 = time.perf_counter()
        records, raw = records_of_flights(runtime.schema, args.limit, seed)
        t_priv = time.perf_counter() - t0
        for k in args.partitions:
            runs.append(run(config, runtime, records, k, seed, args.limit, queries))
            runs[-1]["privatize_wall_s"] = t_priv
    command = ("python -m benchmarks.flights_online" + (f" --limit {args.limit}" if args.limit else "")
               + f" --partitions {','.join(map(str, args.partitions))}"
               + f" --seeds {','.join(map(str, args.seeds))}"
               + (f" --queries {','.join(queries)}" if queries != QUERIES else "")
               + (" --truth" if args.truth else ""))
    out = {"command": command, "machine": machine_info(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs}
    if args.truth:
        out["truth"] = raw_truth(config, runtime, raw, queries)
        for r in runs:
            r["against_truth"] = against_truth(r, out["truth"])
            print(table(["query", "param", "estimate", "value", "raw-data fit", "(value − raw)/SE",
                         "95 % CI covers"],
                        [(x["query"], x["param"], x["estimate"], x["value"], x["truth"], x["z"],
                          "yes" if x["covered"] else "no") for x in r["against_truth"]],
                        title=f"against the raw flights: seed {r['seed']}, {r['partitions']} partitions"))
    extra = [q for q in queries if q not in QUERIES]
    path = write_json("flights_online" + (f"_{args.limit}" if args.limit else "")
                      + "".join("_" + q for q in extra), out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
