"""Text to vectors for RT-J's text channel and column names.

RT-J reads text through a frozen sentence-embedding model (all-MiniLM-L12-v2, 384 numbers). When
`sentence-transformers` and that model are on this machine, Relay uses them; otherwise a seeded
stand-in: each distinct string maps to a fixed random unit vector (from a hash of the text), so
equal strings get equal vectors and the same run gives the same numbers everywhere. The stand-in
carries identity, not meaning; the name of the encoder used goes into the saved model's config.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np

SENTENCE_MODEL = "sentence-transformers/all-MiniLM-L12-v2"


class TextEmbedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class HashEmbedder:
    """A fixed random unit vector per distinct string, seeded by the string's SHA-256."""

    def __init__(self, dim: int, seed: int = 0) -> None:
        self.dim = dim
        self.seed = seed
        self.name = f"hash-{dim}-seed{seed}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            digest = hashlib.sha256(f"{self.seed}\x00{text}".encode()).digest()
            rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            vector = rng.standard_normal(self.dim)
            out[i] = vector / np.linalg.norm(vector)
        return out


class SentenceEmbedder:
    """all-MiniLM-L12-v2 through sentence-transformers, from the local cache only."""

    def __init__(self) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(SENTENCE_MODEL, device="cpu", local_files_only=True)
        self.dim = int(self.model.get_sentence_embedding_dimension() or 384)
        self.name = SENTENCE_MODEL

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(vectors, dtype=np.float32)


def default_text_embedder(dim: int, *, seed: int = 0, prefer: str = "auto") -> TextEmbedder:
    """The sentence model if allowed, installed and `dim` wide; else the stand-in."""
    if prefer != "hash":
        try:
            embedder = SentenceEmbedder()
        except Exception:  # not installed, or the model is not cached here: the stand-in
            embedder = None
        if embedder is not None and embedder.dim == dim:
            return embedder
    return HashEmbedder(dim, seed)
