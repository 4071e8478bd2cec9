"""High-level operators; importing this package registers every row of the table: the
model-level operators (``nn``, ``elementwise``, ``shape``...) that frontends produce, and the
layout-only ones (``layout``, ``bf16``: a constant weight packed for a kernel, made only by
passes/layout.py; ``OpDef.layout`` marks their rows)."""

from . import (bf16, control, dynamic, elementwise, frames, index, layout, logic,  # noqa: F401
               nn, norm, pool, qconv_quads, qelementwise, qlinear, qlookup, quant, resize,
               resize_taps, sequence, shape, trees)  # (registration side effect)
from .registry import OPS, OpDef, get_op, register_op

__all__ = ["OPS", "OpDef", "get_op", "register_op"]
