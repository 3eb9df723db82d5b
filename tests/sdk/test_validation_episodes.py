"""validation_episodes: its three forms and their rules (SFTConfig, the one definition), the
held-out choice once the dataset's episodes are known, the validation event and its line."""

from __future__ import annotations

import json
import re

import pytest

from relay.episodes import (
    VALIDATION_EPISODES_SCHEMA,
    episode_ranges,
    held_out_episodes,
    parse_episodes,
)
from relay.errors import ConfigError
from relay.events import ValidationEvent, event_line, headline_action_error, parse_event, validation_line
from relay.sft.config import SFTConfig

BASE = {"model": "pi05-tiny", "dataset_name": "./dots"}


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ([3, 17, 42], [3, 17, 42]),
        ([2.0], [2]),  # JSON has one kind of number
        (range(40, 43), [40, 41, 42]),
        ("40-49", "40-49"),
        (" 0 - 9 , 45 ", "0-9,45"),  # kept without the spaces
        ("7", "7"),
        (0.1, 0.1),
        ("0.25", 0.25),  # a fraction written as text: the console's form and the CLI send text
        (".5", 0.5),
        (None, None),
    ],
)
def test_the_three_forms_are_kept_as_given(given: object, kept: object) -> None:
    config = SFTConfig(**BASE, validation_episodes=given)
    assert config.validation_episodes == kept and type(config.validation_episodes) is type(kept)
    # Read back from the stored job (the API's JSON), it is the same config.
    assert SFTConfig.parse(json.loads(config.model_dump_json())).validation_episodes == kept


