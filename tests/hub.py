"""A loopback HTTP server that answers the Hugging Face Hub endpoints huggingface_hub uses to fetch
dataset revisions and model files (the Hub itself cannot be reached from tests): the routes below,
as huggingface_hub calls them.

- GET  /api/datasets/{repo}/refs                      branches and tags
- GET  /api/datasets/{repo}/revision/{revision}       the commit sha and the file list
- GET  /api/datasets/{repo}/tree/{sha}[/{path}]       the files, recursively
- HEAD /datasets/{repo}/resolve/{sha}/{path}          X-Repo-Commit, ETag, Content-Length
- GET  /datasets/{repo}/resolve/{sha}/{path}          the bytes
- HEAD, GET /{repo}/resolve/{revision}/{path}         the same for a model repo (`hub.models`)

and the ones `HfApi.create_repo`, `create_branch` and `create_commit` (so `upload_folder`) call to
push a model repo, whose commits the routes above then serve:

- POST /api/repos/create                              a new repo: its main branch holds .gitattributes
- POST /api/models/{repo}/branch/{branch}             a branch at main (or its startingPoint)
- POST /api/validate-yaml                             a README.md's front matter, parsed as YAML
- POST /api/models/{repo}/preupload/{revision}        each file's upload mode: lfs or regular
- POST /{repo}.git/info/lfs/objects/batch             where to PUT each LFS object (basic transfer)
- PUT  /lfs-objects/{oid}                              an LFS object's bytes, checked against its sha256
- POST /api/models/{repo}/commit/{revision}           the NDJSON commit: header, file, lfsFile,
                                                      deletedFile lines

Writes but the LFS PUT need an Authorization header (a 401 otherwise, as the Hub answers without a
token); every request's header is kept in `authorizations`, each create call's body in `created`,
each commit in `commits`. Errors are 4xx with the `X-Error-Code` huggingface_hub maps to its exceptions.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

import yaml

_API = re.compile(
    r"/api/(?P<kind>datasets|models)/(?P<repo>[^/]+/[^/]+)/(?P<verb>refs|revision|tree)(?:/(?P<rest>.*))?"
)
_WRITE = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/(?P<verb>preupload|commit|branch)/(?P<revision>.+)")
_LFS_BATCH = re.compile(r"/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch")
_LFS_OBJECT = re.compile(r"/lfs-objects/(?P<oid>[0-9a-f]{64})")
# What the Hub keeps in LFS storage (its default .gitattributes): weights and other binaries.
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".model", ".npz", ".msgpack")
_RESOLVE = re.compile(
    r"(?:/(?P<kind>datasets))?/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<path>.+)"
)


@dataclass
class Repo:
    """A dataset repo: named refs (branches and tags) pointing at commits, each commit a directory."""

    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Path] = field(default_factory=dict)
    private: bool = False

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
        # Pushes: each create_repo body, each commit (repo, revision, sha, summary, paths), the LFS
        # objects by sha256; commits are directories under a folder of the hub's own.
        self.created: list[dict[str, Any]] = []
        self.commits: list[dict[str, Any]] = []
        self.lfs: dict[str, bytes] = {}
        # Repo ids whose creation is refused (403), as the Hub refuses a namespace the token cannot write.
        self.forbidden: set[str] = set()
        self._store = Path(tempfile.mkdtemp(prefix="fake-hub-"))
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
            shutil.rmtree(self._store, ignore_errors=True)

    def repo(self, match: re.Match[str]) -> Repo | None:
        return (self.repos if match["kind"] == "datasets" else self.models).get(match["repo"])

    def new_commit(self, repo: Repo, parent: str | None) -> tuple[str, Path]:
        """A new commit's sha and directory, holding its parent's files (None: none)."""
        with self._lock:
            root = self._store / f"commit-{len(list(self._store.iterdir()))}"
            if parent is not None:
                shutil.copytree(repo.commits[parent], root)
            else:
                root.mkdir()
            sha = hashlib.sha1(str(root).encode()).hexdigest()
            repo.commits[sha] = root
        return sha, root

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

    def do_POST(self) -> None:
        self._write()

    def do_PUT(self) -> None:
        self._write()

    def _write(self) -> None:
        path = unquote(urlparse(self.path).path)
        authorization = self.headers.get("Authorization")
        self.hub.record(self.command, path, authorization)
        body = self._body()
        if self.command == "PUT":  # the URL the batch answer gave is the grant (as S3's presigned URLs)
            if match := _LFS_OBJECT.fullmatch(path):
                return self._lfs_object(match["oid"], body)
            return self._error(404, "EntryNotFound", True)
        if authorization is None:
            return self._error(401, "Unauthorized", True)
        if path == "/api/repos/create":
            return self._create_repo(json.loads(body))
        if path == "/api/validate-yaml":
            return self._validate_yaml(json.loads(body))
        if match := _LFS_BATCH.fullmatch(path):
            return self._lfs_batch(match["repo"], json.loads(body))
        match = _WRITE.fullmatch(path)
        if match is None:
            return self._error(404, "RepoNotFound", True)
        repo = self.hub.models.get(match["repo"])
        if repo is None:
            return self._error(404, "RepoNotFound", True)
        if match["verb"] == "branch":
            return self._create_branch(repo, match["revision"], json.loads(body or b"{}"))
        sha = repo.resolve(match["revision"])
        if sha is None:
            return self._error(404, "RevisionNotFound", True)
        if match["verb"] == "preupload":
            return self._preupload(json.loads(body))
        return self._commit(match["repo"], repo, match["revision"], sha, body)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()  # the empty line after the last chunk
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _create_repo(self, payload: dict[str, Any]) -> None:
        with self.hub._lock:
            self.hub.created.append(payload)
        if payload.get("type", "model") != "model":
            return self._error(400, "BadRequest", True)
        repo_id = f"{payload['organization']}/{payload['name']}"
        if repo_id in self.hub.forbidden:
            return self._error(
                403, "Forbidden", True, "You don't have the rights to create a model under this namespace"
            )
        if repo_id in self.hub.models:  # the Hub's 409 names the repo's URL, which create_repo returns
            return self._json_status(
                409, {"error": "You already created this model repo", "url": f"{self.hub.endpoint}/{repo_id}"}
            )
        repo = Repo(private=payload.get("visibility") == "private")
        sha, root = self.hub.new_commit(repo, None)
        (root / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
        repo.branches["main"] = sha
        self.hub.models[repo_id] = repo
        return self._json({"url": f"{self.hub.endpoint}/{repo_id}", "name": repo_id}, True)

    def _create_branch(self, repo: Repo, branch: str, payload: dict[str, Any]) -> None:
        if branch in repo.branches:
            return self._error(409, "BranchExists", True, "Reference already exists")
        sha = repo.resolve(payload.get("startingPoint") or "main")
        if sha is None:
            return self._error(404, "RevisionNotFound", True)
        repo.branches[branch] = sha
        return self._json({}, True)

    def _validate_yaml(self, payload: dict[str, Any]) -> None:
        content = str(payload.get("content", ""))
        if content.startswith("---\n"):
            try:
                yaml.safe_load(content[4 : content.index("\n---", 3)])
            except (ValueError, yaml.YAMLError) as error:
                self._json_status(400, {"errors": [{"message": str(error)}]})
                return None
        return self._json({"errors": [], "warnings": []}, True)

    def _preupload(self, payload: dict[str, Any]) -> None:
        files = [
            {
                "path": item["path"],
                "uploadMode": "lfs" if str(item["path"]).endswith(_LFS_SUFFIXES) else "regular",
                "shouldIgnore": False,
                "oid": None,
            }
            for item in payload["files"]
        ]
        return self._json({"files": files}, True)

    def _lfs_batch(self, repo_id: str, payload: dict[str, Any]) -> None:
        if repo_id not in self.hub.models:
            return self._error(404, "RepoNotFound", True)
        objects = []
        for item in payload["objects"]:
            entry: dict[str, Any] = {"oid": item["oid"], "size": item["size"], "authenticated": True}
            if item["oid"] not in self.hub.lfs:  # an object already stored needs no upload
                href = f"{self.hub.endpoint}/lfs-objects/{item['oid']}"
                entry["actions"] = {"upload": {"href": href}}
            objects.append(entry)
        return self._json({"transfer": "basic", "objects": objects}, True)

    def _lfs_object(self, oid: str, body: bytes) -> None:
        if hashlib.sha256(body).hexdigest() != oid:
            return self._error(400, "BadRequest", True, "sha256 mismatch")
        with self.hub._lock:
            self.hub.lfs[oid] = body
        return self._json({}, True)

    def _commit(self, repo_id: str, repo: Repo, revision: str, parent: str, body: bytes) -> None:
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next((line["value"] for line in lines if line["key"] == "header"), {})
        writes: dict[str, bytes] = {}
        deletes: list[str] = []
        for line in lines:
            value = line["value"]
            if line["key"] == "deletedFile":
                deletes.append(value["path"])
            elif line["key"] == "file":
                writes[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                if value["oid"] not in self.hub.lfs:
                    return self._error(400, "BadRequest", True, f"LFS object {value['oid']} never uploaded")
                writes[value["path"]] = self.hub.lfs[value["oid"]]
            elif line["key"] != "header":
                return self._error(400, "BadRequest", True, f"unsupported commit line {line['key']}")
        sha, root = self.hub.new_commit(repo, parent)
        for name in deletes:
            if not (root / name).is_file():
                return self._error(404, "EntryNotFound", True, f"cannot delete {name}: no such file")
            (root / name).unlink()
        for name, data in writes.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
        if revision in repo.branches or revision not in repo.commits:
            repo.branches[revision] = sha
        with self.hub._lock:
            self.hub.commits.append(
                {
                    "repo": repo_id,
                    "revision": revision,
                    "sha": sha,
                    "summary": header.get("summary"),
                    "paths": sorted(writes),
                    "deleted": sorted(deletes),
                }
            )
        return self._json(
            {"commitUrl": f"{self.hub.endpoint}/{repo_id}/commit/{sha}", "commitOid": sha}, True
        )

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

    def _json_status(self, status: int, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: str, send_body: bool, message: str | None = None) -> None:
        body = json.dumps({"error": message or code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)


def _ref(name: str, kind: str, sha: str) -> dict[str, str]:
    return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": sha}


def without_xet(monkeypatch: Any) -> None:
    """Push through the LFS protocol, which the loopback Hub speaks: huggingface_hub uploads through
    Xet's storage whenever hf_xet is installed, a protocol of its own servers. `monkeypatch`: a
    pytest.MonkeyPatch; the environment variable carries it to subprocesses."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
