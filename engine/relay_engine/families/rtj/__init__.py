"""RT-J, the relational transformer: the model, its checkpoints, the trainer, and the way from a
relational database to labelled contexts. Importing the package registers the family."""

from relay_engine.families import register_family
from relay_engine.families.rtj.family import RelationalFamily

register_family(RelationalFamily())
