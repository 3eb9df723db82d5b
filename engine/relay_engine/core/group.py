"""The process group of a job that torch.distributed.run (torchrun) launched, and the few collectives
every family's run needs in it (`GroupCollectives`): any family's, not one model's.

The launcher sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in every process;
`join` reads them (env:// init). On CUDA each process takes the GPU of its local rank and talks
NCCL; without CUDA the processes run on the CPU and talk gloo.

Every collective has a timeout (`RELAY_COLLECTIVE_TIMEOUT_S`, 300 s by default): a rank that
dies makes its peers' next collective fail instead of waiting for ever, and the launcher then
stops the whole group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from relay_engine.errors import ConfigError

DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class World:
    """This process's place in the group."""

    rank: int
    size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    """Whether this process was started by torch.distributed.run (or anything that sets its variables)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def collective_timeout() -> timedelta:
    seconds = os.environ.get("RELAY_COLLECTIVE_TIMEOUT_S", DEFAULT_COLLECTIVE_TIMEOUT_S)
    return timedelta(seconds=float(seconds))


def join(device: str = "auto") -> World:
    """Join the launcher's group (once per process; later calls return the same World)."""
    rank = int(os.environ["RANK"])
    size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"local rank {local_rank} has no GPU: this host shows {torch.cuda.device_count()} "
                "(give --nproc-per-node at most that many)"
            )
        placed = torch.device("cuda", local_rank)
        torch.cuda.set_device(placed)
    else:
        placed = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            init_method="env://",
            timeout=collective_timeout(),
            device_id=placed if use_cuda else None,
        )
    return World(rank=rank, size=size, local_rank=local_rank, device=placed)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def batch_slice(batch_size: int, rank: int, size: int) -> tuple[int, int]:
    """[start, stop) of rank's part of a global batch: as even as can be, the first ranks one more."""
    base, extra = divmod(batch_size, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class GroupCollectives:
    """The small collectives of a run in a group: a stop agreed on, sums and counts over the ranks,
    a barrier, an object from rank 0. A family's model wrapping (pi05's `Parallel`: DDP or FSDP)
    builds on it; `whole_on_each_rank` says whether every rank holds the whole model (rank 0 can
    then evaluate it alone)."""

    whole_on_each_rank = True

    def __init__(self, world: World) -> None:
        self.world = world

    @property
    def size(self) -> int:
        return self.world.size

    def _vector(self, values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64, device=self._comm_device())

    def _comm_device(self) -> torch.device:
        return self.world.device if self.world.device.type == "cuda" else torch.device("cpu")

    def sum(self, values: list[float]) -> list[float]:
        tensor = self._vector(values)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return [float(x) for x in tensor.cpu()]

    def gather_counts(self, count: int) -> list[int]:
        """Every rank's `count`, in rank order."""
        tensor = torch.tensor([count], dtype=torch.int64, device=self._comm_device())
        parts = [torch.zeros_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor)
        return [int(p.item()) for p in parts]

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on one (a stop asked for anywhere stops all)."""
        return self.sum([1.0 if flag else 0.0])[0] > 0

    def barrier(self) -> None:
        dist.barrier()

    def broadcast_object(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
