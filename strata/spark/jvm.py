"""The JVM Spark's driver runs in: the Java check, its options, and its class archive.

Starting Spark's driver loads some ten thousand classes from the jars, parsing and
verifying each: half of a local session's start-up and of the JVM's CPU in a
one-batch run. Java's class-data sharing can map them from an archive instead. The
archive is built once per Java and PySpark (`python -m strata.spark.jvm`, which `make`
runs), by a session that does what a run's driver does and dumps the classes it
loaded when it exits. A session uses it when one exists for its Java and PySpark;
the JVM checks it still matches (same Java build, same class path) and silently
starts without it otherwise, so a stale or damaged archive costs the time it saves
and nothing else.

Spark's own log goes through the log4j2 configuration beside this module, at WARN, and
the driver's stderr through a sieve that leaves out the one line Spark's launcher
makes every JVM print (`start_driver`): what a command prints is Strata's lines and
Spark's real warnings and errors.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from strata.errors import JavaMissing

# The JVM only schedules tasks and pipes task descriptions: rows never enter it. Its
# optimising compiler and parallel collector cost a quarter of a batch's CPU and buy
# nothing here; the quick compiler and the serial collector suffice.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# The child that writes the archive: a session as a run's, in a JVM of its own.
_TRAIN = (
    "import sys; from strata.spark.session import train_class_archive; "
    "train_class_archive(sys.argv[1])"
)

# A mismatched archive is reported on standard output, where a run's summary goes.
_QUIET_ARCHIVE = "-Xlog:cds=off,cds+dynamic=off"

# Spark's own log in the driver: warnings and errors, the known noise quieter (the
# file says which). A URI, so that a space in the path cannot split the option.
LOG_CONFIGURATION = Path(__file__).with_name("log4j2.properties")
LOG_OPTION = f"-Dlog4j2.configurationFile={LOG_CONFIGURATION.as_uri()}"

# Spark's launcher gives every driver JVM `--add-modules=jdk.incubator.vector` (its
# `JavaModuleOptions`, with no setting to leave it out) for MLlib's vectorised BLAS,
# which Strata never calls; the JVM then says so on stderr before anything else.
LAUNCHER_NOISE = ("WARNING: Using incubator modules: jdk.incubator.vector",)

# Passes its standard input on to its standard output line by line, less the lines
# given as its arguments. A process of its own, not a thread of the driver's: it also
# passes on what the JVM says as it shuts down, after the Python driver has exited.
_SIEVE = """
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
drop = {line.encode() for line in sys.argv[1:]}
for line in sys.stdin.buffer:
    if line.rstrip(b"\\r\\n") not in drop:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
"""


def java_binary() -> str | None:
    """The `java` a Spark session would start: `$JAVA_HOME/bin/java`, else the PATH's."""
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else shutil.which("java")


def require_java() -> str:
    """Check for Java 17 or newer, as Spark 4 needs.

    Returns:
        What `java -version` printed.

    Raises:
        JavaMissing: With the fix, if Java is absent or too old.
    """
    java = java_binary()
    if not java or not os.path.exists(java):
        raise JavaMissing(
            "java not found: Spark needs Java 17 or newer. Install openjdk-17-jre-headless "
            "(Debian/Ubuntu) or set JAVA_HOME to a JDK 17."
        )
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaMissing(
            f"{java} -version failed ({exc}); Spark needs a working Java 17+"
        ) from None
    match = re.search(r'version "(\d+)', out)
    major = int(match.group(1)) if match else 0
    if major < 17:
        raise JavaMissing(f"{java} is Java {major or 'unknown'}; Spark needs Java 17 or newer")
    # The JVM announces options taken from the environment (`JAVA_TOOL_OPTIONS`):
    # not part of the version, which keys the class archive.
    return "\n".join(line for line in out.splitlines() if "Picked up " not in line) or "java"


def class_archive(java_version: str) -> str:
    """Where the class archive of this Java and this PySpark lives (it may not exist yet).

    Args:
        java_version: What `java -version` printed (`require_java`).
    """
    key = "\n".join([os.path.realpath(java_binary() or "java"), java_version, version("pyspark")])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(sys.prefix, "share", "strata", f"spark-driver-{digest}.jsa")


