"""SmolVLA, lerobot's small robot policy: its network, processing, learner and lerobot's files.
Importing the package registers the family."""

from relay_engine.families import register_family
from relay_engine.families.smolvla.family import SmolVLAFamily

register_family(SmolVLAFamily())
