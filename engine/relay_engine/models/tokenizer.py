"""The prompt pi0.5 reads: the task and the discretized state, tokenized.

pi0.5 puts the robot state into the language tokens: each of the first `state_dim` normalized
values is cut into one of 256 bins over [-1, 1] and written as its bin number (openpi
`PaligemmaTokenizer`, lerobot `Pi05PrepareStateTokenizerProcessorStep`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from relay_engine.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

PALIGEMMA_TOKENIZER_REPO = "google/paligemma-3b-pt-224"
_STATE_BINS = np.linspace(-1.0, 1.0, 256 + 1)[:-1]


def discretize_state(state: np.ndarray) -> np.ndarray:
    """Bin numbers 0..255 of normalized state values; values below -1 give -1, as openpi's do."""
    return np.digitize(np.asarray(state, dtype=np.float64), bins=_STATE_BINS) - 1


def format_prompt(task: str, state: np.ndarray) -> str:
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    bins = " ".join(str(int(b)) for b in discretize_state(state))
    return f"Task: {cleaned}, State: {bins};\nAction: "


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, beginning with BOS."""
        ...

    def ensure_loaded(self) -> None:
        """Load now what `encode` needs, or say in one sentence where it was looked for."""
        ...

    def save_to(self, directory: Path) -> None:
        """Write what a copy of the model needs to tokenize, beside its weights (nothing if none)."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: 0 pad, 1 bos, 2 eos, byte b -> b + 3. Needs no files."""

    pad_id = 0
    bos_id = 1
    eos_id = 2
    vocab_size = 3 + 256

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *(b + 3 for b in text.encode("utf-8"))]

    def decode(self, ids: list[int]) -> str:
        return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", errors="replace")

    def ensure_loaded(self) -> None:
        """Nothing to load."""

    def save_to(self, directory: Path) -> None:
        """Nothing to write: the bytes are the vocabulary."""


# A directory of tokenizer files that takes precedence over every other place (a team that has
# the gated PaliGemma tokenizer once, on a machine that cannot reach the Hub).
TOKENIZER_DIR_ENV = "RELAY_TOKENIZER_DIR"
# Where an output keeps the tokenizer its model was trained with, beside model.safetensors.
TOKENIZER_SUBDIR = "tokenizer"


def _holds_tokenizer(directory: Path) -> bool:
    return directory.is_dir() and any(directory.glob("tokenizer*"))


class PaliGemmaTokenizer:
    """PaliGemma's SentencePiece tokenizer through transformers, loaded on first use
    (`ensure_loaded` loads it at once: a run asks before any other setup).

    Looked for, in order: the directory RELAY_TOKENIZER_DIR names; beside the weights (tokenizer
    files in the weights' directory, or in its `tokenizer/`, where Relay's outputs keep theirs);
    then on the Hub (`google/paligemma-3b-pt-224`, gated: it needs an accepted licence and a token).
    """

    def __init__(self, source: str | None = None) -> None:
        self.source = source
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def places(self) -> list[str]:
        """Where the tokenizer is looked for, in order (the Hub repo last)."""
        places = []
        named = os.environ.get(TOKENIZER_DIR_ENV)
        if named:
            places.append(named)
        if self.source:
            for directory in (Path(self.source), Path(self.source) / TOKENIZER_SUBDIR):
                if _holds_tokenizer(directory):
                    places.append(str(directory))
        places.append(PALIGEMMA_TOKENIZER_REPO)
        return places

    def _load(self) -> PreTrainedTokenizerBase:
        from transformers import AutoTokenizer

        failures = []
        for place in self.places():
            try:
                return AutoTokenizer.from_pretrained(place)
            except Exception as error:  # try the next place; say what each answered
                first_line = (str(error).strip().splitlines() or [""])[0][:200]
                failures.append(f"{place}: {type(error).__name__}: {first_line}")
        named = os.environ.get(TOKENIZER_DIR_ENV)
        beside = (
            f"beside the weights in {self.source} (no tokenizer files there or in its {TOKENIZER_SUBDIR}/)"
        )
        raise ConfigError(
            "cannot load the PaliGemma tokenizer pi05 reads its prompts with: looked in "
            + (f"{TOKENIZER_DIR_ENV}={named}, " if named else f"{TOKENIZER_DIR_ENV} (not set), ")
            + (beside + ", " if self.source else "")
            + f"and on the Hub at {PALIGEMMA_TOKENIZER_REPO}, which is gated (accept its licence on the "
            "Hub and set HF_TOKEN); put its files (tokenizer.json, tokenizer_config.json, ...) beside "
            f"the weights or name their directory with {TOKENIZER_DIR_ENV} (" + "; ".join(failures) + ")"
        )

    def ensure_loaded(self) -> None:
        if self._tokenizer is None:
            self._tokenizer = self._load()

    def save_to(self, directory: Path) -> None:
        """The tokenizer's files in `directory/tokenizer/`, so that the output samples wherever it is."""
        self.ensure_loaded()
        assert self._tokenizer is not None
        self._tokenizer.save_pretrained(str(directory / TOKENIZER_SUBDIR))

    def encode(self, text: str) -> list[int]:
        self.ensure_loaded()
        assert self._tokenizer is not None
        return list(self._tokenizer.encode(text, add_special_tokens=True))

    def __getstate__(self) -> dict:
        # DataLoader workers get the source and load their own copy.
        return {"source": self.source, "_tokenizer": None}


def make_tokenizer(kind: str, source: str | None = None) -> Tokenizer:
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "paligemma":
        return PaliGemmaTokenizer(source)
    raise ConfigError(f"unknown tokenizer {kind!r}; valid: bytes, paligemma")


def tokenize_prompts(tokenizer: Tokenizer, prompts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids (B, L) and mask, L the longest prompt rounded up to 8, at most `max_len`.

    Padding only to the batch's longest prompt changes no output (padding is masked and does not
    advance positions) and keeps sequences short.
    """
    encoded = [tokenizer.encode(p) for p in prompts]
    longest = max(len(ids) for ids in encoded)
    if longest > max_len:
        log.warning("a prompt has %d tokens; cutting it to the model's %d", longest, max_len)
    length = min(max_len, -(-longest // 8) * 8)
    ids = np.zeros((len(prompts), length), dtype=np.int64)
    mask = np.zeros((len(prompts), length), dtype=bool)
    for row, tokens in enumerate(encoded):
        tokens = tokens[:length]
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = True
    return ids, mask
