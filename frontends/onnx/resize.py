"""Converters for resampling ONNX operators (Resize, Upsample, GridSample...)."""

from __future__ import annotations
