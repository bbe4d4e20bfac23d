"""A local Hive Metastore: the real thrift service, from the jars the pyspark wheel ships.

It runs on Derby in a directory of its own, on a loopback port. Production points
`metastore.uri` at its existing metastore (whose database would be PostgreSQL or
MySQL); nothing else changes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from xml.sax.saxutils import escape

from strata.local_service import LocalService, port_open

MAIN_CLASS = "org.apache.hadoop.hive.metastore.HiveMetaStore"
STATE_FILE = "metastore.json"


def pyspark_jars() -> Path:
    """The jars directory of the installed pyspark wheel (Hive 2.3 metastore included)."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def hive_site(directory: Path) -> str:
    """hive-site.xml for a Derby-backed metastore kept in `directory`."""
    derby = directory / "metastore_db"
    settings = {
        "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={derby};create=true",
        "javax.jdo.option.ConnectionDriverName": "org.apache.derby.iapi.jdbc.AutoloadedDriver",
        # Create the metastore's own schema on first start; Derby has no installer step.
        "datanucleus.schema.autoCreateAll": "true",
        "hive.metastore.schema.verification": "false",
        # The async logger needs a jar the wheel lacks; synchronous logging works.
        "hive.async.log.enabled": "false",
        "hive.metastore.warehouse.dir": str(directory / "warehouse"),
    }
    body = "\n".join(
        f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>"
        for k, v in settings.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{body}\n</configuration>\n'


class LocalMetastore(LocalService):
    """The Hive Metastore thrift service on a loopback port; a context manager."""

    name = "metastore"

    def __init__(self, directory: Path, port: int | None = None) -> None:
        """Choose where the metastore keeps its Derby database, and its port.

        Args:
            directory: Directory for the Derby database, config and log.
            port: Port to listen on; a free one if None.
        """
        self.directory = directory.resolve()
        super().__init__(port, self.directory / "metastore.log")
        self.uri = f"thrift://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0, detach: bool = False) -> LocalMetastore:
        """Start the service and wait until it accepts connections.

        Args:
            timeout: Seconds to wait for the port.
            detach: Keep running after this process exits (for `strata metastore up`).
        """
        from strata.spark import require_java

        require_java()
        conf = self.directory / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "hive-site.xml").write_text(hive_site(self.directory))
        home = os.environ.get("JAVA_HOME")
        java = os.path.join(home, "bin", "java") if home else "java"
        classpath = f"{pyspark_jars()}/*:{conf}"
        command = [java, "-Xmx512m", "-cp", classpath, MAIN_CLASS, "-p", str(self.port)]
        # Derby writes derby.log to the working directory.
        self._spawn(command, cwd=self.directory, detach=detach)
        self._wait(timeout)
        if detach and self._proc is not None:
            state = {"pid": self._proc.pid, "port": self.port, "uri": self.uri}
            (self.directory / STATE_FILE).write_text(json.dumps(state))
        return self


def metastore_up(directory: Path, port: int | None = None) -> dict[str, object]:
    """Start a detached local metastore, unless one recorded in `directory` still runs.

    Returns:
        The running service's pid, port and URI.
    """
    running = metastore_running(directory)
    if running is not None:
        return running
    service = LocalMetastore(directory, port).start(detach=True)
    state: dict[str, object] = json.loads((service.directory / STATE_FILE).read_text())
    return state


def metastore_running(directory: Path) -> dict[str, object] | None:
    """The recorded service in `directory`, if its process is alive and listening."""
    path = directory / STATE_FILE
    if not path.exists():
        return None
    state: dict[str, object] = json.loads(path.read_text())
    pid, port = state.get("pid"), state.get("port")
    if not isinstance(pid, int) or not isinstance(port, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return state if port_open(port) else None


def metastore_down(directory: Path, timeout: float = 30.0) -> bool:
    """Stop the detached metastore recorded in `directory`.

    Returns:
        Whether a running service was stopped.
    """
    state = metastore_running(directory)
    (directory / STATE_FILE).unlink(missing_ok=True)
    if state is None:
        return False
    pid = state["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    return True
