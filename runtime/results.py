"""Result rows of a classifier: the top-k scores with labels and probabilities (shared by the
one-input and many-input ``infer``)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _probabilities(row: np.ndarray) -> np.ndarray:
    """``row`` itself when it already is a distribution, else its softmax (float64)."""
    v = row.astype(np.float64)
    finite = v[np.isfinite(v)]
    if finite.size == v.size and v.min() >= 0 and abs(v.sum() - 1) < 1e-3:
        return v
    if finite.size == 0:
        return np.full_like(v, np.nan)
    e = np.exp(np.where(np.isfinite(v), v, -np.inf) - finite.max())
    return e / e.sum()


def top_k_of(row: np.ndarray, k: int, labels: Sequence[str] | None) -> list[dict[str, Any]]:
    """The ``k`` largest scores of one result row, with labels and probabilities."""
    probs = _probabilities(row)
    key = np.where(np.isnan(row), -np.inf, row) if row.dtype.kind == "f" else row
    order = np.argsort(-key.astype(np.float64), kind="stable")[:k]
    labels = labels or []
    return [{"index": int(i), "label": labels[i] if i < len(labels) else str(int(i)),
             "score": float(row[i]), "probability": float(probs[i])} for i in order]
