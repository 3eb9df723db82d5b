"""The prompt pi0.5 reads: the task and the discretized state, tokenized.

pi0.5 puts the robot state into the language tokens: each of the first `state_dim` normalized
values is cut into one of 256 bins over [-1, 1] and written as its bin number (openpi
`PaligemmaTokenizer`, lerobot `Pi05PrepareStateTokenizerProcessorStep`).
"""

from __future__ import annotations

import logging
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


class PaliGemmaTokenizer:
    """PaliGemma's SentencePiece tokenizer through transformers, loaded on first use.

    Looked for beside the weights first (a directory holding tokenizer files), then on the Hub
    (`google/paligemma-3b-pt-224`, which needs an accepted licence and a token).
    """

    def __init__(self, source: str | None = None) -> None:
        self.source = source
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def _load(self) -> PreTrainedTokenizerBase:
        from transformers import AutoTokenizer

        candidates = []
        if self.source and Path(self.source).is_dir() and any(Path(self.source).glob("tokenizer*")):
            candidates.append(self.source)
        candidates.append(PALIGEMMA_TOKENIZER_REPO)
        errors = []
        for candidate in candidates:
            try:
                return AutoTokenizer.from_pretrained(candidate)
            except Exception as error:  # try the next place; report all
                errors.append(f"{candidate}: {error}")
        raise ConfigError("cannot load the PaliGemma tokenizer: " + "; ".join(errors))

    def encode(self, text: str) -> list[int]:
        tokenizer = self._tokenizer
        if tokenizer is None:
            tokenizer = self._tokenizer = self._load()
        return list(tokenizer.encode(text, add_special_tokens=True))

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
