"""This host's NVIDIA GPUs, as nvidia-smi lists them: what a worker reports in its heartbeats and
holds a job against, and what `relay server` knows of its own worker before that worker beats."""

from __future__ import annotations

import subprocess


def gpu_memory(visible: str | None) -> int | None:
    """Bytes of the smallest GPU this host shows its jobs (CUDA_VISIBLE_DEVICES when set), from
    nvidia-smi, which leaves CUDA uninitialised in this process (its pool processes fork from it
    and must initialise CUDA themselves). None when the host has no NVIDIA GPU."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    sizes: dict[str, int] = {}
    for line in listed.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3 and parts[2].isdigit():
            mebibytes = int(parts[2]) * 2**20
            sizes[parts[0]] = sizes[parts[1]] = mebibytes
    wanted = [d.strip() for d in visible.split(",") if d.strip()] if visible else list(sizes)
    shown = [sizes[d] for d in wanted if d in sizes]
    return min(shown) if shown else None
