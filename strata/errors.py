"""Every error Strata raises on purpose, and the exit code each one means.

A command catches `StrataError` alone: its message is written for the operator (what
happened, and the way out), and `exit_code` is what the process ends with: 2 for
configuration, 3 when another runner holds the pipeline, 1 for everything else. An
error of a library that reaches the command line is not one of these; the command
prints its meaningful line and exits 1.

Errors raised inside a Spark task reach the driver only as text; `from_task_failure`
finds ours in it by this module's name, so a task's `ReadError` ends the command as a
`ReadError` would have on the driver.
"""

from __future__ import annotations

import re


class StrataError(Exception):
    """An error whose message says what happened and what to do; ends a command."""

    exit_code = 1


class ConfigError(StrataError):
    """A configuration file is missing or invalid; the message names file, key and fix."""

    exit_code = 2


class SchemaError(StrataError):
    """An Avro schema cannot be turned into table columns."""

    exit_code = 2


class LockBusy(StrataError):
    """Another run of the same pipeline is in flight."""

    exit_code = 3


class LeaseLost(StrataError):
    """This run no longer holds its lease; it must not commit anything more."""

    exit_code = 3


class LeaseUnavailable(StrataError):
    """The lease could not be read or written; nothing was done."""


class PlanError(StrataError):
    """The broker's state makes a safe plan impossible; the message says what to do."""


class TableMismatch(StrataError):
    """A table is not the one the ledger's batches went to (gone, replaced, older, another's);
    nothing was read or written, and the message names the ways out."""


class LedgerDamaged(StrataError):
    """A ledger commit's record cannot be read (its log entry edited or damaged); nothing
    was read or written."""


class KafkaUnavailable(StrataError):
    """The brokers, a topic or a partition could not be reached in time."""


class SchemaRegistryUnavailable(StrataError):
    """The Schema Registry could not be reached, or refused a request; nothing was quarantined."""


class ReadError(StrataError):
    """A planned range could not be read."""


class ReconcileError(StrataError):
    """Offsets read do not equal rows + quarantined + gaps, or the tables disagree."""


class TombstoneRefused(StrataError):
    """A batch met a tombstone under `on_tombstone: fail`; nothing of it was committed."""


class BackfillError(StrataError):
    """The backfill or replay cannot be done as asked; nothing was changed."""


class LedgerEditError(StrataError):
    """A ledger edit cannot be made as asked; nothing was changed."""


class MaintenanceError(StrataError):
    """Compaction, a checkpoint or vacuum cannot be done as asked; nothing was changed."""


class MetastoreError(StrataError):
    """The metastore could not be reached, or refused a change."""


class QueryError(StrataError):
    """A statement `strata sql query` will not run: not one query, or one the engine refuses."""

    exit_code = 2


class QualityError(StrataError):
    """Quality cannot be checked as asked (no such batch, a bad expectation)."""


class QualityGateFailed(StrataError):
    """A batch failed its quality suite under `quality.gate: fail`."""


class JavaMissing(StrataError):
    """No suitable Java runtime for Spark."""


class KafkaJarsMissing(StrataError):
    """The local Apache Kafka's jars are not in the cache `make setup` fills."""


class StorageError(StrataError, OSError):
    """A request to the object store failed; the message names the location and the cause.

    Also an `OSError`, as the file system errors it stands beside are.
    """


class UnsafePartitionValue(StrataError, ValueError):
    """A partition value that would not stay one directory inside the table."""


_RAISED_IN_TASK = re.compile(r"^strata\.errors\.(\w+): (.*)$", re.MULTILINE)


def from_task_failure(text: str) -> StrataError | None:
    """The error of ours a failed Spark task raised, from the text the driver received.

    Args:
        text: The message of the exception Spark raised on the driver; it ends with the
            worker's Python traceback.

    Returns:
        The same kind of error with the task's message (its first line), or None if
        the task failed with something else.
    """
    found = _RAISED_IN_TASK.findall(text)
    if not found:
        return None
    name, message = found[-1]
    kind = globals().get(name)
    if not (isinstance(kind, type) and issubclass(kind, StrataError)):
        return None
    return kind(message)


def root_cause(exc: BaseException) -> tuple[str, int]:
    """The meaningful line of any error and its exit code, digging into Spark's errors.

    A failed task reaches the driver as Spark's exception whose text ends with the
    worker's traceback: an error of ours in it ends the command as it would have on
    the driver; otherwise the last unindented line names the real error.
    """
    text = str(exc)
    ours = from_task_failure(text)
    if ours is not None:
        return str(ours), ours.exit_code
    if "Traceback (most recent call last)" in text:
        tail = text.rsplit("Traceback (most recent call last)", 1)[1].splitlines()
        raised = [line for line in tail if line and not line[0].isspace() and ": " in line]
        if raised:
            return f"a task failed: {raised[-1]}", 1
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else text}", 1
