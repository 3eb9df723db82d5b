"""SmolVLA's part of a training-loop session (relay_engine.core.session.Session): datums as
observations and action chunks, the flow-matching loss lerobot trains by default (the expert and
the projections), and samplers of saved weights. The steps are the SmolVLALearner's, the same code
that runs recipe jobs.

SmolVLA reads any number of cameras under their own names, so a session's cameras are the ones its
first datum brings; every later datum brings the same ones. State and actions arrive normalized
(the user's mean and std), as in pi05's sessions; saved weights carry identity statistics, so
they act in the units the session trained in.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from relay.catalog import ACTION_DIM, STATE_DIM
from relay_engine.core.checkpoint import write_whole
from relay_engine.core.session import Session
from relay_engine.datasets.norm_stats import NormStats, Stats
from relay_engine.errors import EngineError
from relay_engine.families.robot_datums import check_frame_sizes, datum_to_sample
from relay_engine.families.smolvla.files import BACKBONE_DIR, write_processors, write_relay_config
from relay_engine.families.smolvla.learner import SmolVLABatch, SmolVLACollate, SmolVLALearner
from relay_engine.samples import Sample

if TYPE_CHECKING:
    from relay_engine.families.smolvla.family import SmolVLAFamily
    from relay_engine.families.smolvla.policy import SmolVLAPolicy


def identity_stats(state_dim: int, action_dim: int) -> NormStats:
    """Statistics that leave values as they are (mean 0, std 1): a session's data arrive normalized."""

    def unit(width: int) -> Stats:
        return Stats(mean=np.zeros(width), std=np.ones(width), q01=-np.ones(width), q99=np.ones(width))

    return NormStats(state=unit(state_dim), actions=unit(action_dim), method="mean_std")


