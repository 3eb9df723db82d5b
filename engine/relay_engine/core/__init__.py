"""What every model family shares: the learner interface and optimizer step, the loop, checkpoints,
the schedule, the batch order and data position."""
