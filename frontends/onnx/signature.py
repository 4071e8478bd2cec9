"""An ONNX file's signature: its run-time inputs' and its outputs' dims, read once without the
weights (``load_external_data=False``), so the export driver can decide on batch plans before
the model is imported. A dim is its size when the file fixes it (> 0), else None with the name
the exporter gave it (``batch``, ``unk__653``, ``DynamicDimension.0``, or "")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Dim:
    size: Optional[int]        # None: open (symbolic or unknown)
    name: str = ""             # the exporter's dim_param for an open dim


@dataclass(frozen=True)
class TensorSignature:
    name: str
    dims: Optional[tuple[Dim, ...]]   # None: the file gives no shape


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSignature, ...]    # run-time inputs (initializers left out)
    outputs: tuple[TensorSignature, ...]


def _dims(type_proto) -> Optional[tuple[Dim, ...]]:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(Dim(d.dim_value, "") if d.HasField("dim_value") and d.dim_value > 0
                 else Dim(None, d.dim_param) for d in type_proto.tensor_type.shape.dim)


def read_signature(path: str | os.PathLike) -> Optional[Signature]:
    """The signature of the ONNX file at ``path``, or None when it cannot be read (the importer
    reports an unreadable file in its own words). Inputs that are not tensors are left out."""
    from .proto import load_model

    try:
        proto = load_model(os.fspath(path), load_external_data=False)
    except Exception:
        return None
    inits = {t.name for t in proto.graph.initializer}
    inputs = tuple(TensorSignature(vi.name, _dims(vi.type)) for vi in proto.graph.input
                   if vi.name not in inits and vi.type.HasField("tensor_type"))
    outputs = tuple(TensorSignature(vi.name, _dims(vi.type)) for vi in proto.graph.output)
    return Signature(inputs, outputs)
