"""The production stack checked end to end in real containers: run by scripts/stack-check.sh, which
first makes sure a Docker engine runs, builds the base images no registry gives, and makes the small
host environment this script needs (numpy and openpi-client; not Relay itself).

Every call to the service goes through the API container as a user's would: curl with the key that
`relay keys create` printed in the API container. Each step prints what it checked and its time; the
first failure prints the containers' last log lines, takes the stack down with its volumes (unless
--keep) and exits non-zero.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "relaycheck"
DATASET = "/datasets/dots-video"  # the host directory RELAY_DATASETS_DIR, mounted read-only
CHECKPOINT_EVERY = 20
# The tolerances the tests hold the same comparisons to: a resumed run against an uninterrupted
# one (tests/engine/training/test_recipe.py) and a two-host gang against one process
# (tests/service/test_gang_jobs.py, which says why weights differ more than losses).
RESUME_TOLERANCE = 1e-6
GANG_LOSS_TOLERANCE = 1e-5
GANG_WEIGHT_TOLERANCE = 1e-4


class CheckFailed(Exception):
    pass


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


@dataclass
class Stack:
    compose_tool: list[str]
    env_file: str | None
    work: Path
    port: int
    key: str = ""
    times: list[tuple[str, float]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        kept = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "POSTGRES_"))}
        return {
            **kept,
            **({} if self.env_file else _image_variables()),
            "RELAY_PORT": str(self.port),
            "RELAY_DATASETS_DIR": str(self.work / "datasets"),
            "RELAY_LOCAL_DATASETS": "true",
            "RELAY_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY),
            "RELAY_LEASE_SECONDS": "15",
            "RELAY_RECONCILE_SECONDS": "3",
            "RELAY_API_WORKERS": "1",
        }

    def compose(self, *args: str, timeout: float = 1800, check: bool = True) -> str:
        command = [*self.compose_tool, "-p", PROJECT]
        if self.env_file:
            command += ["--env-file", self.env_file]
        command += list(args)
        done = subprocess.run(
            command, cwd=ROOT, env=self.environment(), capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise CheckFailed(f"{shlex.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def psql(self, query: str) -> str:
        return self.compose(
            "exec", "-T", "postgres", "psql", "-U", "relay", "-d", "relay", "-tAc", query
        ).strip()

    # --- the API, by curl -------------------------------------------------------------------

    def curl(
        self, method: str, path: str, body: dict[str, Any] | None = None, *extra: str
    ) -> tuple[int, str]:
        command = [
            "curl",
            "-sS",
            "-X",
            method,
            f"{self.url}{path}",
            "-H",
            f"Authorization: Bearer {self.key}",
        ]
        if body is not None:
            command += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
        command += ["-w", "\n%{http_code}", *extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise CheckFailed(f"curl {method} {path}: {done.stderr.strip()}")
        text, _, status = done.stdout.rpartition("\n")
        return int(status), text

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        status, text = self.curl(method, path, body)
        expect(status < 300, f"{method} {path} answered {status}: {text[:500]}")
        return json.loads(text)

    def create_job(self, **recipe: Any) -> str:
        job = self.api("POST", "/v1/fine-tunes", {"model": "pi05-tiny", "dataset_name": DATASET, **recipe})
        return str(job["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.api("GET", f"/v1/fine-tunes/{job_id}"))

    def events(self, job_id: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        after = ""
        while True:
            page = self.api("GET", f"/v1/fine-tunes/{job_id}/events?limit=1000{after}")
            events += page["data"]
            if not page["has_more"]:
                return events
            after = f"&after={page['data'][-1]['id']}"

    def wait_for_job(self, job_id: str, timeout: float = 900) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["status"] in ("completed", "failed", "cancelled"):
                expect(job["status"] == "completed", f"{job_id} ended {job['status']}: {job.get('error')}")
                return job
            time.sleep(1)
        raise CheckFailed(f"{job_id} did not end within {timeout:.0f} s")

    def wait_for_checkpoint(self, job_id: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("event") == "checkpoint" for e in self.events(job_id)):
            expect(time.monotonic() < deadline, f"{job_id} wrote no checkpoint within {timeout:.0f} s")
            time.sleep(0.25)

    def download(self, job_id: str, name: str, to: Path) -> str:
        """The file, downloaded with curl; its sha256 as the API announced it (checked here)."""
        headers = to.with_suffix(".headers")
        status, _ = self.curl(
            "GET", f"/v1/fine-tunes/{job_id}/files/{name}", None, "-o", str(to), "-D", str(headers)
        )
        expect(status == 200, f"downloading {name} of {job_id} answered {status}")
        announced = re.search(r"(?im)^x-checksum-sha256:\s*([0-9a-f]{64})", headers.read_text())
        expect(announced is not None, "the download carried no x-checksum-sha256 header")
        assert announced is not None
        actual = hashlib.sha256(to.read_bytes()).hexdigest()
        expect(
            actual == announced.group(1),
            f"{name}: sha256 {actual} on the host, {announced.group(1)} announced",
        )
        return actual

    def wait_until_up(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = subprocess.run(["curl", "-sf", f"{self.url}/healthz"], capture_output=True)
            if done.returncode == 0:
                return
            time.sleep(1)
        raise CheckFailed(f"the API container did not answer /healthz within {timeout:.0f} s")

    def live_job_workers(self) -> int:
        return int(
            self.psql(
                "select count(*) from worker_heartbeats where takes_jobs "
                "and seen_at > now() - interval '9 seconds'"
            )
        )

    # --- steps --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self, title: str) -> Iterator[None]:
        print(f"\n== {title}", flush=True)
        started = time.monotonic()
        yield
        seconds = time.monotonic() - started
        self.times.append((title, seconds))
        print(f"   ok ({seconds:.0f} s)", flush=True)


def _image_variables() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k in ("RELAY_PYTHON_IMAGE", "RELAY_POSTGRES_IMAGE", "RELAY_REDIS_IMAGE")
    }


def say(text: str) -> None:
    print(f"   {text}", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def newest_migration() -> str:
    """The head revision of migrations/versions: the one no other revision revises."""
    revisions, revised = set(), set()
    for path in (ROOT / "migrations" / "versions").glob("*.py"):
        text = path.read_text()
        found = re.search(r'^revision: str = "([^"]+)"', text, re.M)
        down = re.search(r'^down_revision: str \| None = "([^"]+)"', text, re.M)
        if found:
            revisions.add(found.group(1))
        if down:
            revised.add(down.group(1))
    heads = revisions - revised
    expect(len(heads) == 1, f"migrations/versions has {len(heads)} heads: {sorted(heads)}")
    return heads.pop()


def losses(events: list[dict[str, Any]]) -> dict[int, float]:
    return {int(e["step"]): float(e["loss"]) for e in events if "grad_norm" in e}


# safetensors' dtypes as numpy reads them; bf16 is the top half of a float32, read as uint16.
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float64 (its format: an 8-byte little-endian header
    length, a JSON header of dtypes, shapes and byte ranges, then the bytes). By hand because
    safetensors' numpy reader has no bfloat16, and the host side of the check has no torch."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        raw = np.frombuffer(data[8 + length + start : 8 + length + end], dtype=_DTYPES[entry["dtype"]])
        if entry["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = raw.astype(np.float64).reshape(entry["shape"])
    return tensors


def largest_gap(a: Path, b: Path) -> float:
    first, second = read_safetensors(a), read_safetensors(b)
    expect(first.keys() == second.keys(), "the two outputs hold different tensors")
    return max(float(np.max(np.abs(first[k] - second[k]), initial=0.0)) for k in first)


# --- the check -----------------------------------------------------------------------------------


def bring_up(stack: Stack) -> None:
    with stack.step("build the image and bring the stack up (docker compose up -d --build)"):
        stack.compose("down", "-v", "--remove-orphans")  # what an earlier, interrupted check left
        stack.compose("up", "-d", "--build")
        stack.wait_until_up()
        say(f"the API container answers at {stack.url}")


def create_key(stack: Stack) -> None:
    with stack.step("relay keys create, in the API container"):
        printed = stack.compose("exec", "-T", "api", "relay", "keys", "create", "--user", "stack-check")
        stack.key = printed.strip().splitlines()[-1]
        expect(stack.key.startswith("relay-"), f"relay keys create printed {printed!r}")
        say(f"key {stack.key[:12]}...")


def write_dataset(stack: Stack) -> None:
    with stack.step("a v3.0 video dataset in a host directory, mounted read-only at /datasets"):
        host_dir = stack.work / "datasets"
        host_dir.mkdir(parents=True, exist_ok=True)
        # Written by the image's own `relay datasets synth` (the host needs no Relay), as this host's user.
        stack.compose(
            "run", "--rm", "--no-deps", "-T", "--user", f"{os.getuid()}:{os.getgid()}",
            "-v", f"{host_dir}:/out", "worker",
            "relay", "datasets", "synth", "/out/dots-video",
            "--format", "v3.0", "--video", "--episodes", "12",
        )  # fmt: skip
        info = json.loads((host_dir / "dots-video" / "meta" / "info.json").read_text())
        videos = sorted(
            str(p.relative_to(host_dir / "dots-video")) for p in (host_dir / "dots-video").rglob("*.mp4")
        )
        expect(info["codebase_version"] == "v3.0" and bool(videos), "the dataset is not v3.0 with videos")
        say(f"{info['total_episodes']} episodes, {info['total_frames']} frames, videos {', '.join(videos)}")


def first_job(stack: Stack) -> str:
    with stack.step("a pi05-tiny job by curl, its events followed to the end, its output downloaded"):
        for refused, field_name in (
            ({"model": "pi05", "batch_size": 2, "steps": 10}, "model"),  # no GPU in these workers
            ({"dataset_name": "/datasets/not-there", "steps": 10}, "dataset_name"),
        ):
            status, text = stack.curl(
                "POST", "/v1/fine-tunes", {"model": "pi05-tiny", "dataset_name": DATASET, **refused}
            )
            error = json.loads(text).get("error", {})
            expect(
                status == 400 and error.get("param") == field_name,
                f"expected a 400 naming {field_name}: {text}",
            )
            say(f"refused at create: {error['message']}")
        job_id = stack.create_job(batch_size=4, steps=30)
        say(f"created {job_id}; following its events (server-sent events, by curl)")
        stream = subprocess.Popen(
            ["curl", "-sSN", f"{stack.url}/v1/fine-tunes/{job_id}/events?stream=true",
             "-H", f"Authorization: Bearer {stack.key}"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert stream.stdout is not None
        seen: list[dict[str, Any]] = []
        for line in stream.stdout:
            if line.startswith("data: "):
                if line.strip() == "data: [DONE]":
                    break
                event = json.loads(line[len("data: ") :])
                seen.append(event)
                shown = {k: event[k] for k in ("step", "event", "stage", "loss") if k in event}
                say(f"event {json.dumps(shown)}")
        stream.wait(timeout=30)
        expect(any(e.get("event") == "finished" for e in seen), "the stream ended without a finished event")
        job = stack.wait_for_job(job_id)
        names = {f["path"]: f for f in stack.api("GET", f"/v1/fine-tunes/{job_id}/files")["data"]}
        expect("output/model.safetensors" in names, f"the output lists no model.safetensors: {sorted(names)}")
        sha256 = stack.download(job_id, "output/model.safetensors", stack.work / "first.safetensors")
        expect(sha256 == names["output/model.safetensors"].get("sha256"), "the file listing's sha256 differs")
        size = (stack.work / "first.safetensors").stat().st_size
        say(
            f"{job['status']} at step {job['step']}; model.safetensors {size / 1e6:.1f} MB, "
            f"sha256 {sha256[:16]}... equal"
        )
        return job_id


def killed_worker_resumes(stack: Stack) -> None:
    with stack.step(
        "docker compose kill worker between two checkpoints; the job resumes to the same weights"
    ):
        # Long enough (about 10 s at pi05-tiny's pace here) that the kill lands mid-run.
        recipe = {"batch_size": 4, "steps": 20 * CHECKPOINT_EVERY}
        killed = stack.create_job(**recipe)
        stack.wait_for_checkpoint(killed)
        stack.compose("kill", "worker")
        checkpoints = [e["step"] for e in stack.events(killed) if e.get("event") == "checkpoint"]
        steps = [e["step"] for e in stack.events(killed) if "grad_norm" in e]
        say(
            f"killed at checkpoint {checkpoints[-1]} (last metrics at step {max(steps, default=0)}) "
            f"of {recipe['steps']}"
        )
        stack.compose("start", "worker")
        job = stack.wait_for_job(killed)
        resumed = [e for e in stack.events(killed) if e.get("event") == "resumed"]
        expect(job["attempts"] == 2, f"{job['attempts']} attempts, expected 2")
        # The last checkpoint the events showed at the kill, or a later one whose event the killed
        # attempt had not written yet (its successor writes it).
        written = {e["step"] for e in stack.events(killed) if e.get("event") == "checkpoint"}
        expect(
            len(resumed) == 1 and resumed[0]["step"] >= checkpoints[-1] and resumed[0]["step"] in written,
            f"resumed at {[e['step'] for e in resumed]}; checkpoints {sorted(written)}, "
            f"{checkpoints[-1]} at the kill",
        )
        say(f"attempt 2 resumed from its checkpoint at step {resumed[0]['step']} and completed")
        straight = stack.create_job(**recipe)
        stack.wait_for_job(straight)
        stack.download(killed, "output/model.safetensors", stack.work / "killed.safetensors")
        stack.download(straight, "output/model.safetensors", stack.work / "straight.safetensors")
        gap = largest_gap(stack.work / "killed.safetensors", stack.work / "straight.safetensors")
        expect(
            gap <= RESUME_TOLERANCE, f"the resumed weights differ from an uninterrupted run's by {gap:.2e}"
        )
        say(f"an uninterrupted run of the same recipe ({straight}): largest weight difference {gap:.1e}")


def served_to_openpi_client(stack: Stack, job_id: str) -> None:
    with stack.step("a deployment on the serving-worker container, reached by openpi-client through the API"):
        deployment = stack.api("POST", "/v1/deployments", {"model": job_id})
        deadline = time.monotonic() + 300
        while deployment["status"] == "starting":
            expect(time.monotonic() < deadline, "the deployment was not ready within 300 s")
            time.sleep(0.5)
            deployment = stack.api("GET", f"/v1/deployments/{deployment['id']}")
        expect(
            deployment["status"] == "ready",
            f"the deployment is {deployment['status']}: {deployment.get('error')}",
        )
        info = deployment["info"]
        robot = WebsocketClientPolicy(
            host=deployment["websocket_url"].removeprefix("ws://"), port=None, api_key=stack.key
        )
        expect(robot.get_server_metadata()["cameras"] == info["cameras"], "the websocket's metadata differs")
        rng = np.random.default_rng(0)
        observation = {
            "images": {
                camera: rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for camera in info["cameras"]
            },
            "state": rng.uniform(-1, 1, info["state_dim"]).astype(np.float32),
            "prompt": "move to the red dot",
            "seed": 7,
        }
        first, again = robot.infer(observation)["actions"], robot.infer(observation)["actions"]
        expect(first.ndim == 2 and first.shape[1] == info["action_dim"], f"actions of shape {first.shape}")
        expect(
            bool(np.isfinite(first).all()) and np.array_equal(first, again),
            "the same seed answered differently",
        )
        say(
            f"{deployment['id']} at {deployment['websocket_url']}: "
            f"a chunk of {first.shape[0]}x{first.shape[1]} actions"
        )
        stack.api("DELETE", f"/v1/deployments/{deployment['id']}")


def down_and_up_with_a_new_image(stack: Stack, job_id: str) -> None:
    with stack.step(
        "docker compose down (volumes kept) and up with a rebuilt image: everything is still there"
    ):
        before_jobs = {j["id"]: j["status"] for j in stack.api("GET", "/v1/fine-tunes?limit=100")["data"]}
        before_events = {job: len(stack.events(job)) for job in before_jobs}
        # A job running through the upgrade: `down` stops its worker (SIGTERM, the warm shutdown),
        # which hands the job back; the new image's worker resumes it.
        running = stack.create_job(batch_size=4, steps=20 * CHECKPOINT_EVERY)
        stack.wait_for_checkpoint(running)
        before_image = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", "relay:latest"], capture_output=True, text=True
        ).stdout.strip()
        # The upgrade as docs/service.md gives it: a backup first, then a new image (here: down
        # before up, so that nothing of the old containers is left).
        dump = stack.compose("exec", "-T", "postgres", "pg_dump", "-U", "relay", "relay")
        expect("CREATE TABLE public.fine_tunes" in dump, "pg_dump printed no fine_tunes table")
        (stack.work / "relay-before-upgrade.sql").write_text(dump)
        stack.compose("down")
        # A new revision of the image, as an upgrade brings (the label names it).
        stack.compose("build", "--build-arg", f"RELAY_REVISION=stack-check-{int(time.time())}")
        stack.compose("up", "-d")
        stack.wait_until_up()
        after_image = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", "relay:latest"], capture_output=True, text=True
        ).stdout.strip()
        expect(after_image != before_image, "the rebuilt image is the same image")
        migrate = subprocess.run(
            ["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}",
             "--filter", "label=com.docker.compose.service=migrate", "--format", "{{.Status}}"],
            capture_output=True, text=True,
        ).stdout.split("\n")[0]  # fmt: skip
        expect(migrate.startswith("Exited (0)"), f"the migration container: {migrate!r}")
        version = stack.psql("select version_num from alembic_version")
        expect(
            version == newest_migration(),
            f"the database is at {version}, the image's newest is {newest_migration()}",
        )
        after_jobs = {j["id"]: j["status"] for j in stack.api("GET", "/v1/fine-tunes?limit=100")["data"]}
        handed_back = stack.wait_for_job(running)
        resumed = [e["step"] for e in stack.events(running) if e.get("event") == "resumed"]
        expect(
            handed_back["attempts"] == 2 and len(resumed) == 1,
            f"the job running through the upgrade: {handed_back['attempts']} attempts, resumed at {resumed}",
        )
        after_jobs.pop(running)
        expect(after_jobs == before_jobs, f"jobs before {before_jobs}, after {after_jobs}")
        after_events = {job: len(stack.events(job)) for job in before_jobs}
        expect(after_events == before_events, f"events before {before_events}, after {after_events}")
        sha256 = stack.download(job_id, "output/model.safetensors", stack.work / "after-upgrade.safetensors")
        expect(
            sha256 == hashlib.sha256((stack.work / "first.safetensors").read_bytes()).hexdigest(),
            "the output changed",
        )
        say(f"pg_dump: {len(dump) / 1e3:.0f} kB; image {before_image[7:19]} -> {after_image[7:19]}")
        say(f"the migration exited 0; the database is at {version}, the newest migration")
        say(f"{running}, running through it, was handed back and resumed from step {resumed[0]} (attempt 2)")
        say(
            f"the same key reads {len(after_jobs)} jobs, {sum(after_events.values())} events "
            "and the same output"
        )


def gang_of_two_containers(stack: Stack) -> None:
    with stack.step(
        "a gpus=2 job on two worker containers (gloo over the compose network) against one process"
    ):
        stack.compose("up", "-d", "--scale", "worker=2")
        deadline = time.monotonic() + 120
        while stack.live_job_workers() < 2:
            expect(time.monotonic() < deadline, "two workers did not report within 120 s")
            time.sleep(1)
        recipe = {"batch_size": 4, "steps": 10, "finetune": "lora"}
        gang = stack.create_job(**recipe, gpus=2)
        stack.wait_for_job(gang)
        hosts = stack.psql(
            f"select worker from fine_tune_hosts where job_id = '{gang}' order by seat"
        ).split()
        hostnames = {host.split(":")[0] for host in hosts}
        expect(len(hostnames) == 2, f"the gang's seats: {hosts}")
        alone = stack.create_job(**recipe, gpus=1)
        stack.wait_for_job(alone)
        gang_losses, alone_losses = losses(stack.events(gang)), losses(stack.events(alone))
        expect(gang_losses.keys() == alone_losses.keys() and bool(gang_losses), "different logged steps")
        loss_gap = max(abs(gang_losses[s] - alone_losses[s]) for s in alone_losses)
        expect(loss_gap <= GANG_LOSS_TOLERANCE, f"the gang's losses differ by {loss_gap:.2e}")
        stack.download(gang, "output/model.safetensors", stack.work / "gang.safetensors")
        stack.download(alone, "output/model.safetensors", stack.work / "alone.safetensors")
        weight_gap = largest_gap(stack.work / "gang.safetensors", stack.work / "alone.safetensors")
        expect(weight_gap <= GANG_WEIGHT_TOLERANCE, f"the gang's weights differ by {weight_gap:.2e}")
        say(
            f"seats on containers {', '.join(sorted(hostnames))}; "
            f"losses within {loss_gap:.1e}, weights within {weight_gap:.1e}"
        )


def take_down(stack: Stack) -> None:
    with stack.step("docker compose down -v: nothing left running"):
        stack.compose("down", "-v", "--remove-orphans")
        left = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        volumes = subprocess.run(
            ["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        expect(not left and not volumes, f"left: containers {left}, volumes {volumes}")


def image_sizes() -> list[str]:
    names = ["relay:latest", *_image_variables().values()]
    env_file = ROOT / "docker" / "local.env"
    if env_file.is_file():
        names += [line.split("=", 1)[1] for line in env_file.read_text().splitlines() if "=" in line]
    shown = []
    for name in dict.fromkeys(names):
        size = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Size}}", name], capture_output=True, text=True
        )
        if size.returncode == 0:
            shown.append(f"{name} {int(size.stdout) / 1e9:.2f} GB")
    return shown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--compose", default="docker-compose", help="the compose command: 'docker compose' or docker-compose"
    )
    parser.add_argument(
        "--env-file", help="images the host built itself (docker/base-image.sh writes docker/local.env)"
    )
    parser.add_argument("--keep", action="store_true", help="leave the stack running when a step fails")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="relay-stack-check-") as work:
        stack = Stack(shlex.split(args.compose), args.env_file, Path(work), free_port())
        started = time.monotonic()
        try:
            bring_up(stack)
            create_key(stack)
            write_dataset(stack)
            job_id = first_job(stack)
            killed_worker_resumes(stack)
            served_to_openpi_client(stack, job_id)
            down_and_up_with_a_new_image(stack, job_id)
            gang_of_two_containers(stack)
            take_down(stack)
        except Exception as failure:  # any failure: its logs, then the stack taken down
            if not isinstance(failure, CheckFailed):
                traceback.print_exc()
            print(f"\nFAILED: {failure}\n\nthe containers' last lines:", flush=True)
            print(stack.compose("logs", "--no-color", "--tail", "60", check=False)[-12000:])
            if not args.keep:
                stack.compose("down", "-v", "--remove-orphans", check=False)
            return 1
        print(f"\nthe stack check passed in {time.monotonic() - started:.0f} s:")
        for title, seconds in stack.times:
            print(f"  {seconds:6.0f} s  {title}")
        print("images: " + "; ".join(image_sizes()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
