"""A local Hive Metastore: the real thrift service, from the jars the pyspark wheel ships.

It runs on Derby in a directory of its own, on a loopback port. Production points
`metastore.uri` at its existing metastore (whose database would be PostgreSQL or
MySQL); nothing else changes.

The wheel's metastore is Hive 2.3, whose server has no bind-host setting: its
`HiveMetaStore` main binds the thrift socket to every interface. So the service is
started by a small launcher that builds the same server (handler, processor and
protocols as Hive 2.3's non-Kerberos path) on a socket bound to loopback only. The
launcher is compiled at start with Janino, the Java compiler the wheel ships for
Spark's code generation, so a Java runtime without a JDK suffices.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from xml.sax.saxutils import escape

from strata.local.service import LocalService, port_open

LAUNCHER_CLASS = "StrataLocalMetastore"
STATE_FILE = "metastore.json"
LOOPBACK = "127.0.0.1"
# Janino's javac-compatible command line.
JANINO_MAIN = "org.codehaus.commons.compiler.samples.CompilerDemo"

# Hive 2.3's `HiveMetaStore.startMetaStore` without SASL, SSL, framed transport or the
# compact protocol (none of which a local Derby metastore uses), on a socket bound to
# the address given. Janino erases generics, so the server's arguments are set one
# call at a time rather than chained through their self-typed builders.
LAUNCHER_SOURCE = """\
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.URI;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.hive.common.LogUtils;
import org.apache.hadoop.hive.conf.HiveConf;
import org.apache.hadoop.hive.metastore.HiveMetaStore;
import org.apache.hadoop.hive.metastore.IHMSHandler;
import org.apache.hadoop.hive.metastore.TSetIpAddressProcessor;
import org.apache.hadoop.hive.metastore.txn.TxnStore;
import org.apache.hadoop.hive.metastore.txn.TxnUtils;
import org.apache.thrift.protocol.TBinaryProtocol;
import org.apache.thrift.server.TThreadPoolServer;
import org.apache.thrift.transport.TServerSocket;
import org.apache.thrift.transport.TTransportFactory;
import org.apache.hadoop.util.Progressable;

public class StrataLocalMetastore {
    public static void main(String[] args) throws Throwable {
        InetSocketAddress address = new InetSocketAddress(args[0], Integer.parseInt(args[1]));
        LogUtils.initHiveLog4j();
        HiveConf conf = new HiveConf(HiveMetaStore.HMSHandler.class);
        long maxMessage = conf.getLongVar(HiveConf.ConfVars.METASTORESERVERMAXMESSAGESIZE);
        IHMSHandler handler = HiveMetaStore.newRetryingHMSHandler(
            new HiveMetaStore.HMSHandler("new db based metaserver", conf, false), conf);
        TThreadPoolServer.Args server = new TThreadPoolServer.Args(new TServerSocket(address));
        server.processor(new TSetIpAddressProcessor(handler));
        server.transportFactory(new TTransportFactory());
        server.protocolFactory(new TBinaryProtocol.Factory());
        server.inputProtocolFactory(
            new TBinaryProtocol.Factory(true, true, maxMessage, maxMessage));
        server.minWorkerThreads(conf.getIntVar(HiveConf.ConfVars.METASTORESERVERMINTHREADS));
        server.maxWorkerThreads(conf.getIntVar(HiveConf.ConfVars.METASTORESERVERMAXTHREADS));
        // In test mode each transaction store creates the lock tables (TXNS, HIVE_LOCKS,
        // ...) if absent, and two doing so at once race: one fails. The first is made
        // here, before the port opens, so every later one finds them.
        final TxnStore store = TxnUtils.getTxnStore(conf);
        // The lock reaper a production metastore runs as its housekeeper: a lock whose
        // holder died (a commit killed inside it) goes after hive.txn.timeout.
        Thread reaper = new Thread(new Runnable() {
            public void run() {
                while (true) {
                    try {
                        store.performTimeOuts();
                        Thread.sleep(2000L);
                    } catch (Throwable e) {
                        try { Thread.sleep(2000L); } catch (InterruptedException stop) { return; }
                    }
                }
            }
        });
        reaper.setDaemon(true);
        reaper.start();
        new TThreadPoolServer(server).serve();
    }
}

// What the metastore sees of an object store (s3://) it has no connector for: every
// path a directory that exists. It only checks and creates table and database
// directories there; it never reads or writes the tables' data.
class StrataObjectStoreStandIn extends FileSystem {
    private URI uri;
    private Path cwd = new Path("/");

    public void initialize(URI name, Configuration conf) throws IOException {
        super.initialize(name, conf);
        String authority = name.getAuthority() == null ? "" : name.getAuthority();
        uri = URI.create(name.getScheme() + "://" + authority);
        setConf(conf);
    }

    public URI getUri() { return uri; }

    public FSDataInputStream open(Path f, int bufferSize) throws IOException {
        throw new IOException("the local metastore does not read " + f);
    }

