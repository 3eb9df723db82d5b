"""pi0.5, the robot policy: its learner, session, evaluation, output and library trainer.
Importing the package registers the family."""

from relay_engine.families import register_family
from relay_engine.families.pi05.family import Pi05Family

register_family(Pi05Family())
