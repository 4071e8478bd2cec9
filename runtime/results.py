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


def is_vector(shape: Sequence[Any]) -> bool:
    """A result holds one vector of scores, as a classifier's does: after the first dim (the
    batch, for rank 2 and up) exactly one dim is not 1. A map such as (1, 1, 512, 512) or
    (1, 25200, 85) is not one: ranking its values as classes means nothing."""
    rest = tuple(shape[1:]) if len(shape) >= 2 else tuple(shape)
    return sum(1 for d in rest if d != 1) == 1


def summary_of(name: str, array: np.ndarray, channel_axis: int = 1) -> dict[str, Any]:
    """What fits on a line about an output that is not a vector of scores: its shape, dtype,
    min, max and mean over the finite values (a vector of a few values, up to ``FEW``: the
    values themselves), and, for a map of a few channels (axis ``channel_axis`` of a rank-4 output:
    1, or 3 for a channels-last model), how often each channel is the argmax (the classes a
    segmentation picks)."""
    values = np.asarray(array)
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values.reshape(-1)
    doc: dict[str, Any] = {"name": name, "shape": list(values.shape), "dtype": str(values.dtype)}
    if values.size == 1:   # one number (a VAD's probability, a regression): the number itself
        doc["value"] = values.reshape(-1)[0].item()
    elif 1 < values.size <= FEW and values.ndim <= 2:   # a box, two probabilities: the values
        doc["values"] = values.reshape(-1).tolist()
    elif finite.size:
        doc.update(min=float(finite.min()), max=float(finite.max()),
                   mean=float(finite.astype(np.float64).mean()))
    axis = channel_axis % 4 if values.ndim == 4 else 1
    if values.ndim == 4 and 2 <= values.shape[axis] <= 1024 and finite.size == values.size:
        counts = np.bincount(values.argmax(axis=axis).reshape(-1), minlength=values.shape[axis])
        order = np.argsort(-counts, kind="stable")[:5]
        doc["argmax_axis"] = axis
        doc["argmax"] = [{"index": int(i), "share": float(counts[i] / counts.sum())}
                         for i in order if counts[i]]
    return doc


FEW = 16   # an output of at most this many values is printed whole


def summary_text(doc: dict[str, Any]) -> str:
    """One line for ``summary_of``'s record."""
    shape = "(" + ", ".join(map(str, doc["shape"])) + ")"
    text = f"  {doc['name']} {shape} {doc['dtype']}"
    if "value" in doc:
        text += f" = {doc['value']:.6g}"
    elif "values" in doc:
        text += " = [" + ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v)
                                   for v in doc["values"]) + "]"
    elif "min" in doc:
        text += f": min {doc['min']:.4g}, max {doc['max']:.4g}, mean {doc['mean']:.4g}"
    if doc.get("argmax"):
        text += f"; argmax over axis {doc.get('argmax_axis', 1)}: " + ", ".join(
            f"{a['index']} {100 * a['share']:.1f} %" for a in doc["argmax"])
    return text
