"""Test doubles for retrieval tests."""

from __future__ import annotations

import numpy as np

from tether.rag.text import simple_tokens


class BagEmbedder:
    """A deterministic stand-in embedder: hashed bag of simple tokens, L2-normalised. Counts its
    calls and the texts it embedded (to prove an index was reopened without re-embedding)."""

    name = "bag-64"
    dim = 64

    def __init__(self) -> None:
        self.calls = 0
        self.texts = 0

    def embed(self, texts):
        self.calls += 1
        self.texts += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for tok in simple_tokens(t):
                out[i, sum(map(ord, tok)) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1)