def usable_archive(java_version: str) -> str | None:
    """The class archive of this Java and PySpark, if it is built and whole; else None.

    A JVM given a truncated archive crashes rather than starting without it, so the
    archive is used only when its size is the one recorded when it was built.
    """
    archive = class_archive(java_version)
    try:
        with open(f"{archive}.size") as recorded:
            size = int(recorded.read().strip() or -1)
        return archive if os.path.getsize(archive) == size else None
    except (OSError, ValueError):
        return None


def driver_options(java_version: str) -> str:
    """The driver JVM's options: `JVM_OPTIONS`, and the class archive when one is usable."""
    archive = usable_archive(java_version)
    if archive is None:
        return JVM_OPTIONS
    return f"{JVM_OPTIONS} -XX:SharedArchiveFile={archive} {_QUIET_ARCHIVE}"


_SIEVES: list[subprocess.Popen[bytes]] = []


def start_driver(properties: dict[str, str]) -> None:
    """Start the JVM of a Spark driver with these properties, unless this process has one.

    What the JVM writes to stderr reaches this process's stderr, as when PySpark starts
    it, less the one line Spark's launcher makes it print (`LAUNCHER_NOISE`). Under
    spark-submit the JVM runs already and is left as it is.

    Args:
        properties: The session's Spark properties, `spark.master` and `spark.app.name`
            among them; those of the driver JVM itself (its options, its memory) take
            effect only here, when it starts.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    sieve = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _SIEVE, *LAUNCHER_NOISE],
        stdin=subprocess.PIPE,
        # Where the JVM's stderr goes otherwise: this process's file descriptor 2.
        stdout=2,
    )
    # Held until the process ends: collected while it runs, it would be reported as
    # a subprocess left running.
    _SIEVES.append(sieve)
    conf = SparkConf(loadDefaults=False).setAll(list(properties.items()))
    try:
        popen = {"stderr": sieve.stdin}
        gateway = launch_gateway(conf, popen_kwargs=popen)  # type: ignore[no-untyped-call]
    finally:
        # The JVM holds its own end of the pipe: the sieve stops once the JVM exits.
        if sieve.stdin is not None:
            sieve.stdin.close()
    SparkContext._ensure_initialized(gateway=gateway)


def dump_options(dump_to: str) -> str:
    """The driver JVM's options for the run that writes the class archive to `dump_to`."""
    return f"{JVM_OPTIONS} -XX:ArchiveClassesAtExit={dump_to} {_QUIET_ARCHIVE}"


def build_class_archive(force: bool = False) -> str:
    """Build the class archive of this Java and PySpark, unless it exists.

    A local session in a child process runs the tasks a batch's driver runs, and its
    JVM writes the classes it loaded when it exits: to a file of its own, renamed into
    place once whole, so a run never maps a half-written archive.

    Args:
        force: Build it again even if it exists.

    Returns:
        The archive's path.

    Raises:
        JavaMissing: If there is no Java 17+.
        RuntimeError: If the session failed or the JVM wrote no archive.
    """
    java_version = require_java()
    archive = class_archive(java_version)
    if usable_archive(java_version) and not force:
        return archive
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    partial = f"{archive}.{os.getpid()}.partial"
    size_partial = f"{archive}.size.{os.getpid()}.partial"
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TRAIN, partial],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0 or not os.path.isfile(partial):
            raise RuntimeError(
                f"building the JVM class archive failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        # The size first: an archive is not used until its recorded size matches.
        with open(size_partial, "w") as size:
            size.write(str(os.path.getsize(partial)))
        os.replace(size_partial, f"{archive}.size")
        os.replace(partial, archive)
    finally:
        for leftover in (partial, size_partial):
            if os.path.exists(leftover):
                os.remove(leftover)
    return archive


def main(argv: list[str] | None = None) -> int:
    """`python -m strata.spark.jvm [--force]`: build the class archive unless it exists."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if not usable_archive(require_java()) or "--force" in args:
            sys.stdout.write(
                "building the Spark driver's class archive (once per Java and PySpark)\n"
            )
            build_class_archive(force=True)
    except (JavaMissing, RuntimeError) as exc:
        sys.stderr.write(f"strata: error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
