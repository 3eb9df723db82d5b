"""One job on many processes (GPUs, hosts): torch.distributed groups, DDP or FSDP2, sharded checkpoints."""

from relay_engine.distributed.checkpoint import gathered_policy, load_sharded, save_sharded
from relay_engine.distributed.group import World, batch_slice, join, launched, leave
from relay_engine.distributed.parallel import Parallel, Strategy, choose_strategy

__all__ = [
    "Parallel",
    "Strategy",
    "World",
    "batch_slice",
    "choose_strategy",
    "gathered_policy",
    "join",
    "launched",
    "leave",
    "load_sharded",
    "save_sharded",
]
