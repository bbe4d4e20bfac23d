"""`make bench`: a known load into the local broker, the real job, and its references.

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

CPU is measured for each program's whole process tree, never the broker's.
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
    measure,
    seed,
    strata_project,
)
from bench.history import history
from bench.maintenance import maintenance
from bench.scale import partitions, topics
from strata.local.broker import LocalBroker
from strata.local.cluster import LocalSparkCluster, submit_command, submit_env
from strata.local.service import free_port, port_open


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
    broker: LocalBroker, work: Path, one_m: dict[str, Any], value_bytes: int
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


def main() -> int:
    """Run the benchmark and print the comparison."""
    python = sys.executable
    strata = str(Path(python).parent / "strata")
    work = Path(tempfile.mkdtemp(prefix="strata-bench-"))
    lines: list[str] = []
    figures: dict[str, Any] = {}
    try:
        with LocalBroker() as broker:
            print(f"local broker on {broker.bootstrap}; seeding", flush=True)
            seed(broker, "bench1m", 1_000_000)

            refs = {}
            for kind in ("bare", "naive", "naive_raw"):
                out = work / f"{kind}-out"
                m = measure(
                    [
                        python,
                        "-m",
                        "bench.references",
                        kind,
                        broker.bootstrap,
                        "bench1m",
                        str(PARTITIONS),
                        str(out),
                    ]
                )
                refs[kind] = m
                print(
                    f"  {kind}: {m['result']['messages']:,} msgs in {m['result']['seconds']:.1f}s",
                    flush=True,
                )

            runs = {}
            # (label, topic, events to seed (None: already seeded), event hours, layout)
            cases = (
                ("1M", "bench1m", None, 24, "per_task"),
                ("1M shuffle", "bench1m", None, 24, "shuffle"),
                ("3M", "bench3m", 3_000_000, 24, "per_task"),
                ("10M", "bench10m", 10_000_000, 24, "per_task"),
                # A batch touching thousands of event hours (a file per hour, table and
                # task), against six: its CPU per GB should stay within 2x.
                ("1M 6h", "bench6h", 1_000_000, 6, "per_task"),
                ("1M 5000h", "bench5000h", 1_000_000, 5_000, "per_task"),
            )
            for label, topic, count, hours, layout in cases:
                if count:
                    seed(broker, topic, count, hours)
                conf = strata_project(
                    work / f"strata-{label.replace(' ', '-')}", topic, broker.bootstrap, layout
                )
                env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
                m = measure(
                    [strata, "run", "--pipeline", "bench", "--conf-dir", str(conf), "--json"], env
                )
                files, hours, worst = files_per_hour(
                    str(work / f"strata-{label.replace(' ', '-')}" / "warehouse" / "bench")
                )
                m["files"] = (files, hours, worst)
                runs[label] = m
                r = m["result"]
                print(
                    f"  strata {label}: {r['messages']:,} msgs, {r['seconds']:.1f}s "
                    f"(Spark start {r['spark_start_seconds']:.1f}s)",
                    flush=True,
                )

            where = placements(broker, work, runs["1M"], refs["bare"]["result"]["bytes"])
            upkeep_lines, upkeep = maintenance(broker, work)
            scale_lines, scale = partitions(broker, work)
            routed_lines, routed = topics(broker, work)
            history_lines, aged = history(broker, work)
            format_lines, by_format = formats(broker, work)

        bare, naive = refs["bare"], refs["naive"]
        n, b = bare["result"]["messages"], bare["result"]["bytes"]
        header = f"{'':<34} {'msgs/s':>10} {'MB/s':>8} {'CPU s/GB':>10} {'peak MB':>9}  files"
        lines += [
            "",
            f"Strata benchmark: {n:,} JSON events, {b / 1e6:,.0f} MB, {PARTITIONS} partitions, "
            f"24 event hours; broker on the same {os.cpu_count()}-core machine",
            header,
            row(
                "bare consume loop",
                n,
                b,
                bare["result"]["seconds"],
                bare["cpu"],
                bare["peak_rss"],
                "-",
            ),
            row(
                "naive peer (1 process)",
                n,
                b,
                naive["result"]["seconds"],
                naive["cpu"],
                naive["peak_rss"],
                f"{naive['result']['files']} ({naive['result']['files'] / 24:.1f}/hour)",
            ),
            row(
                "naive peer + raw copy",
                n,
                b,
                refs["naive_raw"]["result"]["seconds"],
                refs["naive_raw"]["cpu"],
                refs["naive_raw"]["peak_rss"],
                f"{refs['naive_raw']['result']['files']} with raw",
            ),
        ]
        for label, m in runs.items():
            r = m["result"]
            files, hours, worst = m["files"]
            per_hour = (
                f"{files} data ({files / hours:.1f}/hour, max {worst}) + {r['files']['raw']} raw"
            )
            # MB/s counts message values, as the references do (the load is the same data).
            load = b * r["messages"] / n
            lines.append(
                row(
                    f"strata {label}, whole process",
                    r["messages"],
                    load,
                    m["wall"],
                    m["cpu"],
                    m["peak_rss"],
                    per_hour,
                )
            )
            lines.append(
                row(
                    f"strata {label}, tasks (steady state)",
                    r["messages"],
                    load,
                    r["read_seconds"],
                    m["cpu"],
                    m["peak_rss"],
                    "",
                )
            )
        one = runs["1M"]["result"]
        steady = b / one["read_seconds"]
        whole = b / runs["1M"]["wall"]
        peer = naive["result"]["bytes"] / naive["result"]["seconds"]
        limit = bare["result"]["bytes"] / bare["result"]["seconds"]
        three = runs["3M"]
        three_bytes = b * three["result"]["messages"] / n
        naive_cpu_gb = naive["cpu"] / (b / 1e9)
        figures = {
            "steady_vs_naive": round(steady / peer, 2),
            "whole_vs_naive": round(whole / peer, 2),
            "steady_vs_bare": round(steady / limit, 2),
            "steady_3m_vs_naive": round(three_bytes / three["result"]["read_seconds"] / peer, 2),
            "cpu_per_gb_3m_vs_naive": round(three["cpu"] / (three_bytes / 1e9) / naive_cpu_gb, 2),
            "cpu_per_gb_naive_raw_vs_naive": round(
                refs["naive_raw"]["cpu"] / (b / 1e9) / naive_cpu_gb, 2
            ),
            "peak_mb_1m": round(runs["1M"]["peak_rss"] / 2**20),
            "peak_mb_3m": round(runs["3M"]["peak_rss"] / 2**20),
            "peak_mb_10m": round(runs["10M"]["peak_rss"] / 2**20),
            "peak_mb_1m_5000h": round(runs["1M 5000h"]["peak_rss"] / 2**20),
            "cpu_per_gb_5000h_vs_6h": round(
                _cpu_per_gb(runs["1M 5000h"], b, n) / _cpu_per_gb(runs["1M 6h"], b, n), 2
            ),
            "cpu_per_gb_10m_vs_naive": round(
                runs["10M"]["cpu"]
                / (b * runs["10M"]["result"]["messages"] / n / 1e9)
                / naive_cpu_gb,
                2,
            ),
            "spark_start_s": one["spark_start_seconds"],
            "shuffle_vs_per_task": round(
                one["read_seconds"] / runs["1M shuffle"]["result"]["read_seconds"], 2
            ),
            **upkeep,
            **scale,
            **routed,
            **aged,
            **by_format,
        }
        lines += [
            "",
            f"tasks: {PARTITIONS} partitions split over 2 Spark tasks (local[2]); each task's "
            "consumer is assigned 2 partitions. The references use one consumer for all 4.",
            f"steady state vs naive peer: {figures['steady_vs_naive']}x at 1M, "
            f"{figures['steady_3m_vs_naive']}x at 3M (target >= 1.5x at 3M); "
            f"whole process vs naive peer: {figures['whole_vs_naive']}x at 1M (target >= 1x); "
            f"steady vs bare loop: {figures['steady_vs_bare']}x",
            f"CPU per GB vs naive peer: strata 3M whole tree "
            f"{figures['cpu_per_gb_3m_vs_naive']}x (target <= 1.5x), 10M "
            f"{figures['cpu_per_gb_10m_vs_naive']}x; naive + raw copy "
            f"{figures['cpu_per_gb_naive_raw_vs_naive']}x",
            *where_time(runs),
            f"peak memory (process tree): {figures['peak_mb_1m']} MB at 1M, "
            f"{figures['peak_mb_3m']} MB at 3M, {figures['peak_mb_10m']} MB at 10M, "
            f"{figures['peak_mb_1m_5000h']} MB at 1M over 5,000 event hours (target: flat)",
            f"CPU per GB over 5,000 event hours vs 6: {figures['cpu_per_gb_5000h_vs_6h']}x "
            "(target <= 2x)",
            f"Spark start-up: {figures['spark_start_s']:.1f}s",
            f"shuffle layout vs per-task layout, steady state: {figures['shuffle_vs_per_task']}x "
            "(fewer files per hour, rows moved once more)",
            json.dumps(figures),
            *where,
            *upkeep_lines,
            *scale_lines,
            *routed_lines,
            *history_lines,
            *format_lines,
        ]
        print("\n".join(lines))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
