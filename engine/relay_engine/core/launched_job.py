"""One process of a recipe job that a worker started through torch.distributed.run.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m relay_engine.core.launched_job WORK_DIR/launch/spec.json

spec.json: {"recipe": Recipe.to_dict(), "work_dir", "dataset_cache_dir", "stop_file",
"result_file"}. Rank 0 prints each event as one line `EVENT {json}` on its standard output
(`relay.events.event_line`; the worker parses it back with `parse_event` and records it) and writes
`result_file` at the end: a `RecipeResult.to_json()`, or {"error"} for a user's mistake
(EngineError). Every rank stops after the
current step once `stop_file` exists (the worker creates it for a cancel or its own shutdown);
the ranks agree on it each step, so they stop at the same one. Each rank writes its pid to
`launch/rank-R.pid`, for operators (and the tests that kill one).

A crash of any rank makes the launcher stop the others and exit non-zero; the worker then gives
the job back, and its next attempt resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from relay.events import Event, event_line
from relay_engine.core.checkpoint import write_atomic
from relay_engine.core.group import join, leave
from relay_engine.errors import EngineError
from relay_engine.recipe import Recipe, run_recipe

EVENT_PREFIX = "EVENT "


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    recipe = Recipe.from_dict(spec["recipe"])
    world = join(recipe.device)
    launch_dir = Path(spec_path).parent
    (launch_dir / f"rank-{world.rank}.pid").write_text(str(os.getpid()))
    stop_file = Path(spec["stop_file"])
    result_file = Path(spec["result_file"])

    def on_event(event: Event) -> None:
        print(EVENT_PREFIX + event_line(event), flush=True)

    try:
        result = run_recipe(
            recipe,
            Path(spec["work_dir"]),
            on_event=on_event,
            should_stop=stop_file.exists,
            dataset_cache_dir=Path(spec["dataset_cache_dir"]) if spec.get("dataset_cache_dir") else None,
        )
        outcome = result.to_json()
    except EngineError as error:  # the same mistake on every rank; rank 0 tells the worker
        outcome = json.dumps({"error": str(error)})
    finally:
        leave()
    if world.is_main:
        write_atomic(result_file, outcome.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
