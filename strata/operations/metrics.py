"""Prometheus metrics of every run and of `strata status`, by prometheus-client's conventions.

Each run builds a registry of its own (never the process's global one, which an
Airflow worker shares between tasks) and, once its batch is committed, writes it for
node_exporter's textfile collector (`<metrics.textfile_dir>/strata_<pipeline>.prom`,
replaced atomically) and/or pushes it to a Pushgateway under the grouping key
`{job, pipeline}`, replacing what the pipeline pushed before. Every metric is a gauge
(each run replaces the figures) named `strata_*`, its unit as suffix; the labels are
`pipeline`, and `topic` and `partition`, or `table`, where a figure is per partition or
per table. The metrics reference (docs/reference/metrics.md) lists them.

Nothing here can fail a run: a view that cannot be had, a file that cannot be written
or a push that is refused is a warning in the run's summary; the batch stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import (
    basic_auth_handler,
    default_handler,
    push_to_gateway,
    write_to_textfile,
)

from strata.config import MetricsConfig
from strata.config.secrets import redact
from strata.store.places import Places

if TYPE_CHECKING:
    from strata.batch.outcome import RunOutcome
    from strata.operations.status import StatusSettings

_PARTITION = ("pipeline", "topic", "partition")

# name -> (help, labels); the order is the exposition's.
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "strata_batch": ("Number of the pipeline's last committed batch.", ("pipeline",)),
    "strata_last_commit_timestamp_seconds": (
        "When the pipeline's last batch committed, in Unix time.",
        ("pipeline",),
    ),
    "strata_lag_messages": (
        "Messages behind the partition's high watermark (after the run, for a run).",
        _PARTITION,
    ),
    "strata_held_back_messages": (
        "Messages between the partition's last stable offset and its high watermark, which "
        "a transaction still open holds back from every read_committed reader; 0 when none "
        "is open.",
        _PARTITION,
    ),
    "strata_open_transaction_start_timestamp_seconds": (
        "When the transaction holding the partition back began (the Kafka timestamp of its "
        "first message, at the first unstable offset), Unix time; absent when none is open.",
        _PARTITION,
    ),
    "strata_oldest_unread_age_seconds": (
        "Age of the partition's first unread message, by its Kafka timestamp.",
        _PARTITION,
    ),
    "strata_time_to_retention_seconds": (
        "Seconds until retention (retention.ms, or retention.bytes estimated) deletes the "
        "partition's first unread message; absent when nothing is unread or no limit applies.",
        _PARTITION,
    ),
    "strata_lag_growth_runs": (
        "Batches in a row, up to the last, that each left more lag behind than the one before.",
        ("pipeline",),
    ),
    "strata_warnings": ("Warnings of the run (or of strata status).", ("pipeline",)),
    "strata_run_messages": ("Offsets the run read from the partition.", _PARTITION),
    "strata_run_rows": ("Rows the run wrote to the data table from the partition.", _PARTITION),
    "strata_run_quarantined": ("Messages of the partition the run quarantined.", _PARTITION),
    "strata_run_gaps": (
        "Offsets of the partition the run found empty (transaction markers, compaction).",
        _PARTITION,
    ),
    "strata_run_skipped_tombstones": (
        "Tombstones (null values) of the partition the run skipped and counted "
        "(on_tombstone: skip).",
        _PARTITION,
    ),
    "strata_run_bytes": ("Key and value bytes the run read from the partition.", _PARTITION),
    "strata_run_files": ("Files the run committed to the table.", ("pipeline", "table")),
    "strata_run_duration_seconds": ("Wall time of the run.", ("pipeline",)),
    "strata_run_read_bytes_per_second": (
        "Key and value bytes read per second while the tasks ran.",
        ("pipeline",),
    ),
    "strata_last_success_timestamp_seconds": (
        "When the pipeline's last run succeeded (a run with nothing new included), Unix time.",
        ("pipeline",),
    ),
    "strata_completeness_watermark_timestamp_seconds": (
        "The completeness watermark, Unix time: every Kafka partition holding it back has "
        "read events at least this new.",
        ("pipeline",),
    ),
    "strata_complete_before_timestamp_seconds": (
        "An event-time partition ending by then (the watermark less completeness.lateness) "
        "is complete, unless a failed quality gate holds it; Unix time.",
        ("pipeline",),
    ),
    "strata_run_late_after_completion_rows": (
        "Rows the run landed in event-time partitions already complete before it.",
        ("pipeline",),
    ),
    "strata_run_failed": (
        "1 when the run committed its batch but then failed (registering the tables, or its "
        "quality gate), so it exits non-zero; 0 when it succeeded.",
        ("pipeline",),
    ),
    "strata_quality_batch": (
        "The batch whose quality result strata_quality_checks_failed counts.",
        ("pipeline",),
    ),
    "strata_quality_checks_failed": (
        "Checks of the latest quality result that failed.",
        ("pipeline",),
    ),
}


class _Gauges:
    """The registry of one run (or one status), with its gauges made as first set."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}

    def set(self, name: str, value: float, **labels: object) -> None:
        gauge = self._gauges.get(name)
        if gauge is None:
            helptext, names = METRICS[name]
            gauge = self._gauges[name] = Gauge(name, helptext, names, registry=self.registry)
        gauge.labels(**{k: str(v) for k, v in labels.items()}).set(value)


