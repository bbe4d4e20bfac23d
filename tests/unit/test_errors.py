"""Errors and exit codes: one class caught by the command line, task errors included."""

from __future__ import annotations

import pytest

from strata.cli import run_guarded
from strata.errors import (
    ConfigError,
    LeaseLost,
    ReadError,
    StrataError,
    from_task_failure,
)

# What the driver receives when a Python task raises: Spark's message, ending with the
# worker's traceback (shortened).
SPARK_TEXT = """An error occurred while calling o123.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0
failed 4 times, most recent failure: Lost task 0.3 in stage 3.0 (TID 9) (127.0.0.1
executor driver): org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/site-packages/strata/task.py", line 170, in _process
    for chunk in read_ranges(...):
  File "/site-packages/strata/read.py", line 340, in read_ranges
    raise {raised}
{module}.{name}: {message}
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException
"""


def _spark_error(name: str, message: str, module: str = "strata.errors") -> str:
    return SPARK_TEXT.format(raised=name, module=module, name=name, message=message)


@pytest.mark.parametrize(
    ("kind", "code"), [(ReadError, 1), (LeaseLost, 3), (ConfigError, 2)], ids=lambda v: str(v)
)
def test_an_error_of_ours_raised_in_a_task_comes_back_as_itself(kind, code):
    text = _spark_error(kind.__name__, "no progress for 60s: partition 0 of `clicks`")
    found = from_task_failure(text)
    assert type(found) is kind and found.exit_code == code
    assert str(found) == "no progress for 60s: partition 0 of `clicks`"


def test_other_task_errors_and_unknown_names_are_not_ours():
    assert from_task_failure(_spark_error("ValueError", "bad", module="builtins")) is None
    assert from_task_failure(_spark_error("NotAnError", "bad")) is None
    # `re` is imported by the errors module; a name there that is no error of ours.
    assert from_task_failure(_spark_error("re", "bad")) is None
    assert from_task_failure("plain text without a traceback") is None


def test_the_command_line_ends_with_the_exit_code_the_error_carries(capsys):
    def raises(exc: BaseException):
        def action():
            raise exc

        return action

    assert run_guarded(raises(LeaseLost("lost the lease")), as_json=False) == 3
    assert "strata: error: lost the lease" in capsys.readouterr().err
    # A task's error reaches the driver wrapped by Spark; its own code still decides.
    wrapped = RuntimeError(_spark_error("LeaseLost", "lost the lease in a task"))
    assert run_guarded(raises(wrapped), as_json=False) == 3
    assert "strata: error: lost the lease in a task" in capsys.readouterr().err
    assert run_guarded(raises(RuntimeError("boom")), as_json=False) == 1
    assert issubclass(LeaseLost, StrataError)
