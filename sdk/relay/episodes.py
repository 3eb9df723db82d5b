"""Which episodes of a dataset: the text that names them (``"0-39,45"``, the CLI's ``--episodes``),
a recipe's ``validation_episodes`` (a list, that text, or a fraction) and how the held-out
episodes are chosen once the dataset's episodes are known.

Pure Python and numpy: SFTConfig checks the form when a job is created (the SDK, the API), the
engine resolves it against the dataset it opened (docs/evaluation.md, "Validation during training").
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from relay.errors import ConfigError

FIELD = "validation_episodes"
# Episode indices are whole numbers of at most 9 digits; a text of at most 1,000 characters; a
# list of at most 100,000 (a fraction is the way to hold out more).
EPISODE_DIGITS = 9
EPISODES_TEXT_MAX = 1000
EPISODES_LIST_MAX = 100_000
_NUMBER = rf"\d{{1,{EPISODE_DIGITS}}}"
_PART = rf"{_NUMBER}(\s*-\s*{_NUMBER})?"
# "40-49", "0-9,45": episode numbers and inclusive ranges, separated by commas.
EPISODES_TEXT_PATTERN = rf"^\s*{_PART}(\s*,\s*{_PART})*\s*$"
# A fraction written as text ("0.1", ".25"): more than 0 and less than 1.
FRACTION_TEXT_PATTERN = r"^\s*0?\.0*[1-9]\d*\s*$"
EPISODES_TEXT_RULE = 'episode numbers and inclusive ranges separated by commas, such as "40-49" or "0-9,45"'
VALIDATION_EPISODES_RULE = (
    "must be the episodes to hold out of training for validation: a list of episode indices such as "
    f"[3, 7], a text of {EPISODES_TEXT_RULE}, or a fraction of the episodes between 0 and 1 such as "
    "0.1 (chosen from the run's seed); each episode once"
)
# Mixed into the run's seed, so that the held-out choice draws from a generator of its own.
_CHOICE_STREAM = 0x5E1EC7

# What SFTConfig's JSON Schema says of the field: exactly what validation_episodes_value accepts,
# except what no schema states (a range's order, an episode named twice in a text).
VALIDATION_EPISODES_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "string",
            "maxLength": EPISODES_TEXT_MAX,
            "pattern": f"({EPISODES_TEXT_PATTERN})|({FRACTION_TEXT_PATTERN})",
        },
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 10**EPISODE_DIGITS - 1},
            "minItems": 1,
            "maxItems": EPISODES_LIST_MAX,
            "uniqueItems": True,
        },
        {"type": "null"},
    ]
}


def episode_ranges(text: str) -> list[tuple[int, int]]:
    """The inclusive ranges of an episodes text, in its order: ``"0-9,45"`` -> [(0, 9), (45, 45)].

    ValueError (saying the rule) for a text of another shape, a range that runs backwards, or an
    episode named twice."""
    if len(text) > EPISODES_TEXT_MAX or not re.fullmatch(EPISODES_TEXT_PATTERN, text):
        raise ValueError(f"give {EPISODES_TEXT_RULE}")
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        start = int(first)
        stop = int(last) if last.strip() else start
        if stop < start:
            raise ValueError(f"the range {start}-{stop} runs backwards: write it {stop}-{start}")
        ranges.append((start, stop))
    ordered = sorted(ranges)
    for (_, stop), (start, _) in itertools.pairwise(ordered):
        if start <= stop:
            raise ValueError(f"episode {start} is named twice: name each episode once")
    return ranges


def parse_episodes(text: str) -> list[int]:
    """An episodes text as the episodes it names, in its order: ``"0-2,7"`` -> [0, 1, 2, 7]."""
    return [episode for start, stop in episode_ranges(text) for episode in range(start, stop + 1)]


def _canonical_text(ranges: Iterable[tuple[int, int]]) -> str:
    return ",".join(str(start) if start == stop else f"{start}-{stop}" for start, stop in ranges)


def validation_episodes_value(value: Any) -> list[int] | float | str | None:
    """A validation_episodes as SFTConfig keeps it: a list of episode indices, a fraction, an
    episodes text (spaces taken out), or None. A Python ``range`` becomes its list, a fraction
    written as text its number. ValueError (saying what is wrong) for anything else."""
    if value is None:
        return None
    if isinstance(value, range):
        value = list(value)
    if isinstance(value, str):
        if re.fullmatch(FRACTION_TEXT_PATTERN, value):
            return float(value)
        if len(value) > EPISODES_TEXT_MAX or not re.fullmatch(EPISODES_TEXT_PATTERN, value):
            raise ValueError(VALIDATION_EPISODES_RULE)
        return _canonical_text(episode_ranges(value))  # its ValueError says what is wrong
    if isinstance(value, int) and not isinstance(value, bool):
        # One number is either an episode or a count of them: say which.
        raise ValueError(
            f'a lone number is ambiguous: write [{value}] or "{value}" for episode {value}, or a '
            "fraction between 0 and 1 such as 0.1"
        )
    if isinstance(value, float):
        if not (math.isfinite(value) and 0 < value < 1):
            raise ValueError("a fraction of the episodes must be more than 0 and less than 1")
        return value
    if isinstance(value, list | tuple):
        return _episode_list(value)
    raise ValueError(VALIDATION_EPISODES_RULE)


def _episode_list(values: Sequence[Any]) -> list[int]:
    if not values:
        raise ValueError("an empty list holds out nothing: leave the field out for no validation split")
    if len(values) > EPISODES_LIST_MAX:
        raise ValueError(f"a list names at most {EPISODES_LIST_MAX:,} episodes: give a range or a fraction")
    episodes: list[int] = []
    for item in values:
        whole = isinstance(item, float) and item.is_integer()  # JSON has one kind of number
        if isinstance(item, bool) or not (isinstance(item, int) or whole):
            raise ValueError(f"{_json(item)} is not an episode index: indices are whole numbers from 0")
        episode = int(item)
        if not 0 <= episode < 10**EPISODE_DIGITS:
            raise ValueError(
                f"{episode} is not an episode index: indices are whole numbers from 0, of at most "
                f"{EPISODE_DIGITS} digits"
            )
        episodes.append(episode)
    seen: set[int] = set()
    for episode in episodes:
        if episode in seen:
            raise ValueError(f"episode {episode} is named twice: name each episode once")
        seen.add(episode)
    return episodes


def _json(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def held_out_episodes(
    spec: list[int] | float | str,
    dataset_episodes: Sequence[int] | np.ndarray,
    seed: int,
    training: Sequence[int] | np.ndarray | None = None,
) -> list[int]:
    """The episodes a validation_episodes holds out of training, ascending.

    `dataset_episodes`: the dataset's episode indices; `training`: those the run would train on
    without a validation split (by default all of them). Named episodes must be the dataset's; a
    fraction takes round(fraction x training episodes) of the training episodes (at least 1), drawn
    from `seed`, so the same seed holds out the same episodes. At least one training episode must
    be left. ConfigError naming the field otherwise."""
    episodes = np.unique(np.asarray(dataset_episodes, dtype=np.int64))
    pool = episodes if training is None else np.unique(np.asarray(training, dtype=np.int64))
    if isinstance(spec, float):
        count = max(1, round(spec * len(pool)))
        if count >= len(pool):
            raise ConfigError(
                f"bad {FIELD}: {spec} (of {len(pool)} training episodes it holds out {count}, and leaves "
                "none to train on)",
                FIELD,
                "invalid_value",
            )
        rng = np.random.default_rng([seed, _CHOICE_STREAM])
        chosen = rng.choice(len(pool), size=count, replace=False)
        return sorted(int(e) for e in pool[chosen])
    ranges = [(e, e) for e in spec] if isinstance(spec, list) else episode_ranges(spec)
    held: list[int] = []
    for start, stop in ranges:
        inside = episodes[(episodes >= start) & (episodes <= stop)]
        if len(inside) != stop - start + 1:
            missing = _first_missing(inside, start, stop)
            raise ConfigError(
                f"bad {FIELD}: {_shown(spec)} (the dataset has no episode {missing}; its episodes are "
                f"{_span(episodes)})",
                FIELD,
                "invalid_value",
            )
        held.extend(int(e) for e in inside)
    if np.isin(pool, held).all():
        raise ConfigError(
            f"bad {FIELD}: {_shown(spec)} (it holds out every one of the {len(pool)} training episodes, "
            "and leaves none to train on)",
            FIELD,
            "invalid_value",
        )
    return sorted(held)


def _first_missing(inside: np.ndarray, start: int, stop: int) -> int:
    expected = np.arange(start, start + len(inside))
    gaps = np.nonzero(inside != expected)[0]
    return int(expected[gaps[0]]) if len(gaps) else start + len(inside)


def _span(episodes: np.ndarray) -> str:
    if len(episodes) == 0:
        return "none"
    contiguous = int(episodes[-1]) - int(episodes[0]) + 1 == len(episodes)
    ends = f"{int(episodes[0])} to {int(episodes[-1])}"
    return ends if contiguous else f"{len(episodes)} episodes from {ends}"


def _shown(spec: list[int] | str) -> str:
    if isinstance(spec, str):
        return f'"{spec}"'
    text = str(spec)
    return text if len(text) <= 80 else text[:77] + "..."
