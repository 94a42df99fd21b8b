"""The port itself: ClickHouse's HTTP interface, as much of it as clickhouse-connect's
HTTP client uses, over a :class:`~pipeline.adapters.query_server.pool.SessionPool` of
read-only sessions (token in headers only, settings refused, each query on its client's
turn), and the discovery file that names it."""

from __future__ import annotations

import base64
import contextlib
import functools
import hmac
import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Mapping
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pipeline.adapters.query_server.pool import SessionPool
from pipeline.adapters.query_server.session import (
    AUTHENTICATION_FAILED,
    BAD_ARGUMENTS,
    READONLY,
    SYNTAX_ERROR,
    UNKNOWN_SETTING,
    QueryLimits,
    QueryRefusedError,
    ReadOnlySession,
)

log = logging.getLogger("tailguard.query_server")

DISCOVERY_FILE = "tailguard-query.json"
HOST = "127.0.0.1"


# HTTP parameters that are transport, not query settings (clickhouse-connect
# sends some of them with every request). Any other parameter would be a
# setting change, which the read-only session refuses.
_TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "wait_end_of_query",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "quota_key",
        "compress",
        "decompress",
        "client_protocol_version",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "enable_http_compression",
        "buffer_size",
        "role",
        "user",
    }
)
_URL_QUERY_RE = re.compile(r"(\S*?)\?\S*")  # a URL's query string, in a request line


def client_of(user: str, user_agent: str) -> str:
    """Who a query is from, for the port's turns (:class:`~.pool.FairQueue`): the user
    name it authenticates with (as ClickHouse counts queries per user) and its
    User-Agent, since local clients all hold the same token and most send the user
    ``default``: Grafana's plugin, curl and a script of one's own are three clients.
    The tools name themselves ``tailguard-<pid>``. Clients are the store owner's own
    processes: this shares the port fairly between them; it is no boundary against one
    that names itself anew for each query (the concurrency cap and each query's limits
    still bound what it takes)."""
    return f"{user or 'default'} {user_agent}".strip()[:200]


def _http_status(code: int) -> int:
    """ClickHouse's own mapping for the codes this port produces."""
    if code == READONLY:
        return 403
    if code == AUTHENTICATION_FAILED:
        return 401
    if code in (SYNTAX_ERROR, UNKNOWN_SETTING, BAD_ARGUMENTS, 457):
        return 400
    if code in (60, 81):  # UNKNOWN_TABLE, UNKNOWN_DATABASE
        return 404
    return 500


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

    def log_message(self, format: str, *args: Any) -> None:
        # The request line's query string may hold a URL token (refused, but sent):
        # never write it, at any level.
        text = _URL_QUERY_RE.sub(r"\1?<query not logged>", format % args)
        log.debug("query port: %s", text)

    def _url_token_refused(self) -> bool:
        """A ``password`` in the URL is refused (HTTP 400) before anything else, whether
        it is the token or not, and its value is not echoed."""
        names = {k.lower() for k, _ in parse_qsl(urlsplit(self.path).query, keep_blank_values=True)}
        if "password" not in names:
            return False
        self._error(
            BAD_ARGUMENTS,
            "the query port takes its token in headers only (HTTP basic auth password or "
            "X-ClickHouse-Key), never as the password parameter of the URL",
        )
        return True

    def _send(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str) -> None:
        body = f"Code: {code}. DB::Exception: {message}\n".encode()
        self._send(
            _http_status(code),
            body,
            {"X-ClickHouse-Exception-Code": str(code), "Content-Type": "text/plain"},
        )

    def _client(self) -> str:
        user = self.headers.get("X-ClickHouse-User") or ""
        auth = self.headers.get("Authorization") or ""
        if not user and auth[:6].lower() == "basic ":
            with contextlib.suppress(ValueError):
                user = base64.b64decode(auth[6:]).decode().partition(":")[0]
        return client_of(user, self.headers.get("User-Agent") or "")

    def _authorized(self) -> bool:
        """The request carries the port's token in a header: as the password (HTTP basic
        auth, what clickhouse-connect sends) or ``X-ClickHouse-Key``."""
        offered: list[str] = []
        auth = self.headers.get("Authorization") or ""
        if auth[:6].lower() == "basic ":
            with contextlib.suppress(ValueError):
                offered.append(base64.b64decode(auth[6:]).decode().partition(":")[2])
        offered.append(self.headers.get("X-ClickHouse-Key") or "")
        token = self.server.token.encode()
        ok = False
        for candidate in offered:  # compare every one, in constant time each
            ok |= hmac.compare_digest(candidate.encode(), token)
        if not ok:
            self._error(
                AUTHENTICATION_FAILED,
                "Authentication failed: the query port needs the token of the store's "
                f"{DISCOVERY_FILE} in a header (the basic auth password or X-ClickHouse-Key)",
            )
        return ok

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if self._url_token_refused():
            return
        if path == "/ping":
            self._send(200, b"Ok.\n", {"Content-Type": "text/plain"})
        elif not self._authorized():
            return
        elif path == "/tailguard":
            info = {"pid": os.getpid(), "store": self.server.pool.path}
            self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
        elif path == "/":
            self._query(b"")
        else:
            self._error(1000, f"no such path {path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if not self._url_token_refused() and self._authorized():
            self._query(body)

    def _query(self, body: bytes) -> None:
        url = urlsplit(self.path)
        if url.path != "/":
            self._error(1000, f"no such path {url.path}")
            return
        args = dict(parse_qsl(url.query, keep_blank_values=True))
        form = form_fields(self.headers.get("Content-Type", ""), body)
        if form is not None:  # the query and its parameters as form fields
            args.update(form)
            body = b""
        parts = [args.get("query", ""), body.decode(errors="replace")]
        sql = "\n".join(p for p in parts if p).strip()
        if not sql:
            self._error(SYNTAX_ERROR, "empty query")
            return
        params = {k[6:]: v for k, v in args.items() if k.startswith("param_")}
        settings = [k for k in args if k not in _TRANSPORT_PARAMS and not k.startswith("param_")]
        if settings:
            self._error(
                READONLY,
                f"Cannot modify {', '.join(sorted(settings))}: the query port is read-only",
            )
            return
        try:
            result = self.server.pool.execute(
                self._client(),
                sql,
                default_format=args.get("default_format", "TabSeparated"),
                database=args.get("database") or None,
                params=params,
            )
        except QueryRefusedError as exc:
            self._error(exc.code, str(exc))
            return
        summary = {
            "read_rows": str(result.rows_read),
            "read_bytes": str(result.bytes_read),
            "elapsed_ns": str(int(result.elapsed_s * 1e9)),
        }
        self.server.queries += 1
        self._send(
            200,
            result.body,
            {
                "X-ClickHouse-Format": result.fmt,
                "X-ClickHouse-Timezone": self.server.pool.timezone,
                "X-ClickHouse-Summary": json.dumps(summary),
                "Content-Type": "application/octet-stream",
            },
        )


def form_fields(content_type: str, body: bytes) -> dict[str, str] | None:
    """The fields of a ``multipart/form-data`` body (None for any other body): how
    ClickHouse's HTTP interface also takes the query and its ``param_*`` values, and how
    clickhouse-connect sends them when they are too long for the URL (a statement's
    groups, issue 53)."""
    if not content_type.lower().startswith("multipart/form-data"):
        return None
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    fields: dict[str, str] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = payload.decode() if isinstance(payload, bytes) else ""
    return fields


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, pool: SessionPool, token: str) -> None:
        super().__init__((HOST, port), _Handler)
        self.pool = pool
        self.token = token
        self.queries = 0


