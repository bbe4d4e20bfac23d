"""`make bench`: a known load into the local broker, the real job, and two references.

Produces 1,000,000 JSON click events (about 190 MB, 4 partitions), then measures in
the same run, on the same data: the bare consume loop, the naive one-process peer,
and `strata run` (a real process: Spark driver, JVM and Python workers). The job is
then run again on 3,000,000 events to show that its memory is flat in batch size.

CPU is measured for each program's whole process tree, never the broker's.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import yaml
from deltalake import DeltaTable

from strata.demo import HOUR_MS, click_events, produce
from strata.local_broker import LocalBroker

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 4
START_MS = 1_763_805_600_000


def measure(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a command; return wall time, CPU of its process tree, peak tree RSS, last JSON line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    cpu_seen: dict[int, float] = {}
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                tree = [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            rss = 0
            for p in tree:
                try:
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    cpu_seen[p.pid] = t.user + t.system
                except psutil.NoSuchProcess:
                    pass
            peak = max(peak, rss)
            done.wait(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    wall = time.monotonic() - began
    done.set()
    watcher.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    last = json.loads(out.strip().splitlines()[-1])
    # Reaped children count exactly; sampling catches processes reaped by no one.
    return {
        "wall": wall,
        "cpu": max(reaped, sum(cpu_seen.values())),
        "peak_rss": peak,
        "result": last,
    }


def seed(broker: LocalBroker, topic: str, count: int) -> int:
    """Produce clean click events over 24 event hours; returns the bytes produced."""
    broker.create_topic(topic, PARTITIONS)
    began = time.monotonic()
    produce(broker.bootstrap, topic, PARTITIONS, click_events(count, START_MS, 24, seed=11))
    last = START_MS + 24 * HOUR_MS - 1
    seal = {"event_id": "seal", "user_id": 0, "page": "/", "device": "desktop", "ts": last}
    broker.seal(topic, list(range(PARTITIONS)), json.dumps(seal).encode(), timestamp_ms=last)
    print(
        f"  produced {count:,} events to `{topic}` in {time.monotonic() - began:.1f}s", flush=True
    )
    return count


def strata_project(work: Path, topic: str, bootstrap: str, layout: str) -> Path:
    """A throw-away project directory (conf + schemas) for the bench pipeline."""
    (work / "conf" / "pipelines").mkdir(parents=True)
    shutil.copytree(ROOT / "schemas", work / "schemas")
    body = {
        "topics": [topic],
        "format": "json",
        "schema_file": "clicks.avsc",
        "warehouse": str(work / "warehouse"),
        "event_time": {"field": "ts", "unit": "ms"},
        "kafka": {"bootstrap_servers": bootstrap},
        "spark": {"master": "local[2,4]"},
        "layout": layout,
        # The ingest is measured; the quality suite is its own step (`strata quality`).
        "quality": {"gate": "off"},
    }
    (work / "conf" / "pipelines" / "bench.yaml").write_text(yaml.safe_dump(body))
    return work / "conf"


def files_per_hour(table_uri: str) -> tuple[int, int, float]:
    """(files, event hours, max files in one hour) of a Delta table."""
    adds = pa.table(DeltaTable(table_uri).get_add_actions(flatten=True))
    hours = Counter(
        zip(
            adds.column("partition.dt").to_pylist(),
            adds.column("partition.hr").to_pylist(),
            strict=True,
        )
    )
    return adds.num_rows, len(hours), max(hours.values())


def row(
    name: str, messages: int, nbytes: int, seconds: float, cpu: float, peak: int, files: str
) -> str:
    return (
        f"{name:<34} {messages / seconds:>10,.0f} {nbytes / 1e6 / seconds:>8.1f} "
        f"{cpu / (nbytes / 1e9):>10.1f} {peak / 2**20:>9,.0f}  {files}"
    )


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
            for kind in ("bare", "naive"):
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
            cases = (
                ("1M", "bench1m", None, "per_task"),
                ("1M shuffle", "bench1m", None, "shuffle"),
                ("3M", "bench3m", 3_000_000, "per_task"),
            )
            for label, topic, count, layout in cases:
                if count:
                    seed(broker, topic, count)
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
        figures = {
            "steady_vs_naive": round(steady / peer, 2),
            "whole_vs_naive": round(whole / peer, 2),
            "steady_vs_bare": round(steady / limit, 2),
            "peak_mb_1m": round(runs["1M"]["peak_rss"] / 2**20),
            "peak_mb_3m": round(runs["3M"]["peak_rss"] / 2**20),
            "spark_start_s": one["spark_start_seconds"],
            "shuffle_vs_per_task": round(
                one["read_seconds"] / runs["1M shuffle"]["result"]["read_seconds"], 2
            ),
        }
        lines += [
            "",
            f"tasks: {PARTITIONS} partitions split over 2 Spark tasks (local[2]); each task's "
            "consumer is assigned 2 partitions. The references use one consumer for all 4.",
            f"steady state vs naive peer: {figures['steady_vs_naive']}x (target >= 0.8x); "
            f"whole process vs naive peer: {figures['whole_vs_naive']}x; "
            f"steady vs bare loop: {figures['steady_vs_bare']}x",
            f"peak memory (process tree): {figures['peak_mb_1m']} MB at 1M, "
            f"{figures['peak_mb_3m']} MB at 3M (target < 3072 MB, flat)",
            f"Spark start-up: {figures['spark_start_s']:.1f}s",
            f"shuffle layout vs per-task layout, steady state: {figures['shuffle_vs_per_task']}x "
            "(fewer files per hour, rows moved once more)",
            json.dumps(figures),
        ]
        print("\n".join(lines))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
