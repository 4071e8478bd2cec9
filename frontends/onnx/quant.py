"""Converters for reduced-precision and quantization ONNX operators (QuantizeLinear,
DequantizeLinear...)."""

from __future__ import annotations