class QueryServer:
    """The read-only port: a thread serving a :class:`SessionPool` over HTTP (a thread
    per connection)."""

    def __init__(
        self,
        store_dir: Path,
        lock: threading.Lock,
        *,
        database: str = "tailguard",
        port: int = 0,
        limits: QueryLimits | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        limits = limits or QueryLimits()
        self.pool = SessionPool(
            functools.partial(
                ReadOnlySession, self.store_dir, lock, database=database, limits=limits
            ),
            limits,
        )
        # Fresh on every start; readers find it in the discovery file (mode 0600).
        self.token = secrets.token_urlsafe(32)
        try:
            self._server = _Server(port, self.pool, self.token)
        except Exception:
            self.pool.close()
            raise
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="tailguard-query-port", daemon=True
        )
        self.discovery = self.store_dir / DISCOVERY_FILE

    @property
    def queries(self) -> int:
        return self._server.queries

    def start(self, *, publish: bool = True) -> QueryServer:
        """Serve; ``publish``: write the discovery file (the worker does, a tool does not)."""
        self._thread.start()
        if not publish:
            return self
        tmp = self.discovery.with_suffix(f".{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        info = {"port": self.port, "pid": os.getpid(), "store": self.pool.path}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the token is a secret
        with os.fdopen(fd, "w") as fh:
            json.dump(info | {"token": self.token}, fh)
        tmp.replace(self.discovery)
        log.info("read-only query port on %s:%d (%s)", HOST, self.port, self.discovery)
        return self

    def stop(self) -> None:
        """Remove the discovery file (if ours), stop serving, close the sessions."""
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.discovery.read_text()).get("pid") == os.getpid():
                self.discovery.unlink()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.pool.close()


def start_query_server(settings: Any, store: Any) -> QueryServer | None:
    """The worker's port, or None (a ClickHouse server needs none; port -1 = off)."""
    if settings.clickhouse_url or settings.query_port < 0:
        return None
    return QueryServer(
        settings.store_dir,
        store.lock,
        database=settings.database,
        port=settings.query_port,
        limits=QueryLimits.from_settings(settings),
    ).start()
