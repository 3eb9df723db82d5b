"""Run several recipes, one after the other, as one process of a torch.distributed.run launch.

    python -m torch.distributed.run --standalone --nproc-per-node 2 run_recipes.py plan.json

plan.json: {"cache": ..., "runs": [{"work_dir": ..., "recipe": {...}, "stop_after": null | k,
"events": path}], "trainer": null | {"dataset": ..., "args": {...}, "result": path}}. Rank 0
writes each run's events to its `events` file, and the Trainer's losses to its `result`. The
group is joined once for all the runs: starting processes is the slow part.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

from relay_engine import Trainer, TrainingArguments
from relay_engine.core.group import join, leave
from relay_engine.datasets import open_dataset
from relay_engine.models import load_policy
from relay_engine.recipe import Recipe, run_recipe


def stop_after(events: list[dict[str, Any]], steps: int | None) -> bool:
    return steps is not None and sum("loss" in e for e in events) >= steps


def main(plan_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    world = join("cpu")
    try:
        for run in plan["runs"]:
            events: list[dict[str, Any]] = []
            result = run_recipe(
                Recipe.from_dict(run["recipe"]),
                Path(run["work_dir"]),
                on_event=events.append,
                should_stop=partial(stop_after, events, run.get("stop_after")),
                dataset_cache_dir=Path(plan["cache"]),
            )
            if world.is_main:
                summary = {"status": result.status, "step": result.step, "resumed_from": result.resumed_from}
                Path(run["events"]).write_text(json.dumps({"events": events, "result": summary}))
        if plan.get("trainer"):
            run_trainer(plan["trainer"], plan["cache"], world.is_main)
    finally:
        leave()


def run_trainer(spec: dict[str, Any], cache: str, main: bool) -> None:
    """The local trainer as a user's script under torchrun would run it."""
    dataset = open_dataset(spec["dataset"], cache_dir=Path(cache))
    trainer = Trainer(
        model=load_policy("pi05-tiny"), args=TrainingArguments(**spec["args"]), train_dataset=dataset
    )
    result = trainer.train()
    if main:
        Path(spec["result"]).write_text(json.dumps({"result": result, "losses": trainer.losses}))


if __name__ == "__main__":
    main(sys.argv[1])
