"""An HTTP proxy on loopback in front of a real server that records each request's Authorization
header: what a test reads to see which credentials a client sent (the server itself may not check
them: a local mlflow server takes any token)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

import httpx

# Headers that belong to one hop, never passed on.
_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class RecordingProxy:
    """``with RecordingProxy("http://127.0.0.1:5000") as proxy: ... proxy.url ... proxy.authorizations``"""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.authorizations: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                if "authorization" in {name.lower() for name in self.headers}:
                    proxy.authorizations.append(self.headers["Authorization"])
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                answer = httpx.request(
                    self.command, proxy.target + self.path, content=body, headers=headers, timeout=30
                )
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in _HOP and name.lower() != "content-encoding":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PATCH = do_DELETE = _forward

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: the test reads `authorizations`

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="recording-proxy", daemon=True
        )

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
