"""A local Schema Registry: the REST subset Confluent's clients call, for the tests and demos.

No Confluent Schema Registry can be installed here, so this small server speaks its
protocol over HTTP on a loopback port, keeping schemas in memory: registering a
schema under a subject (the same schema again keeps its id), looking one up, fetching
a schema by id (with its `schemaType` when it is not Avro), a subject's versions, one
version of a subject, and the list of subjects. Errors are sent as the registry sends
them, a JSON body with `error_code` and `message` and the matching HTTP status (40403
schema not found with 404, 40401 subject not found, 40402 version not found, 42201
invalid schema and 42202 invalid version with 422, 401 without the right credentials).
With a user and password it asks for HTTP basic auth on every request.

A schema may carry `references` (name, subject, version), sent back wherever the
schema is. Confluent's registry refuses a reference it cannot resolve; these are kept
unchecked, so tests can make what a registry can still serve (a reference a lagging
follower does not know yet, or to a subject deleted since) and what it never should
(a cycle). A schema with references is not parsed on registration.

Producers in the tests use confluent-kafka's `AvroSerializer` against it, and Strata's
decoder its `SchemaRegistryClient`, so the real client code runs on both ends.
Production points `schema_registry.url` at its registry.

Run as `python -m strata.local.schema_registry PORT`; the credentials, if any, come
in the environment (`STRATA_LOCAL_REGISTRY_AUTH=user:password`), never on the command
line, where `ps` would show them.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from strata.local.service import LocalService

AUTH_ENV = "STRATA_LOCAL_REGISTRY_AUTH"
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class LocalSchemaRegistry(LocalService):
    """The local registry as a child process on a free loopback port; a context manager."""

    name = "schema registry"

    def __init__(
        self, port: int | None = None, username: str | None = None, password: str | None = None
    ) -> None:
        """Choose a port and, optionally, the credentials every request must carry.

        Args:
            port: Port to listen on; a free one if None.
            username: Basic-auth user; with `password`, requests without them get 401.
            password: Basic-auth password.
        """
        log = Path(tempfile.gettempdir()) / f"schema-registry-{os.getpid()}-{id(self)}.log"
        super().__init__(port, log)
        self.url = f"http://127.0.0.1:{self.port}"
        self._auth = f"{username}:{password}" if username is not None else None

    def start(self, timeout: float = 30.0) -> LocalSchemaRegistry:
        """Start the server and wait until it answers."""
        env = {k: v for k, v in os.environ.items() if k != AUTH_ENV}
        if self._auth is not None:
            env[AUTH_ENV] = self._auth
        self._spawn([sys.executable, "-m", __name__, str(self.port)], env=env)
        self._wait(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                # Any HTTP answer will do, 401 included: the server is serving.
                urllib.request.urlopen(f"{self.url}/subjects", timeout=1).close()
                return self
            except urllib.error.HTTPError:
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self._fail(f"the {self.name} did not answer within {timeout:.0f}s")
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server; its schemas go with it."""
        super().stop()
        self.log_path.unlink(missing_ok=True)


