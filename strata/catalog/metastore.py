"""A thin client for the Hive Metastore's thrift API.

Only the calls registration needs, each bounded by a socket timeout, with errors
turned into `MetastoreError` sentences. The thrift bindings come from the
`pymetastore` package; its generated code speaks to Hive 2.3 and 3.x metastores.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import urlparse

from pymetastore.hive_metastore import ThriftHiveMetastore
from pymetastore.hive_metastore.ttypes import (
    AddPartitionsRequest,
    AlreadyExistsException,
    Database,
    NoSuchObjectException,
    Partition,
    Table,
)
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TException
from thrift.transport import TSocket, TTransport

from strata.errors import MetastoreError


class MetastoreClient:
    """A connection to one metastore; a context manager."""

    def __init__(self, uri: str, timeout_s: float) -> None:
        """Prepare a connection.

        Args:
            uri: `thrift://host:port`.
            timeout_s: Bound on connecting and on every call.
        """
        parsed = urlparse(uri)
        if parsed.scheme != "thrift" or not parsed.hostname or not parsed.port:
            raise MetastoreError(f"metastore uri {uri!r} is not of the form thrift://host:port")
        self.uri = uri
        socket = TSocket.TSocket(parsed.hostname, parsed.port)
        socket.setTimeout(int(timeout_s * 1000))
        self._transport = TTransport.TBufferedTransport(socket)
        self._client = ThriftHiveMetastore.Client(TBinaryProtocol(self._transport))

    def __enter__(self) -> MetastoreClient:
        try:
            self._transport.open()
        except TException as exc:
            raise MetastoreError(f"cannot reach the metastore at {self.uri}: {exc}") from None
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._transport.close()

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:  # noqa: ANN401
        try:
            return fn(*args)
        except (AlreadyExistsException, NoSuchObjectException):
            raise
        except TException as exc:
            detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            raise MetastoreError(f"metastore at {self.uri}: {what} failed: {detail}") from None
        except OSError as exc:
            raise MetastoreError(f"metastore at {self.uri}: {what} failed: {exc}") from None

    def ensure_database(self, name: str, location: str, description: str) -> bool:
        """Create a database unless it exists; True if created."""
        try:
            self._call("get_database", self._client.get_database, name)
            return False
        except NoSuchObjectException:
            pass
        database = Database(name=name, description=description, locationUri=location, parameters={})
        try:
            self._call(f"create database {name}", self._client.create_database, database)
        except AlreadyExistsException:
            return False  # created meanwhile by someone else: the outcome wanted
        return True

    def get_table(self, database: str, table: str) -> Table | None:
        """A table's definition, or None."""
        try:
            return self._call(
                f"get table {database}.{table}", self._client.get_table, database, table
            )
        except NoSuchObjectException:
            return None

    def create_table(self, table: Table) -> None:
        """Create a table (already existing is not an error)."""
        try:
            self._call(
                f"create table {table.dbName}.{table.tableName}", self._client.create_table, table
            )
        except AlreadyExistsException:
            pass

    def alter_table(self, table: Table) -> None:
        """Replace a table's definition."""
        self._call(
            f"alter table {table.dbName}.{table.tableName}",
            self._client.alter_table,
            table.dbName,
            table.tableName,
            table,
        )

    def partition_names(self, database: str, table: str) -> list[str]:
        """Every partition name (`dt=.../hr=...`) of a table, in one call."""
        names: list[str] = self._call(
            f"list partitions of {database}.{table}",
            self._client.get_partition_names,
            database,
            table,
            -1,
        )
        return names

    def partitions(self, database: str, table: str) -> list[Partition]:
        """Every partition of a table, with storage descriptors."""
        parts: list[Partition] = self._call(
            f"get partitions of {database}.{table}",
            self._client.get_partitions,
            database,
            table,
            -1,
        )
        return parts

    def partitions_by_names(self, database: str, table: str, names: list[str]) -> list[Partition]:
        """The named partitions of a table that exist, with storage descriptors."""
        parts: list[Partition] = self._call(
            f"get partitions of {database}.{table}",
            self._client.get_partitions_by_names,
            database,
            table,
            names,
        )
        return parts

    def alter_partitions(self, database: str, table: str, parts: list[Partition]) -> None:
        """Change existing partitions (their locations) in one call."""
        self._call(
            f"alter partitions of {database}.{table}",
            self._client.alter_partitions,
            database,
            table,
            parts,
        )

    def add_partitions(self, database: str, table: str, parts: list[Partition]) -> None:
        """Add partitions in one call; those that exist already are left alone."""
        request = AddPartitionsRequest(
            dbName=database, tblName=table, parts=parts, ifNotExists=True, needResult=False
        )
        self._call(
            f"add partitions to {database}.{table}", self._client.add_partitions_req, request
        )
