"""Where pi05's PaliGemma tokenizer is found (RELAY_TOKENIZER_DIR, beside the weights, the gated Hub
repo), asked before a run's other setup, and kept in the output so that it samples anywhere. The
tokenizer here is one this test builds, in the format the real one is saved in (tokenizer.json and
tokenizer_config.json, read by transformers' AutoTokenizer)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from relay.sft.config import SFTConfig
from relay_engine.errors import ConfigError
from relay_engine.models import load_policy
from relay_engine.models.tokenizer import TOKENIZER_DIR_ENV, PaliGemmaTokenizer
from relay_engine.recipe import Recipe, run_recipe

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer of a few words (fewer ids than pi05-tiny's vocabulary), BOS first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "Task:": 4, "State:": 5, "Action:": 6}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(str(directory))
    return directory


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Hub, an empty Hub cache, no tokenizer directory named."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv(TOKENIZER_DIR_ENV, raising=False)


@pytest.fixture
def paligemma_checkpoint(tmp_path: Path) -> Path:
    """pi05-tiny's weights saved as a model that reads its prompts with the PaliGemma tokenizer."""
    policy = load_policy("pi05-tiny")
    policy.config = policy.config.replace(tokenizer="paligemma")
    directory = tmp_path / "checkpoint"
    policy.save_pretrained(directory)
    return directory


def recipe(dataset: str, checkpoint: Path) -> Recipe:
    config = SFTConfig(
        model="pi05-tiny", dataset_name=dataset, from_checkpoint=str(checkpoint), batch_size=4, steps=2
    )
    return Recipe.from_config(config, checkpoint_every=1000, num_workers=0)


def run(recipe: Recipe, work_dir: Path, cache: Path) -> Any:
    return run_recipe(
        recipe, work_dir, on_event=lambda e: None, should_stop=lambda: False, dataset_cache_dir=cache
    )


@pytest.mark.usefixtures("offline")
def test_a_missing_tokenizer_is_one_sentence_before_any_other_setup(
    paligemma_checkpoint: Path, tmp_path: Path, dataset_cache: Path
) -> None:
    """The dataset named does not exist: the tokenizer is asked first, so its absence is what is said."""
    with pytest.raises(ConfigError) as refused:
        run(recipe(str(tmp_path / "no-dataset-here"), paligemma_checkpoint), tmp_path / "run", dataset_cache)
    message = str(refused.value)
    assert message.startswith("cannot load the PaliGemma tokenizer pi05 reads its prompts with: looked in ")
    assert f"{TOKENIZER_DIR_ENV} (not set)" in message
    assert f"beside the weights in {paligemma_checkpoint}" in message
    assert "google/paligemma-3b-pt-224, which is gated" in message and "HF_TOKEN" in message
    assert "\n" not in message and "no-dataset-here" not in message


@pytest.mark.usefixtures("offline")
def test_a_tokenizer_directory_trains_and_the_output_keeps_it(
    paligemma_checkpoint: Path,
    synthetic_dataset_path: Path,
    tmp_path: Path,
    dataset_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "paligemma-tokenizer")
    monkeypatch.setenv(TOKENIZER_DIR_ENV, str(tokenizer_dir))
    result = run(recipe(str(synthetic_dataset_path), paligemma_checkpoint), tmp_path / "run", dataset_cache)
    assert result.status == "completed"
    output = Path(result.output_dir)
    assert (output / "tokenizer" / "tokenizer.json").is_file()
    # Elsewhere, offline, with no directory named: the output's own copy is found.
    monkeypatch.delenv(TOKENIZER_DIR_ENV)
    moved = tmp_path / "copied-output"
    shutil.copytree(output, moved)
    tokenizer = load_policy(str(moved)).tokenizer
    assert isinstance(tokenizer, PaliGemmaTokenizer)
    assert tokenizer.encode("Task: State: Action:") == [2, 4, 5, 6]


@pytest.mark.usefixtures("offline")
def test_tokenizer_files_beside_the_weights_are_found(paligemma_checkpoint: Path, tmp_path: Path) -> None:
    write_tokenizer(paligemma_checkpoint)
    tokenizer = load_policy(str(paligemma_checkpoint)).tokenizer
    tokenizer.ensure_loaded()
    assert tokenizer.encode("Task: go") == [2, 4, 3]
