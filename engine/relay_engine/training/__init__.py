"""The training engine: the step (learner), the loop, checkpoints, the local trainer, evaluation."""