def _view_metrics(gauges: _Gauges, view: dict[str, Any]) -> None:
    """The figures of `strata.operations.status.pipeline_view` (or `pipeline_status`)."""
    pipeline = view["pipeline"]
    gauges.set("strata_batch", view["last_batch"], pipeline=pipeline)
    if view.get("last_committed_at"):
        at = datetime.fromisoformat(view["last_committed_at"]).timestamp()
        gauges.set("strata_last_commit_timestamp_seconds", at, pipeline=pipeline)
    for p in view["partitions"]:
        where = {"pipeline": pipeline, "topic": p["topic"], "partition": p["partition"]}
        for key, name in (
            ("lag", "strata_lag_messages"),
            ("oldest_unread_age_s", "strata_oldest_unread_age_seconds"),
            ("time_to_retention_s", "strata_time_to_retention_seconds"),
        ):
            if p.get(key) is not None:
                gauges.set(name, p[key], **where)
        if "lag" in p:
            gauges.set("strata_held_back_messages", p.get("held_back", 0), **where)
        since = p.get("unstable_since")
        if since is not None:
            at = datetime.fromisoformat(since).timestamp()
            gauges.set("strata_open_transaction_start_timestamp_seconds", at, **where)
    gauges.set("strata_lag_growth_runs", view.get("lag_growth_runs", 0), pipeline=pipeline)
    mark = view.get("watermark")
    if mark is not None:
        for key, name in (
            ("at", "strata_completeness_watermark_timestamp_seconds"),
            ("complete_before", "strata_complete_before_timestamp_seconds"),
        ):
            gauges.set(name, datetime.fromisoformat(mark[key]).timestamp(), pipeline=pipeline)


def status_metrics(statuses: Iterable[dict[str, Any]]) -> bytes:
    """`strata status --prometheus`: statuses in the text exposition format.

    Args:
        statuses: `strata.operations.status.pipeline_status` of the pipeline, or of each table of
            a pipeline that routes to tables (one exposition holds them all).

    Returns:
        The exposition, as a scrape of it would read.
    """
    gauges = _Gauges()
    for status in statuses:
        _view_metrics(gauges, status)
        gauges.set("strata_warnings", len(status["warnings"]), pipeline=status["pipeline"])
    return generate_latest(gauges.registry)