    public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite,
            int bufferSize, short replication, long blockSize, Progressable progress)
            throws IOException {
        throw new IOException("the local metastore does not write " + f);
    }

    public FSDataOutputStream append(Path f, int bufferSize, Progressable progress)
            throws IOException {
        throw new IOException("the local metastore does not write " + f);
    }

    public boolean rename(Path src, Path dst) { return false; }

    public boolean delete(Path f, boolean recursive) { return false; }

    public FileStatus[] listStatus(Path f) { return new FileStatus[0]; }

    public void setWorkingDirectory(Path dir) { cwd = dir; }

    public Path getWorkingDirectory() { return cwd; }

    public boolean mkdirs(Path f, FsPermission permission) { return true; }

    public FileStatus getFileStatus(Path f) {
        return new FileStatus(0L, true, 1, 0L, 0L, f.makeQualified(uri, cwd));
    }
}
"""


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
        # Iceberg commits take a table lock through the metastore's lock API, whose
        # tables (TXNS, HIVE_LOCKS, ...) are not the JDO schema autoCreateAll makes:
        # in test mode Hive 2.3 creates them in Derby at start.
        "hive.in.test": "true",
        # The jars carry HikariCP, not the BoneCP pool Hive 2.3 picks by default for
        # those tables' connections.
        "datanucleus.connectionPoolingType": "HikariCP",
        # A lock whose holder died (a committer killed mid-commit) is given up after
        # this long (by the launcher's reaper) instead of five minutes; a commit holds
        # it for well under a second.
        "hive.txn.timeout": "20s",
        # Tables on an object store: the wheel has no S3 connector, and the metastore
        # needs none to record where a table is (see the launcher's stand-in).
        "fs.s3.impl": "StrataObjectStoreStandIn",
        "fs.s3a.impl": "StrataObjectStoreStandIn",
    }
    body = "\n".join(
        f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>"
        for k, v in settings.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{body}\n</configuration>\n'


def compile_launcher(java: str, directory: Path) -> Path:
    """Compile the loopback launcher into `directory`, once per version of its source.

    Args:
        java: The `java` executable.
        directory: Where the source and its class file go.

    Returns:
        The directory, to put on the service's classpath.

    Raises:
        RuntimeError: With Janino's output, if the source does not compile against
            the wheel's jars (a pyspark whose Hive or Thrift API changed).
    """
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"{LAUNCHER_CLASS}.java"
    compiled = directory / f"{LAUNCHER_CLASS}.class"
    if compiled.exists() and source.exists() and source.read_text() == LAUNCHER_SOURCE:
        return directory
    source.write_text(LAUNCHER_SOURCE)
    compiled.unlink(missing_ok=True)
    jars = sorted(pyspark_jars().glob("*.jar"))
    janino = [str(j) for j in jars if j.name.startswith(("janino-", "commons-compiler-"))]
    # Janino's command line reads a plain list of jars; it expands no `dir/*`.
    command = [java, "-cp", ":".join(janino), JANINO_MAIN, "-d", str(directory)]
    command += ["-classpath", ":".join(map(str, jars)), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not compiled.exists():
        raise RuntimeError(
            f"could not compile the local metastore's launcher ({source}) against the "
            f"pyspark jars in {pyspark_jars()}: {(done.stdout + done.stderr).strip()[-2000:]}"
        )
    return directory


class LocalMetastore(LocalService):
    """The Hive Metastore thrift service, bound to loopback only; a context manager."""

    name = "metastore"

    def __init__(self, directory: Path, port: int | None = None) -> None:
        """Choose where the metastore keeps its Derby database, and its port.

        Args:
            directory: Directory for the Derby database, config and log.
            port: Port to listen on; a free one if None.
        """
        self.directory = directory.resolve()
        super().__init__(port, self.directory / "metastore.log")
        self.uri = f"thrift://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 120.0, detach: bool = False) -> LocalMetastore:
        """Start the service and wait until it accepts connections.

        Args:
            timeout: Seconds to wait for the port.
            detach: Keep running after this process exits (for `strata metastore up`).
        """
        from strata.spark.jvm import require_java

        require_java()
        conf = self.directory / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "hive-site.xml").write_text(hive_site(self.directory))
        home = os.environ.get("JAVA_HOME")
        java = os.path.join(home, "bin", "java") if home else "java"
        launcher = compile_launcher(java, self.directory / "launcher")
        classpath = f"{pyspark_jars()}/*:{conf}:{launcher}"
        # An IPv4 socket: Java's default dual-stack socket would show the address as
        # `::ffff:127.0.0.1`, which is the same loopback but reads as IPv6 in `ss`.
        command = [java, "-Xmx512m", "-Djava.net.preferIPv4Stack=true", "-cp", classpath]
        # Hive's log (`hive.log`, rolled daily) in the metastore's own directory: by default
        # it goes to the user's temporary directory, shared by every metastore and never
        # cleaned.
        command.append(f"-Dhive.log.dir={self.directory}")
        command += [LAUNCHER_CLASS, LOOPBACK, str(self.port)]
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
