"""RT-J, the relational transformer: the model, its checkpoints, the trainer, and the way from a
relational database to labelled contexts."""
