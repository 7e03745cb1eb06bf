"""Plots and Markdown tables of ``benchmarks/pipeline.py``'s results."""

from __future__ import annotations

from benchmarks._common import savefig, table, use_agg

#: The consume sections of a reduced demo pipeline: (results key, table title).
CONSUME_VARIANTS = (
    ("consume_no_kmeans", "consume, pipeline without k-means (7 queries)"),
    ("consume_no_regressions", "consume, pipeline without the two regressions and k-means (5 queries)"),
)


# --------------------------------------------------------------------------------------------------
# plots and main
# --------------------------------------------------------------------------------------------------
def plot(results: dict) -> list[str]:
    use_agg()
    import matplotlib.pyplot as plt

    made = []
    cons, e2e, prod = results.get("consume"), results.get("e2e"), results.get("produce")
    if cons or e2e or prod:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        series = [
            (prod, "producer_reports_per_s", "o-", "ReportProducer (produce only)"),
            (prod, "raw_reports_per_s", "o--", "raw kafka-python send loop"),
            (cons, "worker_reports_per_s", "s-", "worker (consume only)"),
            (cons, "raw_reports_per_s", "s--", "raw kafka-python consume loop (worker's malloc settings)"),
            (cons, "plain_raw_reports_per_s", "s:", "raw kafka-python consume loop (glibc malloc defaults)"),
            (e2e, "pipeline_reports_per_s", "^-", "produce→broker→worker"),
            (e2e, "raw_reports_per_s", "^--", "raw produce→broker→consume"),
        ]
        for rows, key, style, label in series:
            if rows and all(key in r for r in rows):
                ax.plot([r["reports_per_record"] for r in rows], [r[key] for r in rows], style, label=label)
        ax.axhline(1e6, color="grey", lw=0.8, ls=":", label="target 10⁶/s")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="reports per Kafka record",
            ylabel="reports / s",
            title="Pipeline throughput (Tansu embedded, 2 shared cores)",
        )
        ax.legend(fontsize=7)
        made.append(str(savefig(fig, "pipeline_throughput")))
    lat = results.get("latency")
    if lat and lat.get("latencies_s"):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.hist(lat["latencies_s"], bins=40)
        for q, ls in (("p50_s", "-"), ("p99_s", "--")):
            ax.axvline(lat[q], color="k", ls=ls, label=f"{q[:3]} = {lat[q]:.2f} s")
        ax.set(
            xlabel="event → served estimate (s)",
            ylabel="records",
            title=f"Latency at {lat['target_reports_per_s']:.0f} reports/s "
            f"(checkpoint every {lat['checkpoint_interval_s']} s)",
        )
        ax.legend()
        made.append(str(savefig(fig, "pipeline_latency")))
    return made


