"""A recipe job on several processes: the worker starts them through torch.distributed.run.

The worker keeps the job's claim, lease and events in its own process, as for a one-process job;
the ranks run relay_engine.core.launched_job. Rank 0's events come back as lines on the launcher's
standard output; a cancel (or the worker's shutdown) reaches the ranks as a stop file, which they
agree on at every step. If any rank dies, the launcher stops the others and exits non-zero, and
this raises RanksFailed: the job is given back and its next attempt resumes from the last
checkpoint.

A job of a gang (several worker hosts, see relay_worker.gang) is launched the same way on each of
its hosts, with the launcher's c10d rendezvous in place of `--standalone`: `--nnodes` hosts meet at
seat 0's endpoint, and the launcher numbers them (which host holds rank 0 is its choice). Each
host has its own launch directory; only the host holding rank 0 gets events and writes the result.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from relay.events import Event, RecipeResult, parse_event
from relay_engine.core.launched_job import EVENT_PREFIX
from relay_engine.errors import EngineError
from relay_engine.recipe import Recipe

log = logging.getLogger("relay_worker")
LAUNCH_DIR = "launch"
STOP_SECONDS = 30.0
PR_SET_PDEATHSIG = 1


class RanksFailed(RuntimeError):
    """A process of the group died (or the launcher could not start them)."""


@dataclass(frozen=True)
class Rendezvous:
    """This host's part in a group spanning several hosts (the launcher's c10d rendezvous)."""

    hosts: int  # --nnodes
    endpoint: str  # host:port of the rendezvous store, served by the host with `serves` set
    run_id: str  # the same on every host of the group, new for each attempt
    serves: bool
    join_timeout_seconds: float  # how long the launcher waits for every host to arrive
    local_addr: str  # how the other hosts reach this one ("" : the launcher's default, its FQDN)
    name: str  # this host's launch directory, under the job's


class Role:
    """Whether this host holds rank 0, once that is known: `on_known(True or False)` is called
    once, when the first event arrives or the host's ranks have written their pid files."""

    def __init__(self, on_known: Callable[[bool], None] | None = None) -> None:
        self.main: bool | None = None
        self.on_known = on_known
        self._lock = threading.Lock()

    def learn(self, main: bool) -> None:
        with self._lock:
            if self.main is not None:
                return
            self.main = main
        if self.on_known is not None:
            self.on_known(main)

    def read_pid_files(self, launch_dir: Path, processes: int) -> None:
        """This host's ranks are a contiguous range [base, base + processes): rank 0's file means
        base 0; a rank at or past `processes` means base > 0."""
        ranks = {int(path.stem.removeprefix("rank-")) for path in launch_dir.glob("rank-*.pid")}
        if 0 in ranks:
            self.learn(True)
        elif any(rank >= processes for rank in ranks):
            self.learn(False)


def run_on_processes(
    recipe: Recipe,
    processes: int,
    work_dir: Path,
    dataset_cache_dir: Path | None,
    on_event: Callable[[Event], None],
    should_stop: Callable[[], bool],
    poll_seconds: float = 0.2,
    rendezvous: Rendezvous | None = None,
    role: Role | None = None,
    environment: Mapping[str, str] | None = None,
) -> RecipeResult | None:
    """Run the recipe as `processes` ranks on this host; rank 0's result.

    With `rendezvous`, this host's ranks join the other hosts' in one group; the result is None on
    a host that does not hold rank 0 (its ranks ended cleanly, and rank 0's host has the result).
    `environment`: more variables for the ranks (the job's tracker keys: in their environment, never
    in the spec file on disk)."""
    role = role or Role()
    launch_dir = _clean_launch_dir(work_dir, rendezvous)
    result_file = launch_dir / "result.json"
    spec_file = _write_spec(launch_dir, recipe, work_dir, dataset_cache_dir)
    command = _launcher_command(spec_file, processes, rendezvous)
    launcher = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        preexec_fn=_die_with_parent,
        env={**os.environ, **environment} if environment else None,
    )
    (launch_dir / "launcher.pid").write_text(str(launcher.pid))
    event_error: list[BaseException] = []
    reader = threading.Thread(
        target=_relay_events, args=(launcher, on_event, event_error, role), name="rank0-events", daemon=True
    )
    reader.start()
    _wait_for_launcher(launcher, reader, launch_dir, processes, should_stop, role, poll_seconds)
    if event_error:
        raise event_error[0]  # FencedOut: a newer attempt owns the job
    if launcher.returncode == 0 and rendezvous is not None and not result_file.exists():
        role.learn(False)
        return None
    if launcher.returncode != 0 or not result_file.exists():
        raise RanksFailed(f"the group of {processes} processes failed (launcher exit {launcher.returncode})")
    written = result_file.read_text()
    failure = json.loads(written).get("error")
    if failure is not None:
        raise EngineError(failure)
    return RecipeResult.from_json(written)


