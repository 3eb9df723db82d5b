"""SFTConfig for the two families: rt-j needs a task and refuses what only pi05 has, pi05 refuses
a task; each refusal names the field and the rule."""

from __future__ import annotations

import re

import pytest

from relay import families
from relay.dataset_names import (
    DATASET_NAME_PATTERN,
    MALFORMED_URL_RULE,
    is_database_url,
    is_hub_repo_id,
    local_dataset_path,
    names_local_directory,
    redacted_url,
)
from relay.errors import ConfigError
from relay.sft.config import SFTConfig


def test_an_rt_j_recipe_is_tuned_in_full() -> None:
    config = SFTConfig(model="rt-j", dataset_name="/data/shop", task="user-churn")
    assert config.finetune == "full" and config.targets == ["all"] and config.task == "user-churn"
    # What a job stores and the SDK sends back reads the same.
    assert SFTConfig.parse(config.model_dump(mode="json")) == config


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"model": "rt-j"}, "task", "missing task (required for rt-j"),
        ({"model": "rt-j", "task": "t", "cameras": {"base_0_rgb": "x"}}, "cameras", "takes no cameras"),
        ({"model": "rt-j-tiny", "task": "t", "finetune": "lora"}, "finetune", 'must be "full"'),
        ({"model": "rt-j", "task": "t", "targets": ["vision"]}, "targets", "every weight trains"),
        ({"model": "pi05", "task": "t"}, "task", "pi05 takes no task"),
        ({"model": "rt-j", "task": "t", "gpus": 2}, "gpus", "one process"),
        ({"model": "rt-j", "task": "bad\ntask"}, "task", "no control characters"),
        ({"model": "rt-x", "task": "t"}, "model", "pi05, pi05-tiny, smolvla, smolvla-tiny, rt-j, rt-j-tiny"),
    ],
)
def test_fields_of_the_other_family_are_refused(fields: dict[str, object], param: str, words: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SFTConfig(dataset_name="/data/shop", **fields)
    assert raised.value.param == param and words in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///shop.db",
        "sqlite:////abs/path/shop.db",
        "postgresql://relay:pw@db.internal:5432/shop",
        "postgresql+psycopg://db/shop",
        "mysql+pymysql://relay@db/shop",
    ],
)
def test_a_database_url_is_rt_j_data(url: str) -> None:
    assert is_database_url(url) and re.fullmatch(DATASET_NAME_PATTERN, url)
    assert not is_hub_repo_id(url) and local_dataset_path(url) is None
    # A SQLite file is read from the training machine's disk, as a directory is; a server is not.
    assert names_local_directory(url) == url.startswith("sqlite:")
    spec = families.family_of_data(url)
    assert spec is not None and spec.name == families.RTJ
    assert SFTConfig(model="rt-j", dataset_name=url, task="t").dataset_name == url


@pytest.mark.parametrize(
    "name",
    ["lerobot/pusht_image", "/data/shop", "./shop", "file:///data/shop", "postgres://h/db", "ftp://h/x"],
)
def test_other_names_are_no_database_urls(name: str) -> None:
    assert not is_database_url(name)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://relay:pw0rd@h/db", "postgresql://relay:***@h/db"),
        ("postgresql://relay:p%40ss@h/db", "postgresql://relay:***@h/db"),
        ("postgresql://relay:p@ss@h/db", "postgresql://relay:***@h/db"),  # an unescaped @
        (
            "postgresql://h/db?password=pw0rd&sslmode=require",
            "postgresql://h/db?password=%2A%2A%2A&sslmode=require",
        ),
        ("sqlite:///shop.db", "sqlite:///shop.db"),
    ],
)
def test_a_shown_url_hides_its_password(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


def test_tasks_dir_is_rt_j_s() -> None:
    config = SFTConfig(model="rt-j", dataset_name="sqlite:///shop.db", task="t", tasks_dir="/data/tasks")
    assert SFTConfig.parse(config.model_dump(mode="json")).tasks_dir == "/data/tasks"
    with pytest.raises(ConfigError) as raised:
        SFTConfig(model="pi05", dataset_name="lerobot/pusht_image", tasks_dir="/data/tasks")
    assert raised.value.param == "tasks_dir" and "pi05 takes no tasks_dir" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        SFTConfig(model="rt-j", dataset_name="/data/shop", task="t", tasks_dir="bad\ndir")
    assert raised.value.param == "tasks_dir" and "no control characters" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        SFTConfig(model="pi05", dataset_name="sqlite:///shop.db")
    assert raised.value.param == "dataset_name" and "a database URL or RelBench name is read by rt-j" in str(
        raised.value
    )
    # The JSON Schema states the refusal too, so the API's OpenAPI document refuses what it refuses.
    rules = SFTConfig.model_json_schema()["allOf"]
    assert any(
        rule["then"].get("properties", {}).get("tasks_dir") == {"type": "null"}
        and "pi05" in rule["if"]["properties"]["model"]["enum"]
        for rule in rules
    )


@pytest.mark.parametrize(
    "name",
    [
        "postgresql://relay:Hunter2pw@db/" + "x" * 1100,  # too long
        "postgresql://relay:Hunter2pw@db/shop\n",  # a control character
        "postgresql://relay:Hunter2pw@ss@db/shop\n",  # and an unescaped @
        "postgresql://db/shop?sslmode=require&password=Hunter2pw\n",
    ],
)
def test_a_refused_dataset_name_never_shows_its_password(name: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SFTConfig(model="rt-j", dataset_name=name, task="t")
    assert raised.value.param == "dataset_name" and "Hunter2pw" not in str(raised.value)
    # Shown masked, or (a URL that does not parse) not shown at all.
    assert "***" in str(raised.value) or MALFORMED_URL_RULE in str(raised.value)


@pytest.mark.parametrize(
    "name",
    [
        "postgresql://ana:Hunter2pw@[::1/shop",  # an IPv6 host's bracket left open
        "postgresql://ana:Hunter2pw@db:port/shop",  # a port that is no number
        "postgresql://ana:Hunter2pw@db:0/shop",  # a port out of range
        "postgresql://ana:Hunter2pw@d b/shop",  # a space in the host
        "postgres://ana:Hunter2pw@db/shop",  # a backend SQLAlchemy does not know
        "https://ana:Hunter2pw@huggingface.co/datasets/x",
        "ana:Hunter2pw@db/shop",
    ],
)
def test_a_url_that_does_not_parse_is_refused_without_being_shown(name: str) -> None:
    for fields in ({"model": "rt-j", "task": "t"}, {"model": "pi05"}):
        with pytest.raises(ConfigError) as raised:
            SFTConfig(dataset_name=name, **fields)  # type: ignore[arg-type]
        assert raised.value.param == "dataset_name" and MALFORMED_URL_RULE in str(raised.value)
        assert "Hunter2pw" not in str(raised.value) and "ana" not in str(raised.value)
