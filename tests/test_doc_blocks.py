"""Documentation that runs: every ```bash and ```python block of README.md and docs/*.md is run here
as written, in page order, or its first line says what it needs that this machine lacks.

A block whose first line is `# needs: ...` is not run; the marker names one or more needs of NEEDS
(comma-separated), and the reader sees the same line. Every other block runs in the page's own scratch
directory (so `relay datasets synth ./dots` in one block makes the `./dots` a later block reads), with
RELAY_HOME there, against one `relay server` started by this module (SQLite and its own worker
processes): RELAY_BASE_URL / RELAY_API_KEY for the CLI and the SDK, $RELAY / $RELAY_API_KEY for the
curl blocks. Bash blocks run under `bash -euo pipefail`, python blocks with this interpreter. Each
block runs in a process group of its own; a page's groups are stopped when the page ends, so a block
may start a server in the background (`relay serve ... &`) for the page's later blocks.

One more rule (EXEMPT_COMMANDS): a block made only of commands that install Relay or run the
repository's own checks (`bash scripts/demo.sh`, `bash scripts/test.sh`, pytest, ruff, mypy,
lint-imports, pip install) is not run here: scripts/test.sh, which CI runs, is those checks, and
running them from inside the suite would reinstall the package under test or run the suite in
itself. `relay server` lines count as such too (this module starts one for every other block), and
so does `python scripts/pretrain_tiny.py`, which rewrites the pi05-tiny weights the package ships.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.service.stack import free_port, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# What a block may need that the test machine lacks: the marker's words, and what they mean. Kept
# small on purpose: a block that needs none of these is run.
NEEDS = {
    "a GPU": "a CUDA GPU (pi05 itself, --device cuda, several GPUs)",
    "the network": "the Hugging Face Hub or another download",
    "a PostgreSQL server": "a PostgreSQL server the block names",
    "a MySQL server": "a MySQL server the block names",
    "a Redis server": "a Redis server the block names",
    "docker": "Docker and Docker Compose",
    "lerobot": "LeRobot installed (pip install lerobot)",
    "your own service": "a job, deployment or session of your own service, or its address, that "
    "nothing on the page creates",
    "your own simulator": "a Gymnasium environment of your own",
}
MARKER = re.compile(r"^#\s*needs:\s*(.+?)\s*$")
# Commands that install Relay or run the repository's own checks (see the module's docstring).
EXEMPT_COMMANDS = (
    "bash scripts/demo.sh",
    "bash scripts/test.sh",
    "pytest",
    "ruff",
    "mypy",
    "lint-imports",
    "pip install",
    ". .venv/bin/activate",
    "relay server",  # this module starts it itself (the `server` fixture) for every other block
    "python scripts/pretrain_tiny.py",  # rewrites the weights the package ships, from a checkout
)
FENCE = re.compile(r"^(\s*)```(bash|python)\s*$")
# The checkout's folders a page's commands name by relative path (`python examples/local_loop.py`):
# linked into each scratch directory, as if the reader ran them in their clone.
CHECKOUT = ("examples", "bench", "scripts")
BLOCK_TIMEOUT = 300  # seconds: one block, a small run on a loaded 2-core machine


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the fence's line, 1-based
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The page's bash and python blocks, in order, each dedented by its fence's indentation."""
    lines = page.read_text().splitlines()
    found = []
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence:
            indent = len(fence.group(1))
            end = index + 1
            while not lines[end].strip().startswith("```"):
                end += 1
            body = [line[indent:] if line[:indent].strip() == "" else line for line in lines[index + 1 : end]]
            found.append(Block(page, index + 1, fence.group(2), "\n".join(body) + "\n"))
            index = end
        index += 1
    return found


def needs_of(block: Block) -> list[str]:
    """The needs its first line names (none: the block is run); an unknown need is refused."""
    first = block.text.split("\n", 1)[0]
    marker = MARKER.match(first)
    if marker is None:
        return []
    needs = [need.strip() for need in marker.group(1).split(",")]
    unknown = [need for need in needs if need not in NEEDS]
    if unknown:
        raise ValueError(f"{block.where}: unknown need {unknown}; the needs are {sorted(NEEDS)}")
    return needs