def run_metrics(
    outcome: RunOutcome,
    view: dict[str, Any] | None,
    quality: dict[str, Any] | None,
    finished_s: float,
    run_failed: bool = False,
) -> CollectorRegistry:
    """The registry of a run that committed (or had nothing to commit).

    Args:
        outcome: What the run did (an idle run's figures are zeros).
        view: `strata.operations.status.pipeline_view` after the run, if it could be had; its lag
            is fresher than the run's own, which stands in where it has none.
        quality: The latest quality result (`ResultStore.load`), if any.
        finished_s: When the run ended, in Unix time.
        run_failed: The run failed after its commit (registration, the quality gate): it is
            no success, so `strata_last_success_timestamp_seconds` is left out.

    Returns:
        A registry of its own, to write or push.
    """
    gauges = _Gauges()
    pipeline = outcome.pipeline
    known: set[tuple[str, int]] = set(outcome.lag)
    viewed: set[tuple[str, int]] = set()
    if view is not None:
        _view_metrics(gauges, view)
        known |= {(p["topic"], p["partition"]) for p in view["partitions"]}
        viewed = {(p["topic"], p["partition"]) for p in view["partitions"] if "lag" in p}
    for (topic, partition), lag in sorted(outcome.lag.items()):
        if (topic, partition) not in viewed:
            gauges.set(
                "strata_lag_messages", lag, pipeline=pipeline, topic=topic, partition=partition
            )
    read = {(r.topic, r.partition): r for r in outcome.ranges}
    # Every partition known has a figure, 0 where the run read nothing: a series that
    # vanished on an idle run would look like a scrape that failed.
    for topic, partition in sorted(known | set(read)):
        r = read.get((topic, partition))
        where = {"pipeline": pipeline, "topic": topic, "partition": partition}
        gauges.set("strata_run_messages", r.messages if r else 0, **where)
        gauges.set("strata_run_rows", r.rows if r else 0, **where)
        gauges.set("strata_run_quarantined", r.quarantined if r else 0, **where)
        gauges.set("strata_run_gaps", r.gaps if r else 0, **where)
        gauges.set("strata_run_skipped_tombstones", r.skipped if r else 0, **where)
        gauges.set("strata_run_bytes", r.bytes if r else 0, **where)
    for table, files in sorted(outcome.files.items()):
        gauges.set("strata_run_files", files, pipeline=pipeline, table=table)
    late = sum(outcome.late_after_completion.values())
    gauges.set("strata_run_late_after_completion_rows", late, pipeline=pipeline)
    gauges.set("strata_run_duration_seconds", outcome.seconds, pipeline=pipeline)
    busy = outcome.read_seconds or outcome.seconds
    total = sum(r.bytes for r in outcome.ranges)
    rate = total / busy if busy and total else 0.0
    gauges.set("strata_run_read_bytes_per_second", rate, pipeline=pipeline)
    if quality is not None:
        failed = sum(1 for c in quality.get("checks", []) if not c.get("success"))
        gauges.set("strata_quality_batch", quality["batch"], pipeline=pipeline)
        gauges.set("strata_quality_checks_failed", failed, pipeline=pipeline)
    gauges.set("strata_warnings", len(outcome.warnings), pipeline=pipeline)
    gauges.set("strata_run_failed", int(run_failed), pipeline=pipeline)
    if not run_failed:
        gauges.set("strata_last_success_timestamp_seconds", finished_s, pipeline=pipeline)
    return gauges.registry


def textfile_path(metrics: MetricsConfig, pipeline: str) -> str | None:
    """Where the run's metrics file goes, if `metrics.textfile_dir` is set.

    Args:
        metrics: The `metrics` settings.
        pipeline: The pipeline's (or routed table's) name.
    """
    directory = metrics.textfile_dir
    return None if directory is None else f"{directory.rstrip('/')}/strata_{pipeline}.prom"


