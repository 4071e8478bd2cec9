"""Converters for attention and contraction ONNX operators (Attention, Einsum...), decomposed
into the operator table's rows."""

from __future__ import annotations