def test_it_is_none_by_default() -> None:
    assert SFTConfig(**BASE).validation_episodes is None


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ([], "an empty list holds out nothing"),
        ([3, 3], "episode 3 is named twice"),
        ([-1], "-1 is not an episode index"),
        ([0.5], "0.5 is not an episode index"),
        ([True], "true is not an episode index"),
        (5, 'a lone number is ambiguous: write [5] or "5" for episode 5'),
        (0.0, "a fraction of the episodes must be more than 0 and less than 1"),
        (1.0, "a fraction of the episodes must be more than 0 and less than 1"),
        (1.5, "a fraction of the episodes must be more than 0 and less than 1"),
        (float("nan"), "a fraction of the episodes must be more than 0 and less than 1"),
        ("9-0", "the range 9-0 runs backwards: write it 0-9"),
        ("0-9,5", "episode 5 is named twice"),
        ("0.0", "must be the episodes to hold out"),
        ("first ten", "must be the episodes to hold out"),
        (True, "must be the episodes to hold out"),
        ({"start": 0, "stop": 9}, "must be the episodes to hold out"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field_value_and_rule(given: object, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SFTConfig(**BASE, validation_episodes=given)
    assert caught.value.param == "validation_episodes"
    assert str(caught.value).startswith("bad validation_episodes: ")
    assert why in str(caught.value)


def test_rt_j_models_refuse_it() -> None:
    with pytest.raises(ConfigError, match="rt-j-tiny takes no validation_episodes") as caught:
        SFTConfig(model="rt-j-tiny", dataset_name="./shop", task="churn", validation_episodes=0.1)
    assert caught.value.param == "validation_episodes"


def test_the_schema_says_what_the_config_accepts() -> None:
    schema = SFTConfig.model_json_schema()["properties"]["validation_episodes"]
    assert {k: v for k, v in schema.items() if k in VALIDATION_EPISODES_SCHEMA} == VALIDATION_EPISODES_SCHEMA
    text, fraction, listed, _ = VALIDATION_EPISODES_SCHEMA["anyOf"]
    # A text matches the pattern exactly when the config reads it (but for what no pattern says:
    # a range's order, an episode named twice).
    for good in ("40-49", " 0 - 9 , 45", "7", "0.25", ".5"):
        assert re.search(text["pattern"], good), good
        SFTConfig(**BASE, validation_episodes=good)
    for bad in ("0.0", "1.0", "first ten", "-3", "3-", ""):
        assert not re.search(text["pattern"], bad), bad
        with pytest.raises(ConfigError):
            SFTConfig(**BASE, validation_episodes=bad)
    assert fraction == {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}
    assert listed["uniqueItems"] and listed["minItems"] == 1 and listed["items"]["minimum"] == 0


def test_an_episodes_text_reads_as_the_cli_reads_episodes() -> None:
    assert parse_episodes("0-2,7") == [0, 1, 2, 7]
    assert episode_ranges("40-49") == [(40, 49)]
    with pytest.raises(ValueError, match="runs backwards"):
        parse_episodes("3-1")


def test_a_fraction_holds_out_the_same_episodes_for_the_same_seed() -> None:
    episodes = list(range(50))
    first = held_out_episodes(0.1, episodes, seed=0)
    assert first == held_out_episodes(0.1, episodes, seed=0)
    assert len(first) == 5 and first == sorted(first) and set(first) <= set(episodes)
    assert held_out_episodes(0.1, episodes, seed=1) != first
    # At least one; of the training episodes when the run is limited to some.
    assert len(held_out_episodes(0.01, episodes, seed=0)) == 1
    assert set(held_out_episodes(0.5, episodes, seed=0, training=range(10))) <= set(range(10))


def test_named_episodes_must_be_the_datasets_and_leave_some_to_train_on() -> None:
    episodes = list(range(20))
    assert held_out_episodes("3-5", episodes, seed=0) == [3, 4, 5]
    assert held_out_episodes([19, 2], episodes, seed=0) == [2, 19]
    # Outside a run's --episodes: held out of nothing it trains on, still scored.
    assert held_out_episodes([19], episodes, seed=0, training=range(10)) == [19]
    refusals = {
        "18-21": "the dataset has no episode 20; its episodes are 0 to 19",
        "0-19": "it holds out every one of the 20 training episodes",
        0.99: "of 20 training episodes it holds out 20, and leaves none to train on",
    }
    for spec, message in refusals.items():
        with pytest.raises(ConfigError, match=re.escape(message)) as caught:
            held_out_episodes(spec, episodes, seed=0)
        assert caught.value.param == "validation_episodes"
        assert str(caught.value).startswith("bad validation_episodes: ")
    with pytest.raises(ConfigError, match="no episode 25; its episodes are 3 episodes from 0 to 30"):
        held_out_episodes([25], [0, 10, 30], seed=0)


def test_a_validation_event_is_typed_and_says_itself_in_one_line() -> None:
    event = ValidationEvent(
        step=40,
        validation_loss=0.104,
        mean_action_mse=0.01,
        action_spread=0.0023,
        action_mse=0.0123,
        blind_mse=0.0281,
        chunks=4,
        frames=48,
        episodes=4,
        seconds=0.5,
    )
    assert event["event"] == "validation" and event.mean_action_mse == 0.01
    assert "loss" not in event  # a metrics event is the one with a `loss`
    assert parse_event(json.loads(event_line(event))) == event
    # The headline, and the ratio, are the mean of the chunks'; one chunk's and the spread beside.
    assert event.describe() == (
        "action error 0.01 (mean of 4 chunks) vs blind 0.0281 (2.81x better), one chunk 0.0123, "
        "spread 0.0023, validation loss 0.104, 48 frames of 4 episodes"
    )
    assert headline_action_error(event) == 0.01
    worse = {"mean_action_mse": 0.04, "action_mse": 0.05, "blind_mse": 0.02, "chunks": 4, "frames": 1}
    assert validation_line(worse).startswith(
        "action error 0.04 (mean of 4 chunks) vs blind 0.02 (2.00x worse)"
    )


def test_a_validation_event_stored_before_the_mean_of_chunks_still_reads() -> None:
    # A row written before mean_action_mse, action_spread and chunks: its one chunk's error is the
    # only one it has, so it stands as the headline, and the line says it is one chunk's.
    stored = {
        "step": 40,
        "event": "validation",
        "validation_loss": 0.104,
        "action_mse": 0.0123,
        "blind_mse": 0.0281,
        "frames": 48,
        "episodes": 4,
        "seconds": 0.5,
    }
    event = parse_event(stored)
    assert isinstance(event, ValidationEvent)
    assert event.mean_action_mse is None and event.action_spread is None and event.chunks is None
    assert headline_action_error(event) == 0.0123
    assert event.describe() == (
        "action error 0.0123 (one chunk) vs blind 0.0281 (2.28x better), validation loss 0.104, "
        "48 frames of 4 episodes"
    )


def test_relay_fine_tunes_create_checks_the_option_before_asking_the_server() -> None:
    from typer.testing import CliRunner

    from relay.cli import app

    env = {"RELAY_BASE_URL": "http://127.0.0.1:9", "RELAY_API_KEY": "relay-unused"}  # never reached
    args = ["fine-tunes", "create", "--model", "pi05-tiny", "--dataset", "x", "--validation-episodes"]
    refused = CliRunner().invoke(app, [*args, "0-9,5"], env=env)
    assert refused.exit_code == 2
    assert 'error: bad validation_episodes: "0-9,5" (episode 5 is named twice' in refused.output