def _auth(metrics: MetricsConfig) -> Callable[..., Callable[[], None]]:
    """The push's request handler: basic auth when the Pushgateway asks for it."""
    user, password = metrics.username, metrics.password
    if user is None or password is None:
        return default_handler

    def handler(
        url: str, method: str, timeout: float | None, headers: list[tuple[str, str]], data: bytes
    ) -> Callable[[], None]:
        return basic_auth_handler(url, method, timeout, headers, data, user, password)

    return handler


def export(metrics: MetricsConfig, pipeline: str, registry: CollectorRegistry) -> list[str]:
    """Write the registry for the textfile collector and push it, as configured.

    Args:
        metrics: The `metrics` settings.
        pipeline: The pipeline's (or routed table's) name: the file's and the
            Pushgateway grouping key's.
        registry: The run's metrics.

    Returns:
        A warning for each way that failed (none when both went through).
    """
    warnings = []
    path = textfile_path(metrics, pipeline)
    if path is not None:
        try:
            # A temporary file beside it, renamed over it: a scrape never sees half.
            write_to_textfile(path, registry)
        except OSError as exc:
            warnings.append(f"metrics not written to {path}: {exc}")
    url = metrics.pushgateway
    if url is not None:
        try:
            push_to_gateway(
                url,
                job=metrics.job,
                registry=registry,
                grouping_key={"pipeline": pipeline},
                timeout=metrics.timeout_s,
                handler=_auth(metrics),
            )
        except Exception as exc:  # noqa: BLE001 - urllib's errors are many; the batch stands
            warnings.append(f"metrics not pushed to {url}: {type(exc).__name__}: {exc}")
    return [redact(w) for w in warnings]


def after_run(
    places: Places,
    settings: StatusSettings,
    metrics: MetricsConfig,
    outcome: RunOutcome,
    gate_failed: bool = False,
) -> None:
    """Once a run succeeded: its warnings of retention and growing lag, and its metrics.

    The retention and lag-growth warnings `strata status` gives are added to the
    run's, so they reach its summary (and an Airflow run's XCom and log); then the
    metrics are written and pushed, if configured. Call it after the batch committed
    (and after its quality suite, whose result the metrics count).

    Args:
        places: The pipeline's (or routed table's) places.
        settings: What its view reads (`strata.operations.status.StatusSettings`, which
            the entry points build).
        metrics: The `metrics` settings.
        outcome: The run's outcome; warnings are added to it. Nothing here raises.
        gate_failed: The batch failed its quality checks under `quality.gate: fail`.
    """
    from strata.operations.status import pipeline_view

    view: dict[str, Any] | None = None
    exported = metrics.textfile_dir is not None or metrics.pushgateway is not None
    try:
        view = pipeline_view(places, settings, watermark=exported, seen=outcome.seen)
    except Exception as exc:  # noqa: BLE001 - what is watched must not fail a committed batch
        outcome.warnings.append(f"lag and time to retention after the run unknown: {exc}")
    if view is not None:
        outcome.warnings.extend(view["warnings"])
        if "broker_error" in view:
            outcome.warnings.append(
                f"lag and time to retention after the run unknown: {view['broker_error']}"
            )
    if not exported:
        return
    from strata.quality.store import ResultStore

    quality: dict[str, Any] | None = None
    try:
        store = ResultStore.of(places)
        quality = store.load(outcome.batch) if outcome.batch is not None else None
        if quality is None:
            latest = store.recent(1)
            quality = latest[-1] if latest else None
    except Exception as exc:  # noqa: BLE001 - read only, for one figure
        outcome.warnings.append(f"quality result not read for the metrics: {exc}")
    try:
        failed = gate_failed or outcome.register_error is not None
        registry = run_metrics(outcome, view, quality, time.time(), failed)
    except Exception as exc:  # noqa: BLE001 - the batch stands whatever the metrics do
        outcome.warnings.append(f"metrics not made: {type(exc).__name__}: {exc}")
        return
    outcome.warnings.extend(export(metrics, places.pipeline, registry))
