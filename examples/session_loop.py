"""A training loop of your own, each step run by a Relay training session: read it top to bottom.

The session client (`relay.training`) sends every call at once and returns a future, keeps calls in
order and the session alive; this program is the loop around it: the data, the schedule, when to
log, save and evaluate. Change any of it. It reads a LeRobot dataset with the engine's reader
(`pip install "relay-intelligence[engine]"`), but any source of observations and action chunks will do.

    relay server &                                    # a local service (or set RELAY_BASE_URL and
    relay datasets synth ./look                       # RELAY_API_KEY for a remote one)
    python examples/session_loop.py --dataset ./look --steps 200

Run it again with `--resume step-100` to go on from a saved state in a new session.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from relay.training import SamplingClient, ServiceClient, TrainingClient, types
from relay_engine.core.schedule import learning_rate  # warmup, then cosine decay: or your own
from relay_engine.datasets import open_dataset
from relay_engine.samples import Sample


def parse_args() -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--dataset", default="./look", help="A LeRobot v2.1 dataset: directory or Hub id.")
    parser.add_argument(
        "--dataset-revision", default=None, help="A Hub dataset's branch, tag or commit (default: v2.1)."
    )
    parser.add_argument("--base-model", default="pi05-tiny", help="pi05-tiny (CPU) or pi05 (GPU).")
    parser.add_argument("--rank", type=int, default=32, help="The LoRA adapters' rank.")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="The peak, after warmup.")
    parser.add_argument("--held-out-episodes", type=int, default=4, help="The last episodes, to evaluate on.")
    parser.add_argument("--eval-frames", type=int, default=32, help="Held-out frames to sample.")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--save-every", type=int, default=100, help="Steps between saved states.")
    parser.add_argument("--resume", default=None, help="A saved state's name, like step-100.")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def to_datum(sample: Sample) -> types.Datum:
    """A dataset sample as a session datum: the robot's own state and action widths, unpadded.

    Steps past an episode's end repeat its last action; a datum has no per-step mask, so they train
    as they are (the recipe leaves them out of the loss)."""
    observation = {
        "image": sample["image"],
        "state": sample["state"][: sample["state_dim"]],
        "prompt": sample["prompt"],
    }
    return types.Datum(observation=observation, actions=sample["actions"][:, : sample["action_dim"]])


def held_out_error(sampler: TrainingClient | SamplingClient, samples: list[Sample]) -> float:
    """The mean squared error of sampled chunks against the dataset's, over real steps and columns."""
    actions = sampler.sample([to_datum(s).observation for s in samples]).result()
    errors = []
    for predicted, sample in zip(actions, samples, strict=True):
        width, real_steps = sample["action_dim"], ~sample["action_is_pad"]
        errors.append((predicted[real_steps, :width] - sample["actions"][real_steps, :width]) ** 2)
    return float(np.concatenate([e.ravel() for e in errors]).mean())


def main() -> None:
    args = parse_args()
    rng = np.random.default_rng(args.seed)

    # -- data: normalized samples; the last episodes are held out ------------------------------------
    data = open_dataset(args.dataset, revision=args.dataset_revision)
    episodes = data.summary.episodes
    train_indices = data.indices_of_episodes(range(episodes - args.held_out_episodes))
    held_out_indices = data.indices_of_episodes(range(episodes - args.held_out_episodes, episodes))
    spacing = max(1, len(held_out_indices) // args.eval_frames)
    held_out = [data[int(i)] for i in held_out_indices[::spacing][: args.eval_frames]]
    print(f"{args.dataset}: {len(train_indices)} training frames; evaluating on {len(held_out)}")

    # -- a session: a worker with the model loaded, LoRA adapters on the action expert -----------------
    service_client = ServiceClient()
    with service_client.create_lora_training_client(args.base_model, rank=args.rank) as training_client:
        print(f"session ready: {training_client.info}")
        start_step = 0
        if args.resume:
            loaded = training_client.load_state(args.resume).result()
            start_step = int(args.resume.removeprefix("step-"))
            print(f"resumed from {loaded.name}")
        before = held_out_error(training_client, held_out)

        # -- the loop: every call returns a future at once, so the next batch is read and sent while
        # the worker runs this step; .result() waits, here only when logging and saving ---------------
        started = time.perf_counter()
        pending = []
        for step in range(start_step, args.steps):
            picks = rng.choice(train_indices, size=args.batch_size, replace=False)
            batch = [to_datum(data[int(i)]) for i in picks]
            lr = learning_rate(step, args.steps, args.learning_rate)
            fwd_bwd = training_client.forward_backward(batch, "flow_matching")
            optim = training_client.optim_step(types.AdamParams(learning_rate=lr))
            pending.append(fwd_bwd)

            if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
                # A failed step raises here, from its future: check them regularly.
                losses = [f.result().metrics["loss"] for f in pending]
                grad_norm = optim.result().metrics["grad_norm"]
                elapsed = time.perf_counter() - started
                print(
                    f"step {step + 1}/{args.steps}  loss {np.mean(losses):.4f}  grad_norm {grad_norm:.3f}  "
                    f"lr {lr:.2e}  {elapsed:.0f}s",
                    flush=True,
                )
                pending = []
            if (step + 1) % args.save_every == 0:
                saved = training_client.save_state(f"step-{step + 1}").result()
                print(f"saved {saved.name}")

        # -- the result: the weights saved and sampled from, on episodes training never saw -----------
        sampler = training_client.save_weights_and_get_sampling_client(f"final-{args.steps}")
        after = held_out_error(sampler, held_out)
        print(f"held-out action MSE (normalized units): untrained {before:.4f}, trained {after:.4f}")
        print(f"weights (adapters merged) at {sampler.path} on the service")


if __name__ == "__main__":
    main()