def exempt(block: Block) -> bool:
    """Whether every command of the block installs Relay or runs the repository's own checks."""
    commands = [line.strip() for line in block.text.splitlines()]
    commands = [c for c in commands if c and not c.startswith("#")]
    return block.language == "bash" and all(c.startswith(EXEMPT_COMMANDS) for c in commands)


def test_an_unknown_need_is_refused() -> None:
    block = Block(ROOT / "README.md", 1, "bash", "# needs: patience\nrelay fine-tunes list\n")
    with pytest.raises(ValueError, match="unknown need"):
        needs_of(block)
    known = Block(ROOT / "README.md", 1, "bash", "# needs: a GPU, the network\nrelay eval pi05\n")
    assert needs_of(known) == ["a GPU", "the network"]


def test_the_exemption_covers_only_install_and_check_commands() -> None:
    checks = Block(ROOT / "README.md", 1, "bash", "bash scripts/test.sh   # all of it\npytest -x\n")
    assert exempt(checks)
    mixed = Block(ROOT / "README.md", 1, "bash", "pip install -e .\nrelay datasets synth ./dots\n")
    assert not exempt(mixed)


def test_every_marker_names_a_known_need() -> None:
    for page in PAGES:
        for block in blocks_of(page):
            needs_of(block)  # raises on an unknown need


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`relay server` on a free port, as a reader starts it: (its URL, its API key)."""
    home = tmp_path_factory.mktemp("server") / ".relay"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env["RELAY_HOME"] = str(home)
    port = free_port()
    log_path = home.parent / "server.out"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "relay.cli", "server", "--port", str(port)],
            env=env,
            cwd=home.parent,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            return httpx.get(f"{url}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, 120, "relay server to answer", every=0.3)
        key = json.loads((home / "client.json").read_text())["api_key"]
        yield url, key
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _environment(scratch: Path, url: str, key: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env |= {"RELAY_HOME": str(scratch / ".relay"), "RELAY_BASE_URL": url, "RELAY_API_KEY": key}
    env["RELAY"] = url  # docs/api.md's curl blocks
    # `relay` and `python` are this interpreter's (its venv's bin first on PATH).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in sys.path if p.startswith(str(ROOT))]])
    # A block that reaches for the Hub without saying so fails at once rather than downloading.
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(block: Block, number: int, scratch: Path, env: dict[str, str], groups: list[int]) -> None:
    script = scratch / ".blocks" / f"{number:02d}.{'sh' if block.language == 'bash' else 'py'}"
    script.parent.mkdir(exist_ok=True)
    script.write_text(block.text)
    bash = ["bash", "-euo", "pipefail", str(script)]
    command = bash if block.language == "bash" else [sys.executable, str(script)]
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=scratch,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    groups.append(process.pid)
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        rc: int | None = None
    else:
        rc = process.returncode
    text = output.decode(errors="replace")
    seconds = time.monotonic() - started
    print(f"{block.where}: rc {rc} in {seconds:.1f} s")
    if rc != 0:
        what = f"timed out after {BLOCK_TIMEOUT} s" if rc is None else f"exit status {rc}"
        pytest.fail(
            f"{block.where} ({block.language}) failed: {what}\n--- block ---\n{block.text}"
            f"--- output (tail) ---\n{text[-4000:]}",
            pytrace=False,
        )


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_page_runs(page: Path, server: tuple[str, str], tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for checkout in CHECKOUT:  # the pages run examples/... and bench/... from a checkout
        (scratch / checkout).symlink_to(ROOT / checkout)
    env = _environment(scratch, *server)
    groups: list[int] = []
    ran = 0
    try:
        for number, block in enumerate(blocks_of(page)):
            if needs_of(block) or exempt(block):
                continue
            _run(block, number, scratch, env, groups)
            ran += 1
    finally:
        for group in groups:  # what a block left running in the background (a `relay serve ... &`)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
    print(f"{page.relative_to(ROOT)}: {ran} blocks run")
