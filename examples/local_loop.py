"""The engine's training loop, written flat: read it top to bottom.

`relay local train` and the service's recipe jobs run the same steps through
`relay_engine.core.loop.run_loop`, which splits them into a Learner (the step), a checkpoint
store, a data position and callbacks, so that jobs stop, resume and report exactly. Here they are
in one file: a dataset, a tuned pi05, the flow-matching step, the learning-rate schedule and a
checkpoint to resume from. Change anything and run it.

    relay datasets synth ./look                       # a small synthetic LeRobot dataset
    python examples/local_loop.py --dataset=./look --steps=200 --out_dir=./local-loop

Any setting below can be given as --name=value. Run it again with the same out_dir to resume from
its checkpoint; it prints the held-out action error before and after training.
"""

from __future__ import annotations

import ast
import sys
import time
from pathlib import Path

import torch

from relay_engine.core.schedule import learning_rate
from relay_engine.datasets import open_dataset
from relay_engine.families.pi05.export import write_output
from relay_engine.families.robot_scores import evaluate_actions
from relay_engine.models import flow_matching_loss, load_policy, sample_flow_time
from relay_engine.tuning import apply_tuning, load_trainable_state_dict, trainable_state_dict

# -- settings (each can be overridden as --name=value) -----------------------------------------------
dataset = "./look"  # a LeRobot v2.1 dataset: a local directory or a Hub repo id
out_dir = "./local-loop"  # the checkpoint, and the merged model at the end
model_name = "pi05-tiny"  # pi05-tiny runs on a CPU; pi05 wants a GPU
held_out_episodes = 4  # the last episodes are kept out of training, to measure on
steps = 200
batch_size = 16
peak_lr = 1e-3  # pi05-tiny learns at this rate; pi05's recipe default is 2.5e-5
finetune = "lora"  # or "full"
targets = None  # None: the method's default targets (see `relay models list`)
lora_rank = 32
action_horizon = 10
checkpoint_every = 100
log_every = 10
seed = 0
device = "cuda" if torch.cuda.is_available() else "cpu"

for arg in sys.argv[1:]:  # --name=value, as nanoGPT's configurator does it
    name, _, text = arg.removeprefix("--").partition("=")
    if name not in globals() or name.startswith("_"):
        sys.exit(f"unknown setting {name!r}")
    try:
        globals()[name] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        globals()[name] = text  # a plain string such as a path
torch.manual_seed(seed)

# -- data: normalized samples; the last episodes are held out ----------------------------------------
data = open_dataset(dataset, action_horizon=action_horizon)
episodes = data.summary.episodes
train_indices = data.indices_of_episodes(range(episodes - held_out_episodes)).tolist()
held_out = data.indices_of_episodes(range(episodes - held_out_episodes, episodes)).tolist()
print(f"{dataset}: {len(train_indices)} training frames, {len(held_out)} held out")

# -- model: the base policy with LoRA adapters (or every weight) on the targets ----------------------
policy = load_policy(model_name, device=device, action_horizon=action_horizon, seed=seed)
policy.config = policy.config.replace(robot_action_dim=data.summary.action_dim)
before = evaluate_actions(policy, data, held_out)
policy = apply_tuning(policy, finetune, targets, lora_rank)
trainable = [p for p in policy.parameters() if p.requires_grad]
print(f"{model_name}: {sum(p.numel() for p in trainable):,} trainable parameters ({finetune})")
# The recipe's AdamW: betas 0.9 and 0.95, no weight decay; the rate is set every step.
optimizer = torch.optim.AdamW(trainable, lr=peak_lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)

# -- resume: the trainable weights, the optimizer and the step ---------------------------------------
checkpoint_path = Path(out_dir) / "checkpoint.pt"
start_step = 0
if checkpoint_path.exists():
    checkpoint = torch.load(checkpoint_path, map_location=device)
    load_trainable_state_dict(policy, checkpoint["weights"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    start_step = checkpoint["step"]
    print(f"resuming from step {start_step}")

# -- the loop ----------------------------------------------------------------------------------------
policy.train()
started, losses = time.perf_counter(), []
for step in range(start_step, steps):
    # Warmup then cosine decay to zero, the recipe's schedule.
    lr = learning_rate(step, steps, peak_lr)
    for group in optimizer.param_groups:
        group["lr"] = lr

    # The step's batch and its flow-matching noise come from generators seeded by the step, so a
    # resumed run reads and draws what an uninterrupted one would have.
    step_rng = torch.Generator().manual_seed(seed * 1_000_003 + step)
    picks = torch.randperm(len(train_indices), generator=step_rng)[:batch_size]
    batch = policy.collate([data[train_indices[i]] for i in picks.tolist()]).to(device)
    noise = torch.randn(batch.actions.shape, generator=step_rng)
    flow_time = sample_flow_time(batch.actions.shape[0], step_rng)

    # Noise the actions at the flow time, predict the velocity back to the data, regress it.
    outputs = policy.flow_outputs(batch, noise=noise, time=flow_time)
    loss, _ = flow_matching_loss(outputs, batch)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, max_norm=1.0)
    if torch.isfinite(grad_norm):  # a non-finite gradient is dropped, as the engine does
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())

    if (step + 1) % log_every == 0 or step + 1 == steps:
        window = losses[-log_every:]
        elapsed = time.perf_counter() - started
        print(
            f"step {step + 1}/{steps}  loss {sum(window) / len(window):.4f}  "
            f"grad_norm {grad_norm:.3f}  lr {lr:.2e}  {elapsed:.0f}s",
            flush=True,
        )
    if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
        checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        weights = trainable_state_dict(policy)
        state = {"weights": weights, "optimizer": optimizer.state_dict(), "step": step + 1}
        torch.save(state, checkpoint_path.with_suffix(".tmp"))
        checkpoint_path.with_suffix(".tmp").replace(checkpoint_path)  # a checkpoint appears whole

# -- the result: held-out error, and the merged model that `load_policy` and lerobot read ------------
after = evaluate_actions(policy, data, held_out)
# The error of the mean of the chunks sampled per frame (validation's headline; one chunk's error
# also carries the sampler's spread, `.spread`).
print(
    f"held-out action MSE, mean of {after.chunks} chunks a frame (normalized units): "
    f"untrained {before.mean_mse:.4f}, trained {after.mean_mse:.4f}"
)
write_output(policy, Path(out_dir) / "model", data)
print(f"model in {Path(out_dir) / 'model'}")
