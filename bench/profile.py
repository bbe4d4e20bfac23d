"""`make profile`: where `strata run` spends its Python time, sampled by py-spy.

Seeds the bench's load (1,000,000 JSON events by default, `PROFILE_EVENTS` to change)
into a local Apache Kafka, runs `strata run` under `py-spy record --subprocesses`, which
follows the driver and every Spark Python worker it forks, and prints, per kind of
process, the functions the samples were in (their own time) and the share of the
stages the task code is built of (time inside them, callees included). py-spy samples
only threads that are running, so the shares are of CPU, not of waiting. The JVM is
not Python and is not sampled; `make bench` gives its CPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench.harness import local_kafka, seed, strata_project

# The stages of a task, by the function that does each (inclusive time).
STAGES = {
    "fetch from Kafka + Arrow columns": "read_ranges",
    "decode + validation": "decode_chunk",
    "writes (raw, data, quarantine)": "write (strata/write.py",
    "statistics": "_tally",
    "closing files": "close (strata/write.py",
}
_FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:]+):?\d*\)$")


def _kind(frames: list[str]) -> str:
    # py-spy names the chain of processes first, parent to child: the last is the sampled
    # one. The daemon forks one worker per task, and otherwise only waits and forks.
    chain = [f for f in frames if f.startswith("process ")]
    if not _daemon(chain[-1]):
        return "driver"
    return "task workers" if len(chain) >= 2 and _daemon(chain[-2]) else "daemon"


def _daemon(process: str) -> bool:
    # Spark's own daemon module, or the one Strata sets (`spark.python.daemon.module`).
    return "pyspark.daemon" in process or "strata.spark.daemon" in process


def summarise(raw: str, top: int = 15) -> list[str]:
    """The report of py-spy's raw (collapsed stack) output."""
    own: dict[str, Counter[str]] = {}
    inside: dict[str, Counter[str]] = {}
    totals: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        kind = _kind(frames)
        n = int(count)
        totals[kind] += n
        leaf = frames[-1]
        match = _FRAME.match(leaf)
        name = leaf if match is None else f"{match['func']} ({_short(match['file'])})"
        own.setdefault(kind, Counter())[name] += n
        joined = ";".join(f for f in frames if not f.startswith("process "))
        for stage, marker in STAGES.items():
            if marker in joined:
                inside.setdefault(kind, Counter())[stage] += n
    lines = []
    for kind in sorted(totals):
        lines.append(f"{kind}: {totals[kind]:,} samples")
        for stage, n in inside.get(kind, Counter()).most_common():
            lines.append(f"  stage {stage:<36} {n / totals[kind]:6.1%}")
        for name, n in own[kind].most_common(top):
            lines.append(f"  own   {name[:90]:<90} {n / totals[kind]:6.1%}")
    return lines


def _short(path: str) -> str:
    for marker in ("site-packages/", "/strata/"):
        if marker in path:
            return ("strata/" if marker == "/strata/" else "") + path.split(marker, 1)[1]
    return path


def main() -> int:
    """Seed, profile one run, print the report."""
    events = int(os.environ.get("PROFILE_EVENTS", "1000000"))
    python = Path(sys.executable)
    strata, spy = str(python.parent / "strata"), str(python.parent / "py-spy")
    work = Path(tempfile.mkdtemp(prefix="strata-profile-"))
    try:
        with local_kafka(work) as broker:
            seed(broker, "profile", events)
            conf = strata_project(work / "strata", "profile", broker.bootstrap, "per_task")
            out = work / "samples.txt"
            env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
            command = [spy, "record", "--subprocesses", "--format", "raw", "--rate", "100"]
            command += ["--output", str(out), "--"]
            command += [strata, "run", "--pipeline", "bench", "--conf-dir", str(conf), "--json"]
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            print("\n".join(summarise(out.read_text())))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