class _Store:
    """Schemas by id, and each subject's versions (ids), as the registry keeps them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.schemas: list[dict[str, Any]] = []  # id N is schemas[N - 1]
        self.subjects: dict[str, list[int]] = {}

    def register(self, subject: str, schema: dict[str, Any]) -> int:
        with self.lock:
            if schema in self.schemas:
                schema_id = self.schemas.index(schema) + 1
            else:
                self.schemas.append(schema)
                schema_id = len(self.schemas)
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id


class _HTTPError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _schema_body(schema: dict[str, Any]) -> dict[str, Any]:
    """A stored schema as the registry shows it: `schemaType` only when not Avro."""
    body: dict[str, Any] = {"schema": schema["schema"]}
    if schema["schemaType"] != "AVRO":
        body["schemaType"] = schema["schemaType"]
    if schema["references"]:
        body["references"] = schema["references"]
    return body


def _normalised(body: Any) -> dict[str, Any]:  # noqa: ANN401 - a request's JSON
    """A schema from a request body, checked as the registry checks one."""
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise _HTTPError(422, 42201, "Invalid schema: the body needs a `schema` string")
    kind = str(body.get("schemaType") or "AVRO").upper()
    if kind not in ("AVRO", "JSON", "PROTOBUF"):
        raise _HTTPError(422, 42201, f"Invalid schema type {kind}")
    references = body.get("references") or []
    if kind == "AVRO" and not references:
        from fastavro import parse_schema

        try:
            parse_schema(json.loads(body["schema"]))
        except Exception as exc:  # noqa: BLE001 - any parse failure makes the schema invalid
            raise _HTTPError(422, 42201, f"Invalid schema: {exc}") from None
    return {"schema": body["schema"], "schemaType": kind, "references": references}


class _Handler(BaseHTTPRequestHandler):
    store: _Store
    auth: str | None

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self._answer("GET")

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        self._answer("POST")

    def _answer(self, method: str) -> None:
        try:
            if not self._authorised():
                raise _HTTPError(401, 401, "Unauthorized")
            status, body = self._route(method)
        except _HTTPError as err:
            status, body = err.status, {"error_code": err.code, "message": err.message}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", _CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        if self.auth is None:
            return True
        expected = "Basic " + base64.b64encode(self.auth.encode()).decode()
        return self.headers.get("Authorization") == expected

    def _request_body(self) -> Any:  # noqa: ANN401 - a request's JSON
        length = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            raise _HTTPError(400, 400, "the body is not JSON") from None

    def _route(self, method: str) -> tuple[int, Any]:
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        store = self.store
        match method, parts:
            case "GET", ["subjects"]:
                with store.lock:
                    return 200, sorted(store.subjects)
            case "GET", ["schemas", "ids", schema_id]:
                with store.lock:
                    n = int(schema_id) if schema_id.isdigit() else 0
                    if not 0 < n <= len(store.schemas):
                        raise _HTTPError(404, 40403, f"Schema {schema_id} not found")
                    return 200, _schema_body(store.schemas[n - 1])
            case "GET", ["subjects", subject, "versions"]:
                with store.lock:
                    return 200, list(range(1, len(self._versions(subject)) + 1))
            case "GET", ["subjects", subject, "versions", version]:
                with store.lock:
                    ids = self._versions(subject)
                    if version in ("latest", "-1"):
                        n = len(ids)
                    elif version.isdigit() and 0 < int(version) < 2**31:
                        n = int(version)
                    else:
                        raise _HTTPError(
                            422,
                            42202,
                            f"The specified version '{version}' is not a valid version id. "
                            'Allowed values are between [1, 2^31-1] and the string "latest"',
                        )
                    if not 0 < n <= len(ids):
                        raise _HTTPError(404, 40402, f"Version {version} not found.")
                    schema = store.schemas[ids[n - 1] - 1]
                    return 200, {
                        "subject": subject,
                        "version": n,
                        "id": ids[n - 1],
                        **_schema_body(schema),
                    }
            case "POST", ["subjects", subject, "versions"]:
                return 200, {"id": store.register(subject, _normalised(self._request_body()))}
            case "POST", ["subjects", subject]:
                wanted = _normalised(self._request_body())
                with store.lock:
                    ids = self._versions(subject)
                    for number, known in enumerate(ids, start=1):
                        if store.schemas[known - 1] == wanted:
                            return 200, {
                                "subject": subject,
                                "version": number,
                                "id": known,
                                **_schema_body(wanted),
                            }
                raise _HTTPError(404, 40403, "Schema not found")
        raise _HTTPError(404, 404, "HTTP 404 Not Found")

    def _versions(self, subject: str) -> list[int]:
        if subject not in self.store.subjects:
            raise _HTTPError(404, 40401, f"Subject '{subject}' not found.")
        return self.store.subjects[subject]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002, ANN401 - http.server's signature
        sys.stderr.write(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}\n")


def serve(port: int, auth: str | None) -> None:
    """Serve the registry on a loopback port until the process is stopped.

    Args:
        port: The port.
        auth: `user:password` every request must carry, or None.
    """
    handler = type("Handler", (_Handler,), {"store": _Store(), "auth": auth})
    with ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]), os.environ.get(AUTH_ENV))