class SmolVLASession(Session[SmolVLABatch]):
    """A SmolVLA, its optimizer and a session's calls (docs/sessions.md), on plain data."""

    loss_fn = "flow_matching"

    def __init__(
        self,
        family: SmolVLAFamily,
        base_model: str,
        *,
        device: torch.device | str = "cpu",
        seed: int = 0,
        lora: tuple[int, float] | None = None,
    ) -> None:
        """`lora`: (rank, alpha) to tune with LoRA where lerobot puts it; None: in full."""
        self.family = family
        self.base_model = base_model
        self.lora = lora
        torch.manual_seed(seed)
        self.policy, self.backbone_dir = family.base_policy(base_model)
        if lora is not None:
            from relay_engine.families.smolvla.tuning import apply_lora

            apply_lora(self.policy, lora[0], lora[1], seed)
        self.policy.to(device)
        tokenizer = family.tokenizer(self.policy, self.backbone_dir)
        # The processor only tokenizes here: the data arrive normalized.
        self.processor = family.processor(self.policy, tokenizer, identity_stats(STATE_DIM, ACTION_DIM))
        self.learner: SmolVLALearner = SmolVLALearner(self.policy, seed=seed, device=device)
        self.generator = torch.Generator().manual_seed(seed)
        # The robot, learned from the datums: the first one's cameras, the widest state and actions.
        self.cameras: dict[str, tuple[int, int, int]] | None = None
        self.state_dim = 0
        self.action_dim = 0
        self._samplers: dict[str, SmolVLAPolicy] = {}

    @property
    def info(self) -> dict[str, Any]:
        return {
            "model": self.base_model,
            "action_horizon": self.policy.config.chunk_size,
            "action_dim": ACTION_DIM,
            "trainable_params": sum(p.numel() for p in self.learner.params),
        }

    def identity(self) -> dict[str, Any]:
        if self.lora is None:
            return {"base_model": self.base_model, "finetune": "full"}
        return {"base_model": self.base_model, "finetune": "lora", "lora_rank": self.lora[0]}

    # -- data -------------------------------------------------------------------------------------

    def batch(self, datums: Sequence[Mapping[str, Any]], *, with_actions: bool = True) -> SmolVLABatch:
        if not datums:
            raise EngineError("a batch needs at least one datum")
        samples = [self._sample(i, d, with_actions) for i, d in enumerate(datums)]
        check_frame_sizes(samples)
        self._note_robot(samples)
        return SmolVLACollate(self.processor, self.policy.cameras)(samples)

    def _sample(self, index: int, datum: Mapping[str, Any], with_actions: bool) -> Sample:
        sample: dict[str, Any] = dict(datum_to_sample(index, datum, with_actions=with_actions))
        label = f"datum {index}"
        images = sample["image"]
        if not images:
            raise EngineError(f"{label}: image is empty; SmolVLA reads at least one camera")
        for camera, frame in images.items():
            frame = np.asarray(frame)
            if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
                raise EngineError(
                    f"{label}: image {camera!r} must be uint8 (height, width, 3), "
                    f"got {frame.dtype} {frame.shape}"
                )
            images[camera] = frame
        if self.cameras is not None and set(images) != set(self.cameras):
            raise EngineError(
                f"{label}: image has cameras {sorted(images)}; this session reads "
                f"{sorted(self.cameras)} (its first datum's)"
            )
        if with_actions:
            actions = sample["actions"]
            chunk = self.policy.config.chunk_size
            if actions.shape[0] != chunk:
                raise EngineError(
                    f"{label}: actions must be {chunk} steps long (SmolVLA's chunk), got {actions.shape[0]}"
                )
            padded = np.zeros((chunk, ACTION_DIM), dtype=np.float32)
            padded[:, : actions.shape[1]] = actions
            sample["actions"] = padded
            sample["action_is_pad"] = np.zeros(chunk, dtype=bool)
        return sample  # type: ignore[return-value]

    def _note_robot(self, samples: Sequence[Mapping[str, Any]]) -> None:
        """The cameras (the first datum's), and the widest state and actions seen: the loss is over
        the robot's action columns, and saved weights name the robot."""
        if self.cameras is None:
            first = samples[0]["image"]
            self.cameras = {name: (3, *np.shape(frame)[:2]) for name, frame in first.items()}
        state_dim = max(self.state_dim, *(int(s["state_dim"]) for s in samples))
        action_dim = max(self.action_dim, *(int(s.get("action_dim", 0)) for s in samples))
        if (state_dim, action_dim) != (self.state_dim, self.action_dim) or self.policy.cameras != tuple(
            self.cameras
        ):
            self.state_dim, self.action_dim = state_dim, action_dim
            self.policy.for_robot(self.cameras, max(state_dim, 1), max(action_dim, 1))

    # -- the family's calls -----------------------------------------------------------------------

    def forward_outputs(self, batch: SmolVLABatch) -> dict[str, np.ndarray]:
        """Each datum's flow-matching loss, from the noise and time the next forward_backward draws."""
        return {"loss": self.learner.forward(batch).float().cpu().numpy()}

    def sample(
        self, observations: Sequence[Mapping[str, Any]], num_steps: int = 10, sampler: str | None = None
    ) -> np.ndarray:
        """(N, chunk, 32) actions (normalized), with the weights now or with a saved sampler's."""
        batch = self.batch([{"observation": o} for o in observations], with_actions=False)
        policy = self.policy if sampler is None else self._samplers.get(sampler)
        if policy is None:
            raise EngineError(f"no sampling client {sampler!r} in this session")
        config = policy.config
        noise = torch.randn(
            (batch.batch_size, config.chunk_size, config.max_action_dim), generator=self.generator
        )
        device = next(policy.parameters()).device
        was_training = policy.training
        policy.eval()
        try:
            actions = policy.sample_padded(batch.to(device).tensors, noise.to(device), num_steps)
        finally:
            policy.train(was_training)
        return actions.float().cpu().numpy()

    def save_weights(self, name: str, directory: Path) -> None:
        """lerobot's files for the weights now (a job's output's layout, identity statistics), and a
        sampler that keeps them however training goes on."""
        if self.cameras is None:
            raise EngineError(
                "save_weights: train on at least one datum first (it names the robot's cameras)"
            )
        stats = identity_stats(max(self.state_dim, 1), max(self.action_dim, 1))
        backbone_dir = self.backbone_dir

        def files(target: Path) -> None:
            self.policy.save_lerobot(target)
            assert self.policy.lerobot_config is not None  # save_lerobot wrote it
            write_processors(target, self.policy.lerobot_config, stats)
            (target / "norm_stats.json").write_text(stats.to_json())
            write_relay_config(target, self.base_model)
            if backbone_dir is not None:
                shutil.copytree(backbone_dir, target / BACKBONE_DIR, dirs_exist_ok=True)

        write_whole(directory, files)
        self._samplers[name] = self.family.load_model(str(directory), self.learner.device)
