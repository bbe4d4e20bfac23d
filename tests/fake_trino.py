"""A failing-on-purpose HTTP peer for the unit tier, answering as Trino over http or https.

The session's real Trino (`strata.local.trino`, the `trino` fixture) runs on plain http
with no sign-in, and answers only what it really does; the unit tests need a peer they
can set up to check what the client sends and to answer as they choose. This one speaks
just enough of Trino's HTTP protocol (POST /v1/statement, one final answer) to record
the user, the Authorization header and the statement of each request, over TLS with a
certificate of its own when asked; it fails a statement on purpose: one naming
`clicks_raw` is answered ALREADY_EXISTS, as Trino answers a table registered twice. A
SELECT is answered with `answer` (columns and rows as Trino's protocol sends them), and
the session's catalog and schema are kept in `sessions`. Integration tests use the real
Trino.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key: (certificate, key) PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake trino")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        # What OpenSSL's strict checks ask of a certificate that is its own authority.
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, False, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "trino.pem", folder / "trino.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


class FakeTrino:
    """The coordinator; `requests` holds (user, Authorization header, statement) triples.

    Args:
        tls: A (certificate, key) pair to serve https with; plain http without.
    """

    answer = {
        "columns": [
            {
                "name": "n",
                "type": "bigint",
                "typeSignature": {"rawType": "bigint", "arguments": []},
            },
            {
                "name": "page",
                "type": "varchar",
                "typeSignature": {
                    "rawType": "varchar",
                    "arguments": [{"kind": "LONG", "value": 2147483647}],
                },
            },
        ],
        "data": [[3, "/home"], [1, "/cart"]],
    }

    def __init__(self, tls: tuple[Path, Path] | None = None):
        seen = self.requests = []
        sessions = self.sessions = []
        query_answer = self.answer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                seen.append(
                    (self.headers.get("X-Trino-User"), self.headers.get("Authorization"), body)
                )
                sessions.append(
                    (self.headers.get("X-Trino-Catalog"), self.headers.get("X-Trino-Schema"))
                )
                answer = {
                    "id": f"q{len(seen)}",
                    "infoUri": "http://x",
                    "stats": {"state": "FINISHED"},
                    "updateType": "CALL",
                }
                if body.lstrip().upper().startswith("SELECT"):
                    answer.update(query_answer)
                    answer["updateType"] = None
                if "clicks_raw" in body:
                    answer["error"] = {
                        "message": "Table already exists",
                        "errorName": "ALREADY_EXISTS",
                        "errorCode": 1,
                        "errorType": "USER_ERROR",
                    }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.port = self.server.server_port
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def statements(self) -> list[tuple[str | None, str]]:
        """(user, statement) of each request."""
        return [(user, body) for user, _, body in self.requests]

    def __enter__(self) -> FakeTrino:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
