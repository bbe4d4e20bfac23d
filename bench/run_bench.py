"""`make bench`: a known load into Apache Kafka, the real job, and its references.

Produces 1,000,000 JSON click events (about 190 MB, 4 partitions), then measures in
the same run, on the same data: the bare consume loop, the naive one-process peer
(alone, and with a raw copy), and `strata run` (a real process: Spark driver, JVM and
Python workers), with where its time went, per process kind and per stage. The job is
then run again on 3,000,000 and 10,000,000 events, and on 1,000,000 events over 5,000
event hours, to show that its memory is flat in batch size and in the hours a batch
touches, and on the 1M load with `local[1]`, on the S3 endpoint, and on a standalone
cluster.
Then table maintenance (bench/maintenance.py): a no-op run after 2 and after 200
small batches, compacting the 200 batches' small files, and a Spark scan of one event
hour before and after. Last, scale (bench/scale.py): the same events from 8 partitions
and from 4,096, and from one topic and from 200 topics routed to 200 tables, a first
run and a no-op run of each; and history (bench/history.py): a no-op run and a small
batch after 10,000 committed batches, against a fresh pipeline.

All of it on one local Apache Kafka (`strata.local.kafka.LocalKafka`, a KRaft node on
loopback), whose high watermark is the log end: every program reads exactly what was
produced. CPU is measured for each program's whole process tree, never the broker's.

`BENCH_SECTIONS` (names from `SECTIONS`, separated by spaces or commas) runs only some
sections; unset or empty, all of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from bench.formats import formats
from bench.harness import (
    PARTITIONS,
    ROOT,
    files_per_hour,
    local_kafka,
    measure,
    seed,
    strata_project,
)
from bench.history import history
from bench.maintenance import maintenance
from bench.scale import partitions, topics
from strata.local.cluster import LocalSparkCluster, submit_command, submit_env
from strata.local.kafka import LocalKafka
from strata.local.service import free_port, port_open

# The sections, in the order they run, and what each measures.
SECTIONS: dict[str, str] = {
    "1m": "the references (bare loop, naive peer, naive peer + raw copy) and strata 1M",
    "shuffle": "strata 1M with the shuffle layout",
    "3m": "strata 3M",
    "10m": "strata 10M",
    "hours": "strata 1M over 6 and over 5,000 event hours",
    "where": "the 1M load on local[1], on S3 and on a standalone cluster",
    "maintenance": "no-op runs after 2 and 200 batches, compaction, checkpoint",
    "partitions": "4,096 partitions against 8",
    "topics": "200 routed topics against one",
    "history": "10,000 committed batches against none",
    "formats": "Delta, plain Parquet and Iceberg",
}
# Every row of the main table and the placements compare with the references and
# strata 1M: choosing any of them runs `1m` too.
NEEDS_1M = frozenset({"shuffle", "3m", "10m", "hours", "where"})


@contextmanager
def moto_s3() -> Iterator[str]:
    """An S3 endpoint (moto_server) on loopback with a `bench` bucket; yields its URL."""
    import boto3

    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_open(port):
            if time.monotonic() > deadline:
                raise RuntimeError("moto_server did not start")
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        boto3.client(
            "s3",
            endpoint_url=url,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            region_name="us-east-1",
        ).create_bucket(Bucket="bench")
        yield url
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def executor_archive(work: Path) -> Path:
    """The executors' packed environment, built by `make dist` as a user builds it."""
    out = work / "dist"
    subprocess.run(
        ["make", "-s", "dist", f"DIST={out}", f"EXECUTOR_ENV={out / 'env'}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return out / "strata-executor-env.tar.gz"


def executor_processes(cluster: LocalSparkCluster) -> list[psutil.Process]:
    """The cluster's executors and their Python workers (children of the workers)."""
    found: list[psutil.Process] = []
    for pid in cluster.worker_pids():
        try:
            found.extend(psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return found


def placements(
    broker: LocalKafka, work: Path, one_m: dict[str, Any], value_bytes: int
) -> list[str]:
    """The 1M load with local[1], local[2] (disk and S3) and a standalone cluster on S3.

    A cluster's executors cannot write the driver's disk, so the cluster writes to the
    S3 endpoint, and local[2] is measured on the same endpoint beside it. CPU per GB
    counts the message values (`value_bytes`), as the main table does.
    """
    env = submit_env({k: v for k, v in os.environ.items() if not k.startswith("STRATA_")})
    strata = str(Path(sys.executable).parent / "strata")
    runs: dict[str, dict[str, Any]] = {"local[2], disk": one_m}
    conf = strata_project(work / "p-local1", "bench1m", broker.bootstrap, "per_task", "local[1,4]")
    runs["local[1], disk"] = measure(
        [strata, "run", "--pipeline", "bench", "--conf-dir", str(conf), "--json"], env
    )
    print("  strata 1M local[1] done", flush=True)
    archive = executor_archive(work)
    with moto_s3() as url:
        conf = strata_project(work / "p-local2-s3", "bench1m", broker.bootstrap, "per_task", s3=url)
        runs["local[2], S3"] = measure(
            [strata, "run", "--pipeline", "bench", "--conf-dir", str(conf), "--json"], env
        )
        print("  strata 1M local[2] on S3 done", flush=True)
        with LocalSparkCluster(work / "cluster", workers=1, cores=2) as cluster:
            conf = strata_project(
                work / "p-cluster-s3", "bench1m", broker.bootstrap, "per_task", s3=url
            )
            runs["cluster 1x2 cores, S3"] = measure(
                submit_command(cluster.url, "bench", conf, archive),
                env,
                lambda: executor_processes(cluster),
            )
        print("  strata 1M on the standalone cluster done", flush=True)
    lines = [
        "",
        "Where the job runs (1M events, per_task layout; CPU includes executors):",
        f"{'':<26} {'whole msgs/s':>12} {'task msgs/s':>12} {'CPU s/GB':>9} "
        f"{'driver MB':>10} {'executors MB':>13}",
    ]
    for label, m in runs.items():
        r = m["result"]
        gb = value_bytes / 1e9
        lines.append(
            f"{label:<26} {r['messages'] / m['wall']:>12,.0f} "
            f"{r['messages'] / r['read_seconds']:>12,.0f} {m['cpu'] / gb:>9.1f} "
            f"{m['peak_rss'] / 2**20:>10,.0f} {m.get('executor_peak_rss', 0) / 2**20:>13,.0f}"
        )
    return lines


def chosen_sections(text: str | None) -> list[str]:
    """The sections `BENCH_SECTIONS` names, in running order, with what they need.

    Args:
        text: Section names separated by spaces or commas; None or blank for all.

    Returns:
        The names, in `SECTIONS` order, `1m` added where another needs it.

    Raises:
        ValueError: If a name is not a section's; the message lists them.
    """
    names = set((text or "").replace(",", " ").split())
    if not names:
        return list(SECTIONS)
    unknown = sorted(names - SECTIONS.keys())
    if unknown:
        known = ", ".join(f"{n} ({what})" for n, what in SECTIONS.items())
        raise ValueError(f"BENCH_SECTIONS names no section {', '.join(unknown)}; they are: {known}")
    if names & NEEDS_1M:
        names.add("1m")
    return [n for n in SECTIONS if n in names]


def row(
    name: str, messages: int, nbytes: int, seconds: float, cpu: float, peak: int, files: str
) -> str:
    return (
        f"{name:<34} {messages / seconds:>10,.0f} {nbytes / 1e6 / seconds:>8.1f} "
        f"{cpu / (nbytes / 1e9):>10.1f} {peak / 2**20:>9,.0f}  {files}"
    )


def where_time(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Per run: CPU per process kind, then the tasks' and the driver's stages."""
    lines = ["", "where the time went (CPU s; tasks' stages summed over tasks, wall/CPU):"]
    for label, m in runs.items():
        kinds = m["cpu_by_kind"]
        lines.append(
            f"  strata {label}: process tree {m['cpu']:.1f} CPU s = JVM {kinds['jvm']:.1f}, "
            f"driver Python {kinds['driver']:.1f}, task workers {kinds['workers']:.1f} (sampled); "
            "peak MB: "
            + ", ".join(f"{kind} {rss / 2**20:,.0f}" for kind, rss in m["peak_by_kind"].items())
        )
        stages = m["result"].get("stages", {})
        for side in ("tasks", "driver"):
            figures = stages.get(side, {})
            lines.append(
                f"    {side}: "
                + ", ".join(f"{name} {s['wall']:.1f}/{s['cpu']:.1f}" for name, s in figures.items())
            )
    return lines


def _cpu_per_gb(run: dict[str, Any], load_bytes: int, load_messages: int) -> float:
    """A strata run's whole-tree CPU seconds per GB of message values it landed."""
    landed = load_bytes * int(run["result"]["messages"]) / load_messages
    return float(run["cpu"]) / (landed / 1e9)


# The main table's strata runs: (label, section, topic, events to seed (None: `bench1m`,
# seeded with the references), event hours, layout).
CASES = (
    ("1M", "1m", "bench1m", None, 24, "per_task"),
    ("1M shuffle", "shuffle", "bench1m", None, 24, "shuffle"),
    ("3M", "3m", "bench3m", 3_000_000, 24, "per_task"),
    ("10M", "10m", "bench10m", 10_000_000, 24, "per_task"),
    # A batch touching thousands of event hours (a file per hour, table and task),
    # against six: its CPU per GB should stay within 2x.
    ("1M 6h", "hours", "bench6h", 1_000_000, 6, "per_task"),
    ("1M 5000h", "hours", "bench5000h", 1_000_000, 5_000, "per_task"),
)


def references(broker: LocalKafka, work: Path) -> dict[str, dict[str, Any]]:
    """The bare loop, the naive peer and the naive peer + raw copy over `bench1m`."""
    refs = {}
    for kind in ("bare", "naive", "naive_raw"):
        out = work / f"{kind}-out"
        m = measure(
            [sys.executable, "-m", "bench.references", kind, broker.bootstrap, "bench1m",
             str(PARTITIONS), str(out)]
        )  # fmt: skip
        refs[kind] = m
        print(
            f"  {kind}: {m['result']['messages']:,} msgs in {m['result']['seconds']:.1f}s",
            flush=True,
        )
    return refs


def strata_runs(
    broker: LocalKafka, work: Path, chosen: list[str], took: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """The main table's `strata run`s of the chosen sections, as real processes.

    Each section's seconds (seeding included) are added to `took`.
    """
    strata = str(Path(sys.executable).parent / "strata")
    runs = {}
    for label, section, topic, count, hours, layout in CASES:
        if section not in chosen:
            continue
        began = time.monotonic()
        if count:
            seed(broker, topic, count, hours)
        project = work / f"strata-{label.replace(' ', '-')}"
        conf = strata_project(project, topic, broker.bootstrap, layout)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
        m = measure([strata, "run", "--pipeline", "bench", "--conf-dir", str(conf), "--json"], env)
        m["files"] = files_per_hour(str(project / "warehouse" / "bench"))
        runs[label] = m
        took[section] = took.get(section, 0.0) + time.monotonic() - began
        r = m["result"]
        print(
            f"  strata {label}: {r['messages']:,} msgs, {r['seconds']:.1f}s "
            f"(Spark start {r['spark_start_seconds']:.1f}s)",
            flush=True,
        )
    return runs


def table_lines(refs: dict[str, dict[str, Any]], runs: dict[str, dict[str, Any]]) -> list[str]:
    """The main table: the references' rows, then each strata run's two."""
    bare, naive = refs["bare"], refs["naive"]
    n, b = bare["result"]["messages"], bare["result"]["bytes"]
    header = f"{'':<34} {'msgs/s':>10} {'MB/s':>8} {'CPU s/GB':>10} {'peak MB':>9}  files"
    lines = [
        "",
        f"Strata benchmark: {n:,} JSON events, {b / 1e6:,.0f} MB, {PARTITIONS} partitions, "
        f"24 event hours; Apache Kafka on the same {os.cpu_count()}-core machine",
        header,
    ]
    for name, ref, files in (
        ("bare consume loop", bare, "-"),
        (
            "naive peer (1 process)",
            naive,
            f"{naive['result']['files']} ({naive['result']['files'] / 24:.1f}/hour)",
        ),
        (
            "naive peer + raw copy",
            refs["naive_raw"],
            f"{refs['naive_raw']['result']['files']} with raw",
        ),
    ):
        r = ref["result"]
        lines.append(row(name, n, b, r["seconds"], ref["cpu"], ref["peak_rss"], files))
    for label, m in runs.items():
        r = m["result"]
        files, hours, worst = m["files"]
        per_hour = f"{files} data ({files / hours:.1f}/hour, max {worst}) + {r['files']['raw']} raw"
        # MB/s counts message values, as the references do (the load is the same data).
        load = b * r["messages"] / n
        lines.append(
            row(f"strata {label}, whole process", r["messages"], load, m["wall"], m["cpu"],
                m["peak_rss"], per_hour)
        )  # fmt: skip
        lines.append(
            row(f"strata {label}, tasks (steady state)", r["messages"], load, r["read_seconds"],
                m["cpu"], m["peak_rss"], "")
        )  # fmt: skip
    return lines


def table_figures(
    refs: dict[str, dict[str, Any]], runs: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The main table's ratios and peaks, for the runs that were made."""
    bare, naive = refs["bare"], refs["naive"]
    n, b = bare["result"]["messages"], bare["result"]["bytes"]
    one = runs["1M"]["result"]
    peer = naive["result"]["bytes"] / naive["result"]["seconds"]
    naive_cpu_gb = naive["cpu"] / (b / 1e9)
    figures: dict[str, Any] = {
        "steady_vs_naive": round(b / one["read_seconds"] / peer, 2),
        "whole_vs_naive": round(b / runs["1M"]["wall"] / peer, 2),
        "steady_vs_bare": round(
            b / one["read_seconds"] / (bare["result"]["bytes"] / bare["result"]["seconds"]), 2
        ),
        "cpu_per_gb_1m_vs_naive": round(_cpu_per_gb(runs["1M"], b, n) / naive_cpu_gb, 2),
        "cpu_per_gb_naive_raw_vs_naive": round(
            refs["naive_raw"]["cpu"] / (b / 1e9) / naive_cpu_gb, 2
        ),
        "spark_start_s": one["spark_start_seconds"],
        "peak_mb_1m": round(runs["1M"]["peak_rss"] / 2**20),
    }
    if "3M" in runs:
        three = runs["3M"]
        three_bytes = b * three["result"]["messages"] / n
        figures["steady_3m_vs_naive"] = round(
            three_bytes / three["result"]["read_seconds"] / peer, 2
        )
        figures["whole_3m_vs_naive"] = round(three_bytes / three["wall"] / peer, 2)
        figures["cpu_per_gb_3m_vs_naive"] = round(_cpu_per_gb(three, b, n) / naive_cpu_gb, 2)
    if "10M" in runs:
        figures["cpu_per_gb_10m_vs_naive"] = round(_cpu_per_gb(runs["10M"], b, n) / naive_cpu_gb, 2)
    for label in ("3M", "10M", "1M 5000h"):
        if label in runs:
            key = "peak_mb_" + label.lower().replace(" ", "_")
            figures[key] = round(runs[label]["peak_rss"] / 2**20)
    if "1M 5000h" in runs:
        figures["cpu_per_gb_5000h_vs_6h"] = round(
            _cpu_per_gb(runs["1M 5000h"], b, n) / _cpu_per_gb(runs["1M 6h"], b, n), 2
        )
    if "1M shuffle" in runs:
        figures["shuffle_vs_per_task"] = round(
            one["read_seconds"] / runs["1M shuffle"]["result"]["read_seconds"], 2
        )
    return figures


def summary_lines(figures: dict[str, Any]) -> list[str]:
    """The main table's ratios in words, for the figures there are."""
    f = figures
    lines = [
        "",
        f"tasks: {PARTITIONS} partitions split over 2 Spark tasks (local[2]); each task's "
        "consumer is assigned 2 partitions. The references use one consumer for all 4.",
        f"steady state vs naive peer: {f['steady_vs_naive']}x at 1M"
        + (
            f", {f['steady_3m_vs_naive']}x at 3M (target >= 1.5x at 3M)"
            if "steady_3m_vs_naive" in f
            else ""
        )
        + f"; whole process vs naive peer: {f['whole_vs_naive']}x at 1M (target >= 1x)"
        + (f", {f['whole_3m_vs_naive']}x at 3M" if "whole_3m_vs_naive" in f else "")
        + f"; steady vs bare loop: {f['steady_vs_bare']}x",
        f"CPU per GB vs naive peer: strata 1M whole tree {f['cpu_per_gb_1m_vs_naive']}x"
        + (
            f", 3M {f['cpu_per_gb_3m_vs_naive']}x (target <= 1.5x)"
            if "cpu_per_gb_3m_vs_naive" in f
            else ""
        )
        + (f", 10M {f['cpu_per_gb_10m_vs_naive']}x" if "cpu_per_gb_10m_vs_naive" in f else "")
        + f"; naive + raw copy {f['cpu_per_gb_naive_raw_vs_naive']}x",
    ]
    peaks = [
        f"{f[key]} MB at {what}"
        for key, what in (
            ("peak_mb_1m", "1M"),
            ("peak_mb_3m", "3M"),
            ("peak_mb_10m", "10M"),
            ("peak_mb_1m_5000h", "1M over 5,000 event hours"),
        )
        if key in f
    ]
    lines.append(f"peak memory (process tree): {', '.join(peaks)} (target: flat)")
    if "cpu_per_gb_5000h_vs_6h" in f:
        lines.append(
            f"CPU per GB over 5,000 event hours vs 6: {f['cpu_per_gb_5000h_vs_6h']}x (target <= 2x)"
        )
    lines.append(f"Spark start-up: {f['spark_start_s']:.1f}s")
    if "shuffle_vs_per_task" in f:
        lines.append(
            f"shuffle layout vs per-task layout, steady state: {f['shuffle_vs_per_task']}x "
            "(fewer files per hour, rows moved once more)"
        )
    return lines


def main() -> int:
    """Run the chosen sections (`BENCH_SECTIONS`, all by default) and print the comparison."""
    try:
        chosen = chosen_sections(os.environ.get("BENCH_SECTIONS"))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="strata-bench-"))
    figures: dict[str, Any] = {}
    took: dict[str, float] = {}
    try:
        with local_kafka(work) as broker:
            print(f"sections: {' '.join(chosen)}", flush=True)
            # Each section's lines are printed as it ends: a section that fails later
            # (a cluster that does not start, say) leaves the figures already measured.
            if "1m" in chosen:
                began = time.monotonic()
                seed(broker, "bench1m", 1_000_000)
                refs = references(broker, work)
                took["1m"] = time.monotonic() - began
                runs = strata_runs(broker, work, chosen, took)
                figures |= table_figures(refs, runs)
                lines = [*table_lines(refs, runs), *summary_lines(figures), *where_time(runs)]
                print("\n".join(lines), flush=True)
            if "where" in chosen:
                began = time.monotonic()
                value_bytes = refs["bare"]["result"]["bytes"]
                print("\n".join(placements(broker, work, runs["1M"], value_bytes)), flush=True)
                took["where"] = time.monotonic() - began
            for name, section in (
                ("maintenance", maintenance),
                ("partitions", partitions),
                ("topics", topics),
                ("history", history),
                ("formats", formats),
            ):
                if name in chosen:
                    began = time.monotonic()
                    lines, found = section(broker, work)
                    took[name] = time.monotonic() - began
                    print("\n".join(lines), flush=True)
                    figures |= found
        timing = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in took.items())
        print("\n".join(["", json.dumps(figures), f"sections took: {timing}"]))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
