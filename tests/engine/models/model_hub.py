"""A loopback server answering the Hub endpoint `hf_hub_download` uses for a model repo file.

HEAD/GET /{owner}/{name}/resolve/{revision}/{path} -> X-Repo-Commit, ETag, Content-Length and the
bytes; 404 with X-Error-Code RepoNotFound / EntryNotFound otherwise. The real Hub cannot be
reached from tests.
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<path>.+)")


class ModelHub:
    def __init__(self) -> None:
        self.repos: dict[str, Path] = {}  # repo id -> directory served as its main revision
        self.downloads: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ModelHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(hub: ModelHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._serve(send_body=False)

        def do_GET(self) -> None:
            self._serve(send_body=True)

        def _serve(self, *, send_body: bool) -> None:
            match = _RESOLVE.fullmatch(unquote(urlparse(self.path).path))
            root = hub.repos.get(match["repo"]) if match else None
            if root is None:
                return self._reply(404, b"{}", {"X-Error-Code": "RepoNotFound"}, send_body)
            file = root / match["path"]
            if not file.is_file():
                return self._reply(404, b"{}", {"X-Error-Code": "EntryNotFound"}, send_body)
            body = file.read_bytes()
            commit = hashlib.sha1(str(root).encode()).hexdigest()
            headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}
            if send_body:
                hub.downloads.append(f"{match['repo']}/{match['path']}")
            return self._reply(200, body, headers, send_body)

        def _reply(self, status: int, body: bytes, headers: dict[str, str], send_body: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

    return Handler
