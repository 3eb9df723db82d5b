"""A recipe run's checkpoints, sharded with torch.distributed.checkpoint (DCP).

Layout of one checkpoint (sealed by CheckpointStore.commit, atomically as every checkpoint):
    state/            DCP: the trainable weights and the AdamW moments, each process writing
                      its own shards, with a `.metadata` index of every tensor's global shape
    rng/rank-00000.pt the step count and random generators of each process
    manifest.json     step, data position, metrics window, recipe fingerprint, world size

DCP reads a checkpoint into whatever layout the reading processes have, so a run saved by 2
processes resumes on 1 (or 1 on 2) with the same weights and moments; each process takes its own
rank's generators, or rank 0's when the saving run had no such rank. The flow-matching noise does
not depend on those generators (it is a function of seed, step and place), so the losses of a
resharded run are those of an uninterrupted one too.

A run on one process with no group writes the same layout, so it can be resumed on many.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from relay_engine.core.checkpoint import CheckpointStore
from relay_engine.families.pi05.learner import Pi05Learner
from relay_engine.families.pi05.parallel import Parallel
from relay_engine.models import Pi05Policy, materialize_buffers
from relay_engine.tuning import apply_tuning

STATE_DIR = "state"
RNG_DIR = "rng"
# Frozen weights come from the base model, not from the checkpoint.
TRAINABLE_ONLY = StateDictOptions(ignore_frozen_params=True)
# ... so loading leaves them as they are (the checkpoint holds every trainable weight: DCP's load
# fails on one that is missing).
INTO_TRAINABLE = StateDictOptions(ignore_frozen_params=True, strict=False)


def _rank(parallel: Parallel | None) -> int:
    return parallel.world.rank if parallel is not None else 0


def _rng_file(directory: Path, rank: int) -> Path:
    return directory / RNG_DIR / f"rank-{rank:05d}.pt"


@contextlib.contextmanager
def _single_process_quietly() -> Iterator[None]:
    """DCP without a process group reads and writes as one process, and says so in a UserWarning
    on every call; a one-process run checkpoints without collectives by design."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save_sharded(
    store: CheckpointStore,
    step: int,
    learner: Pi05Learner,
    meta: Mapping[str, object],
    parallel: Parallel | None,
) -> Path:
    """Every process writes its shards and generators into one temporary directory; rank 0 seals it."""
    main = parallel is None or parallel.world.is_main
    tmp = store.begin(step) if main else None
    if parallel is not None:
        tmp = Path(parallel.broadcast_object(str(tmp) if tmp is not None else None))
    assert tmp is not None
    try:
        model_state, optimizer_state = get_state_dict(
            learner.model, learner.optimizer, options=TRAINABLE_ONLY
        )
        with _single_process_quietly():
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp / STATE_DIR)
        rng_path = _rng_file(tmp, _rank(parallel))
        rng_path.parent.mkdir(exist_ok=True)
        torch.save(learner.rng_state(), rng_path)
        _fsync(rng_path)
    except BaseException as error:
        # DCP reports a failed write as a CheckpointException, a BaseException: the store turns it
        # into an ordinary error in the writer's words (a full disk into DiskFullError). The partial
        # directory is rank 0's to remove.
        store.abandon(tmp, error, remove=main)
        raise
    if parallel is not None:
        parallel.barrier()  # every shard is on disk before rank 0 seals the directory
    world_size = parallel.size if parallel is not None else 1
    final = store.root / store.name_of(step)
    if main:
        final = store.commit(step, tmp, {**meta, "world_size": world_size})
    if parallel is not None:
        parallel.barrier()  # nobody runs ahead (or reads `latest`) before the pointer moved
    return final


def load_sharded(directory: Path, learner: Pi05Learner, parallel: Parallel | None) -> None:
    """Weights, moments and this rank's generators from a checkpoint, into this run's layout."""
    model_state, optimizer_state = get_state_dict(learner.model, learner.optimizer, options=TRAINABLE_ONLY)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    # Every trainable weight must be there. Moments may be missing: a weight no pass reaches (the
    # language model's last norm) has none after a run of one process, while DDP and FSDP give it
    # zero gradients and so zero moments, which is what a missing one starts as here.
    with _single_process_quietly():
        dcp.load({"model": model_state}, checkpoint_id=directory / STATE_DIR)
        dcp.load(
            {"optimizer": optimizer_state},
            checkpoint_id=directory / STATE_DIR,
            planner=DefaultLoadPlanner(allow_partial_load=True),
        )
    set_state_dict(
        learner.model,
        learner.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=INTO_TRAINABLE,
    )
    rng_path = _rng_file(directory, _rank(parallel))
    if not rng_path.is_file():  # resharded onto more processes than saved it
        rng_path = _rng_file(directory, 0)
    # Our own file: the numpy generator's state needs full unpickling.
    learner.set_rng_state(torch.load(rng_path, map_location="cpu", weights_only=False))


def gathered_policy(policy: Pi05Policy, parallel: Parallel | None) -> Pi05Policy | None:
    """On rank 0, the whole trained policy on the CPU, for writing the output; None elsewhere.

    Under FSDP each weight is gathered shard by shard straight into CPU memory, so no GPU ever
    holds a second whole copy. Under DDP (or alone) every process already holds all of it.
    """
    if parallel is None:
        return policy
    if parallel.strategy == "ddp":
        return policy if parallel.world.is_main else None
    full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not parallel.world.is_main:
        return None
    tuning = dict(policy.config.tuning or {})
    with torch.device("meta"):
        copy = Pi05Policy(policy.config, tokenizer=policy.collate.tokenizer)
    copy = apply_tuning(
        copy,
        tuning.get("finetune", "full"),
        tuning.get("targets"),
        tuning.get("lora_rank", 32),
        tuning.get("lora_alpha"),
    )
    _load_assigned(copy, {name: value for name, value in full.items() if isinstance(value, torch.Tensor)})
    materialize_buffers(copy, torch.device("cpu"))
    return copy


def _load_assigned(module: nn.Module, state: Mapping[str, Any]) -> None:
    missing, unexpected = module.load_state_dict(state, strict=False, assign=True)
    if unexpected or any(not name.endswith("position_ids") for name in missing):
        raise RuntimeError(f"gathered weights do not fit the policy: {missing[:3]} {unexpected[:3]}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