def print_tables(r: dict) -> None:
    print(
        "\nconfluent-kafka transport: "
        + ("present" if r["confluent_kafka_present"] else "not installed (skipped)")
    )
    if r.get("produce"):
        print(
            table(
                [
                    "reports/record",
                    "reports",
                    "record bytes",
                    "ReportProducer /s",
                    "raw send loop /s",
                    "ratio",
                ],
                [
                    (
                        x["reports_per_record"],
                        x["reports"],
                        x["record_bytes"],
                        x["producer_reports_per_s"],
                        x["raw_reports_per_s"],
                        x["producer_vs_raw"],
                    )
                    for x in r["produce"]
                ],
                "produce (reports/s)",
            )
        )
    if r.get("consume"):
        print(
            table(
                [
                    "reports/record",
                    "reports",
                    "record bytes",
                    "raw consume /s",
                    "raw MB/s",
                    "worker /s",
                    "worker/raw",
                    "medians",
                    "paired median",
                    "worker /CPU-s",
                    "raw, glibc malloc /s",
                    "worker/that",
                ],
                [
                    (
                        x["reports_per_record"],
                        x["reports"],
                        x["record_bytes"],
                        x["raw_reports_per_s"],
                        x["raw_MB_per_s"],
                        x["worker_reports_per_s"],
                        x["worker_vs_raw"],
                        x.get("worker_vs_raw_medians", float("nan")),
                        x.get("worker_vs_raw_paired_median", float("nan")),
                        x.get("worker_reports_per_cpu_s", float("nan")),
                        x.get("plain_raw_reports_per_s", float("nan")),
                        x.get("worker_vs_plain_raw", float("nan")),
                    )
                    for x in r["consume"]
                ],
                "consume (reports/s; raw = same malloc settings as the worker)",
            )
        )
    if r.get("consume") and r["consume"][0].get("thread_cpu_s"):
        def cpu(x, who, *names):
            threads = (x["thread_cpu_s"] or {}).get(who) or {}
            return sum(v for k, v in threads.items() if k.startswith(names))

        print(
            table(
                ["reports/record", "raw wall s", "raw main", "raw kafka-io", "broker (raw)",
                 "worker wall s", "worker main", "ldp-fold", "of it decode+doubling", "worker kafka-io",
                 "ldp-update",
                 "checkpoints s", "broker (worker)"],
                [
                    (
                        x["reports_per_record"],
                        x["raw_wall_s"],
                        cpu(x, "raw", "MainThread"),
                        cpu(x, "raw", "kafka-io"),
                        x["broker_cpu_s_raw_pass"],
                        x["worker_wall_s"],
                        cpu(x, "worker", "MainThread"),
                        cpu(x, "worker", "ldp-fold"),
                        sum((x.get("fold") or {}).get(k, {}).get("cpu_s", 0.0)
                            for k in ("decode", "doubling")),
                        cpu(x, "worker", "kafka-io"),
                        cpu(x, "worker", "ldp-update"),
                        (x.get("checkpoint") or {}).get("wall_s", float("nan")),
                        x["broker_cpu_s_worker_pass"],
                    )
                    for x in r["consume"]
                ],
                "consume: wall seconds and CPU seconds per thread (best passes)",
            )
        )
    for key, title in CONSUME_VARIANTS:
        if not r.get(key):
            continue
        print(
            table(
                ["reports/record", "reports", "raw consume /s", "worker /s", "worker/raw", "medians",
                 "paired median", "worker /CPU-s"],
                [
                    (
                        x["reports_per_record"],
                        x["reports"],
                        x["raw_reports_per_s"],
                        x["worker_reports_per_s"],
                        x["worker_vs_raw"],
                        x.get("worker_vs_raw_medians", float("nan")),
                        x.get("worker_vs_raw_paired_median", float("nan")),
                        x.get("worker_reports_per_cpu_s", float("nan")),
                    )
                    for x in r[key]
                ],
                title,
            )
        )
    if r.get("e2e"):
        print(
            table(
                ["reports/record", "reports", "produce→worker /s", "raw produce→consume /s", "ratio"],
                [
                    (
                        x["reports_per_record"],
                        x["reports"],
                        x["pipeline_reports_per_s"],
                        x["raw_reports_per_s"],
                        x["pipeline_vs_raw"],
                    )
                    for x in r["e2e"]
                ],
                "end to end",
            )
        )
    if r.get("scale"):
        print(
            table(
                ["workers", "partitions", "reports", "reports/s", "per worker /s"],
                [
                    (
                        x["workers"],
                        x["partitions"],
                        x["reports"],
                        x["reports_per_s"],
                        ", ".join(f"{w['reports_per_s']:,.0f}" for w in x["per_worker"]),
                    )
                    for x in r["scale"]
                ],
                "1 vs 2 worker processes, 2 partitions, 1000 reports/record",
            )
        )
    if r.get("memory"):
        mem = r["memory"]["rss_kb"]
        print(
            table(
                ["after reports", "RSS MiB", "peak RSS (VmHWM) MiB"],
                [(k, v["rss"] / 1024, v["hwm"] / 1024) for k, v in mem.items()],
                "worker memory",
            )
        )
    if r.get("breakdown"):
        print(
            table(
                ["step", "kind", "CPU s per 10⁶ reports", "share", "reports/CPU-s alone"],
                [
                    (
                        x["step"],
                        x["kind"],
                        x["cpu_s_per_1e6_reports"],
                        x["share"],
                        x["reports_per_cpu_s_alone"],
                    )
                    for x in r["breakdown"]
                ],
                "worker CPU breakdown, in process, 1000 reports/record",
            )
        )
    if r.get("latency"):
        lat = r["latency"]
        print(
            table(
                ["rate target", "achieved", "records", "p50 s", "p99 s", "max s"],
                [
                    (
                        lat["target_reports_per_s"],
                        lat["achieved_send_reports_per_s"],
                        lat["measured"],
                        lat["p50_s"],
                        lat["p99_s"],
                        lat["max_s"],
                    )
                ],
                "event → served estimate latency",
            )
        )
