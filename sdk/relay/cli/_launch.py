"""Starting a command as a group of processes through PyTorch's launcher, torch.distributed.run.

`relay local train --nproc-per-node 4` runs `python -m torch.distributed.run --nproc-per-node 4
... -m relay.cli local train <the same arguments>`: the launcher starts the processes, gives each
its rank and rendezvous (c10d), and stops them all when one fails. The flags keep the launcher's
own names, so what a user knows from torchrun carries over.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

# Our flags that are the launcher's; they are not passed on to the processes.
LAUNCH_FLAGS = ("--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint")


@dataclass(frozen=True)
class Launch:
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None

    def problem(self) -> str | None:
        """What is wrong with these flags, as a message naming the flag and its rule; None if nothing."""
        if self.nproc_per_node < 1:
            return f"bad --nproc-per-node: {self.nproc_per_node} (must be at least 1: processes on this host)"
        if self.nnodes < 1:
            return f"bad --nnodes: {self.nnodes} (must be at least 1: hosts in the job)"
        if not 0 <= self.node_rank < self.nnodes:
            return f"bad --node-rank: {self.node_rank} (must be from 0 to --nnodes - 1, {self.nnodes - 1})"
        if self.nnodes > 1 and not self.rdzv_endpoint:
            return "--rdzv-endpoint is needed with --nnodes above 1: HOST:PORT of the host of --node-rank 0"
        if self.rdzv_endpoint and not _is_host_port(self.rdzv_endpoint):
            return f"bad --rdzv-endpoint: {self.rdzv_endpoint!r} (must be HOST:PORT)"
        return None

    @property
    def needed(self) -> bool:
        """Whether to start a group: more than one process, and not already inside one."""
        return (self.nproc_per_node > 1 or self.nnodes > 1) and not inside_group()

    def command(self, module_args: list[str]) -> list[str]:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(self.nproc_per_node),
        ]
        if self.nnodes == 1:
            launcher.append("--standalone")  # a private rendezvous on a free local port
        else:
            launcher += [
                "--nnodes",
                str(self.nnodes),
                "--node-rank",
                str(self.node_rank),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                str(self.rdzv_endpoint),
            ]
        return [*launcher, "-m", "relay.cli", *module_args]


def inside_group() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def without_launch_flags(argv: list[str]) -> list[str]:
    """The command line minus the launcher's flags (given as `--flag value` or `--flag=value`)."""
    kept: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in LAUNCH_FLAGS:
            skip_value = "=" not in arg
            continue
        kept.append(arg)
    return kept


def run_launched(launch: Launch, argv: list[str]) -> int:
    """Run `relay <argv>` (without the launch flags) as the group; the launcher's exit status."""
    return subprocess.run(launch.command(without_launch_flags(argv))).returncode


def _is_host_port(value: str) -> bool:
    host, _, port = value.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536
