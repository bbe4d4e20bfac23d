"""The integration tier: every test under this directory carries the `integration` marker.

The tier follows the directory, so `-m "not integration"` selects `tests/unit` alone.
The fixtures that start services (broker, Spark, metastore, S3) are in `tests/conftest.py`;
the Spark Thrift Server, which only integration tests query, is here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


# First, so that `-m` deselects by the marker added here. The hook sees every test
# of the session, not only this directory's.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def thriftserver(tmp_path_factory, metastore):
    """The Spark Thrift Server (HiveServer2, NOSASL) on the session's metastore, started once."""
    from strata.local.thriftserver import LocalThriftServer

    with LocalThriftServer(tmp_path_factory.mktemp("thriftserver"), metastore.uri) as server:
        yield server