def _clean_launch_dir(work_dir: Path, rendezvous: Rendezvous | None) -> Path:
    """This host's launch directory for the job, without the files of an earlier attempt."""
    launch_dir = work_dir / LAUNCH_DIR
    if rendezvous is not None:
        launch_dir = launch_dir / rendezvous.name
    launch_dir.mkdir(parents=True, exist_ok=True)
    for stale in (launch_dir / "stop", launch_dir / "result.json", *launch_dir.glob("rank-*.pid")):
        stale.unlink(missing_ok=True)
    return launch_dir


def _write_spec(launch_dir: Path, recipe: Recipe, work_dir: Path, dataset_cache_dir: Path | None) -> Path:
    """Write what the ranks run (relay_engine.core.launched_job reads it); the file's path."""
    spec = {
        "recipe": recipe.to_dict(),
        "work_dir": str(work_dir),
        "dataset_cache_dir": str(dataset_cache_dir) if dataset_cache_dir is not None else None,
        "stop_file": str(launch_dir / "stop"),
        "result_file": str(launch_dir / "result.json"),
    }
    spec_file = launch_dir / "spec.json"
    spec_file.write_text(json.dumps(spec))
    return spec_file


def _launcher_command(spec_file: Path, processes: int, rendezvous: Rendezvous | None) -> list[str]:
    """torch.distributed.run starting `processes` ranks of the job: alone, or in the rendezvous."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *(_rendezvous_arguments(rendezvous) if rendezvous is not None else ["--standalone"]),
        "--nproc-per-node",
        str(processes),
        "-m",
        "relay_engine.core.launched_job",
        str(spec_file),
    ]


def _wait_for_launcher(
    launcher: subprocess.Popen[str],
    reader: threading.Thread,
    launch_dir: Path,
    processes: int,
    should_stop: Callable[[], bool],
    role: Role,
    poll_seconds: float,
) -> None:
    """Wait for the launcher to exit, passing a stop on to the ranks (the stop file) and learning
    this host's role from their pid files; stop the launcher if this is interrupted."""
    stop_file = launch_dir / "stop"
    try:
        while launcher.poll() is None:
            if should_stop() and not stop_file.exists():
                stop_file.touch()
            if role.main is None:
                role.read_pid_files(launch_dir, processes)
            reader.join(poll_seconds)
    except BaseException:
        _stop(launcher)
        raise
    finally:
        reader.join(30)


def _rendezvous_arguments(rendezvous: Rendezvous) -> list[str]:
    join_timeout = max(1, round(rendezvous.join_timeout_seconds))
    settings = f"is_host={str(rendezvous.serves).lower()},join_timeout={join_timeout}"
    arguments = [
        "--nnodes",
        str(rendezvous.hosts),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        rendezvous.endpoint,
        "--rdzv-id",
        rendezvous.run_id,
        "--rdzv-conf",
        settings,
    ]
    if rendezvous.local_addr:
        arguments += ["--local-addr", rendezvous.local_addr]
    return arguments


def _relay_events(
    launcher: subprocess.Popen[str],
    on_event: Callable[[Event], None],
    errors: list[BaseException],
    role: Role,
) -> None:
    assert launcher.stdout is not None
    for line in launcher.stdout:
        if not line.startswith(EVENT_PREFIX):
            sys.stdout.write(line)
            continue
        if errors:
            continue  # keep draining the pipe so the ranks never block on it
        try:
            role.learn(True)  # only rank 0 prints events
            on_event(parse_event(json.loads(line[len(EVENT_PREFIX) :])))
        except BaseException as error:  # handed to the worker's thread
            errors.append(error)
            _stop(launcher)


def _stop(launcher: subprocess.Popen[str]) -> None:
    """SIGTERM: the launcher stops its ranks before it exits; SIGKILL if it does not in time."""
    launcher.terminate()
    try:
        launcher.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        launcher.kill()


def _die_with_parent() -> None:
    """In the launcher's process, before it starts: SIGTERM it when this worker dies (Linux).

    A worker killed outright must not leave its ranks training beside the job's next attempt; the
    launcher passes the signal on to them.
    """
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
