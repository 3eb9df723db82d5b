"""A training-loop session's model, for every family: what a worker holds while a user's program
drives it (docs/sessions.md).

The user's loop calls forward_backward / optim_step / sample ... one at a time; each call is one
method here, on plain data (numpy arrays, strings, numbers), so the worker only decodes requests
and encodes results. The steps are the family's learner's, the same code that runs recipe jobs.

`Session` is the one session model: the calls, the custom loss waiting for its gradient, saved
states. A family's session (pi05's `TrainingSession`, RT-J's `RelationalSession`) gives what only
it knows: how datums become a batch, what forward returns, its sampler, its custom losses (if any:
a family without them refuses them in its own words), and how its weights are saved.
"""

from __future__ import annotations

import json
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic

import numpy as np

from relay.optimizer import AdamParams
from relay.training.config import STATE_META_FILE as STATE_META
from relay_engine.core.learner import BatchT, Learner
from relay_engine.errors import EngineError


class Session(ABC, Generic[BatchT]):
    """A family's model, its learner and a session's calls."""

    learner: Learner[BatchT]
    # The loss forward_backward computes (a call naming another is refused).
    loss_fn: str
    # What a loaded state must share with this session, for the message that refuses one.
    same_state: str = "model"
    # A custom loss's forward pass, waiting for its gradient (backward_custom).
    _custom: Any = None

    # -- what the family gives ----------------------------------------------------------------------

    @property
    @abstractmethod
    def info(self) -> dict[str, Any]:
        """What the session reports when it is ready."""

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """What a saved state must share with the session that loads it."""

    @abstractmethod
    def batch(self, datums: Sequence[Mapping[str, Any]]) -> BatchT:
        """The session's datums as the learner's batch (EngineError naming a bad datum)."""

    def training_batch(self, datums: Sequence[Mapping[str, Any]]) -> BatchT:
        """The batch of a training call (forward_backward, forward_custom): the family may refuse
        what it does not train on, or learn from the data (pi05: the robot's action width)."""
        return self.batch(datums)

    @abstractmethod
    def forward_outputs(self, batch: BatchT) -> dict[str, np.ndarray]:
        """The family's outputs on a batch, without gradients."""

    @abstractmethod
    def save_weights(self, name: str, directory: Path) -> None:
        """The weights as they are now, in a directory the family loads (and serves from)."""

    def sample(
        self, observations: Sequence[Mapping[str, Any]], num_steps: int = 10, sampler: str | None = None
    ) -> Any:
        raise EngineError(f"{self.info['model']} sessions do not sample")

    def custom_forward(self, batch: BatchT) -> tuple[Any, dict[str, np.ndarray]]:
        """A custom loss's forward pass: what backward_custom needs, and the outputs to send."""
        raise self.no_custom_loss()

    def custom_backward(self, pending: Any, grad: np.ndarray, loss: float) -> None:
        raise self.no_custom_loss()

    def no_custom_loss(self) -> EngineError:
        return EngineError(
            f"{self.info['model']} sessions train on their built-in loss: use forward_backward"
        )

    @property
    def supports_custom_loss(self) -> bool:
        return type(self).custom_forward is not Session.custom_forward

    # -- the calls ------------------------------------------------------------------------------------

    def forward_backward(self, datums: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        self._refuse_pending_custom()
        result = self.learner.forward_backward(self.training_batch(datums))
        return {"metrics": {"loss": result.loss}, "loss_fn_outputs": [{"loss": x} for x in result.per_sample]}

    def forward(self, datums: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        return self.forward_outputs(self.batch(datums))

    def forward_custom(self, datums: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """The first half of forward_backward_custom: outputs whose graph waits for backward_custom."""
        if not self.supports_custom_loss:
            raise self.no_custom_loss()
        self._refuse_pending_custom()
        pending, outputs = self.custom_forward(self.training_batch(datums))
        self._custom = pending
        return outputs

    def backward_custom(
        self,
        grad: np.ndarray,
        loss: float,
        metrics: Mapping[str, float],
        per_datum: Sequence[Mapping[str, float]] | None = None,
    ) -> dict[str, Any]:
        if not self.supports_custom_loss:
            raise self.no_custom_loss()
        if self._custom is None:
            raise EngineError("backward_custom: no custom forward pass is waiting for its gradient")
        pending, self._custom = self._custom, None
        self.custom_backward(pending, grad, loss)
        return {"metrics": {"loss": loss, **metrics}, "loss_fn_outputs": list(per_datum or [])}

    def discard_custom(self) -> None:
        """Drop a custom forward pass still waiting for its gradient (the client's loss failed)."""
        self._custom = None

    def optim_step(self, adam: AdamParams) -> dict[str, Any]:
        self._refuse_pending_custom()
        step = self.learner.optim_step(adam)
        return {"metrics": {"grad_norm": step.grad_norm, "skipped": step.skipped}}

    def save_state(self, directory: Path) -> None:
        """The learner's state and what it belongs to, replacing an older state of that name."""
        self._refuse_pending_custom()
        write_state(directory, self.learner.save_state, self.identity())

    def load_state(self, directory: Path, name: str) -> None:
        check_state(directory, name, self.identity(), self.same_state)
        self._refuse_pending_custom()
        self.learner.load_state(directory)

    def _refuse_pending_custom(self) -> None:
        if self._custom is not None:
            self._custom = None
            raise EngineError(
                "a custom loss's forward pass is still waiting for its gradient (backward_custom)"
            )


def write_state(directory: Path, save: Callable[[Path], None], identity: dict[str, Any]) -> None:
    """A session's saved state, written by `save` beside what it belongs to (`identity`), then
    renamed into place so that it replaces an older state of that name whole or not at all."""
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save(tmp)
    (tmp / STATE_META).write_text(json.dumps(identity, indent=2))
    if directory.exists():
        shutil.rmtree(directory)
    tmp.rename(directory)


def check_state(directory: Path, name: str, identity: dict[str, Any], same: str) -> None:
    """Refuse a saved state that does not exist or belongs to a session unlike this one
    (`same` names what must match, for the message)."""
    if not (directory / STATE_META).is_file():
        raise EngineError(f"no saved state named {name!r}")
    saved = json.loads((directory / STATE_META).read_text())
    if saved != identity:
        raise EngineError(
            f"state {name!r} was saved by a session of {saved}; this session is {identity}: "
            f"load it in a session with the same {same}"
        )
