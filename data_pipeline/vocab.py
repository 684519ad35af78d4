"""Frequency-thresholded vocabularies: raw ids -> contiguous ids.

Contiguous ids: 0 = missing (raw id 0, the missing-value convention), 1 = rare or unseen id,
``2 + k`` = the k-th kept id in increasing raw-id order. Kept: raw ids seen at least
``min_count`` times in the training files (never validation or test).
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["VocabCounter", "apply_vocab", "save_vocab", "load_vocab"]


class VocabCounter:
    """Streaming id counts per table with bounded pending memory (merged every ``merge_rows`` entries)."""

    def __init__(self, num_tables: int, merge_rows: int = 8 << 20) -> None:
        self.merge_rows = merge_rows
        self._ids: List[List[np.ndarray]] = [[] for _ in range(num_tables)]
        self._counts: List[List[np.ndarray]] = [[] for _ in range(num_tables)]
        self._pending = [0] * num_tables

    def add(self, uniq: Sequence[Tuple[np.ndarray, np.ndarray]]) -> None:
        """Add one block's (unique ids, counts) of every table."""
        for t, (ids, counts) in enumerate(uniq):
            self._ids[t].append(ids)
            self._counts[t].append(counts.astype(np.int64))
            self._pending[t] += len(ids)
            if self._pending[t] > self.merge_rows and len(self._ids[t]) > 1:
                self._merge(t)

    def _merge(self, t: int) -> None:
        ids = np.concatenate(self._ids[t])
        counts = np.concatenate(self._counts[t])
        order = np.argsort(ids, kind="stable")
        ids, counts = ids[order], counts[order]
        starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
        self._ids[t] = [ids[starts]]
        self._counts[t] = [np.add.reduceat(counts, starts) if len(ids) else counts]
        self._pending[t] = len(starts)

    def finish(self, min_count: int) -> List[np.ndarray]:
        """Sorted kept raw ids of every table (raw id 0 is never kept: it is the missing value)."""
        out = []
        for t in range(len(self._ids)):
            if not self._ids[t]:
                out.append(np.zeros(0, np.int64))
                continue
            self._merge(t)
            ids, counts = self._ids[t][0], self._counts[t][0]
            out.append(ids[(counts >= min_count) & (ids != 0)].astype(np.int64))
        return out


def apply_vocab(vocab: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Contiguous ids (n,) int64 of raw ids (n,) through a sorted vocabulary."""
    if len(vocab) == 0:
        return np.where(ids == 0, 0, 1).astype(np.int64)
    pos = np.searchsorted(vocab, ids)
    np.minimum(pos, len(vocab) - 1, out=pos)
    found = vocab[pos] == ids
    return np.where(ids == 0, 0, np.where(found, pos + 2, 1)).astype(np.int64)


def save_vocab(directory: str, vocabs: Sequence[np.ndarray]) -> None:
    os.makedirs(directory, exist_ok=True)
    for t, v in enumerate(vocabs):
        np.save(os.path.join(directory, f"cat_{t}.npy"), v)


def load_vocab(directory: Optional[str], num_tables: int) -> List[np.ndarray]:
    assert directory is not None
    return [np.load(os.path.join(directory, f"cat_{t}.npy"), mmap_mode="r") for t in range(num_tables)]
