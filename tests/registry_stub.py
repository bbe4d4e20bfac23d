"""A stand-in Schema Registry that answers what a test tells it to, over real HTTP.

The local registry (`strata.local.schema_registry`) answers as a healthy registry
does. What no healthy registry can be made to do here is served by this one instead:
a 5xx, an answer slower than the client's timeout, a proxy's 404 without an error
code, a 403, or a schema the real registry would have refused on registration. Each
path (with its query string dropped) maps to (HTTP status, JSON body); the rest get
the registry's 404 for a wrong path. Requests are recorded, by path, in order.

What the local registry itself served is read from its log (`served`).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class StubRegistry:
    """A loopback HTTP server with fixed answers per path; a context manager."""

    def __init__(self, answers: dict[str, tuple[int, Any]], delay_s: float = 0.0) -> None:
        self.answers = answers
        self.delay_s = delay_s
        self.requests: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                path = urlsplit(self.path).path
                stub.requests.append(path)
                if stub.delay_s:
                    time.sleep(stub.delay_s)
                status, body = stub.answers.get(
                    path, (404, {"error_code": 404, "message": "HTTP 404 Not Found"})
                )
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up waiting: that is what a delay is for

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> StubRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def served(log: Path, prefix: str = "/schemas/ids/") -> Counter[str]:
    """The GET requests the local registry served under a path prefix, by path.

    Args:
        log: The local registry's log (`LocalSchemaRegistry.log_path`), a line per
            request: `GET /schemas/ids/7 -> 404`.
        prefix: The paths counted.
    """
    found: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines():
        method, _, rest = line.partition(" ")
        path = rest.split(" ", 1)[0]
        if method == "GET" and path.startswith(prefix):
            found[path] += 1
    return found
