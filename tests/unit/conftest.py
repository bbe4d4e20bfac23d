"""The unit tier: pure Python, no Java, broker, Spark, metastore, S3 server or browser.

A test under this directory that asks for a fixture starting a service, or carries the
`integration` marker, belongs in `tests/integration`: collection stops and names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent

# The fixtures of tests/conftest.py that start a service.
SERVICES = {
    "broker",
    "kafka",
    "metastore",
    "spark",
    "s3_endpoint",
    "make_pipeline",
    "airflow_db",
    "trino",
    "delta_spark",
}


# The hook sees every test of the session, not only this directory's.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    wrong = []
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        started = SERVICES.intersection(getattr(item, "fixturenames", ()))
        if started or item.get_closest_marker("integration"):
            why = ", ".join(sorted(started)) or "the integration marker"
            wrong.append(f"{item.nodeid} ({why})")
    if wrong:
        raise pytest.UsageError(
            "unit tests that need services, move them to tests/integration:\n  "
            + "\n  ".join(wrong)
        )
