"""A loopback HTTP server that answers the Hugging Face Hub endpoints huggingface_hub uses to fetch
dataset revisions and model files (the Hub itself cannot be reached from tests): the routes below,
as huggingface_hub calls them.

- GET  /api/datasets/{repo}/refs                      branches and tags
- GET  /api/datasets/{repo}/revision/{revision}       the commit sha and the file list
- GET  /api/datasets/{repo}/tree/{sha}[/{path}]       the files, recursively
- HEAD /datasets/{repo}/resolve/{sha}/{path}          X-Repo-Commit, ETag, Content-Length
- GET  /datasets/{repo}/resolve/{sha}/{path}          the bytes
- HEAD, GET /{repo}/resolve/{revision}/{path}         the same for a model repo (`hub.models`)

Errors are 404s with the `X-Error-Code` huggingface_hub maps to its exceptions.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlparse

_API = re.compile(
    r"/api/(?P<kind>datasets|models)/(?P<repo>[^/]+/[^/]+)/(?P<verb>refs|revision|tree)(?:/(?P<rest>.*))?"
)
_RESOLVE = re.compile(
    r"(?:/(?P<kind>datasets))?/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<path>.+)"
)


@dataclass
class Repo:
    """A dataset repo: named refs (branches and tags) pointing at commits, each commit a directory."""

    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Path] = field(default_factory=dict)

    def add_commit(self, root: Path, *, branch: str | None = None, tag: str | None = None) -> str:
        sha = hashlib.sha1(str(root).encode() + str(len(self.commits)).encode()).hexdigest()
        self.commits[sha] = root
        if branch:
            self.branches[branch] = sha
        if tag:
            self.tags[tag] = sha
        return sha

    @classmethod
    def at(cls, root: Path) -> Repo:
        """A repo whose main branch is the directory `root`."""
        repo = cls()
        repo.add_commit(root, branch="main")
        return repo

    def resolve(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.branches.get(revision) or self.tags.get(revision)


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}  # dataset repos
        self.models: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.downloads: Counter[str] = Counter()
        self.authorizations: list[str | None] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._closed = False

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop answering, as an unreachable Hub would."""
        if not self._closed:
            self._closed = True
            self._server.shutdown()
            self._server.server_close()

    def repo(self, match: re.Match[str]) -> Repo | None:
        return (self.repos if match["kind"] == "datasets" else self.models).get(match["repo"])

    def record(self, method: str, path: str, authorization: str | None) -> None:
        with self._lock:
            self.requests.append((method, path))
            self.authorizations.append(authorization)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    """The handler class of `hub`'s server (the server makes one handler per request)."""
    return type("Handler", (_HubHandler,), {"hub": hub})


class _HubHandler(BaseHTTPRequestHandler):
    """Answers the Hub routes from the repos of `hub`, which `_handler` sets."""

    hub: ClassVar[FakeHub]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def _serve(self, *, send_body: bool) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        self.hub.record(self.command, path, self.headers.get("Authorization"))
        if match := _API.fullmatch(path):
            self._api(match, send_body)
        elif match := _RESOLVE.fullmatch(path):
            self._resolve(match, send_body)
        else:
            self._error(404, "RepoNotFound", send_body)

    def _api(self, match: re.Match[str], send_body: bool) -> None:
        repo = self.hub.repo(match)
        if repo is None:
            return self._error(404, "RepoNotFound", send_body)
        verb, rest = match["verb"], match["rest"] or ""
        if verb == "refs":
            return self._json(
                {
                    "branches": [_ref(n, "heads", s) for n, s in repo.branches.items()],
                    "converts": [],
                    "tags": [_ref(n, "tags", s) for n, s in repo.tags.items()],
                },
                send_body,
            )
        revision, _, subpath = rest.partition("/")
        sha = repo.resolve(revision)
        if sha is None:
            return self._error(404, "RevisionNotFound", send_body)
        root = repo.commits[sha]
        if verb == "revision":
            siblings = [{"rfilename": p.relative_to(root).as_posix()} for p in _files(root)]
            return self._json({"id": match["repo"], "sha": sha, "siblings": siblings}, send_body)
        entries = [
            {
                "type": "file",
                "path": p.relative_to(root).as_posix(),
                "size": p.stat().st_size,
                "oid": hashlib.sha1(p.read_bytes()).hexdigest(),
            }
            for p in _files(root / subpath)
        ]
        return self._json(entries, send_body)

    def _resolve(self, match: re.Match[str], send_body: bool) -> None:
        repo = self.hub.repo(match)
        if repo is None:
            return self._error(404, "RepoNotFound", send_body)
        sha = repo.resolve(match["revision"])
        if sha is None:
            return self._error(404, "RevisionNotFound", send_body)
        file = repo.commits[sha] / match["path"]
        if not file.is_file():
            return self._error(404, "EntryNotFound", send_body)
        body = file.read_bytes()
        self.send_response(200)
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if send_body:
            with self.hub._lock:
                self.hub.downloads[f"{match['repo']}/{match['path']}"] += 1
            self.wfile.write(body)

    def _json(self, value: object, send_body: bool) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, send_body: bool) -> None:
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)


def _ref(name: str, kind: str, sha: str) -> dict[str, str]:
    return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": sha}
