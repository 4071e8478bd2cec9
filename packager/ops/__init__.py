"""High-level operators; importing this package registers every row of the table."""

from . import (bf16, dynamic, elementwise, index, logic, nn, norm,  # noqa: F401
               qconv_quads, qelementwise, qlinear, quant, resize, sequence,
               shape)  # (registration side effect)
from .registry import OPS, OpDef, get_op, register_op

__all__ = ["OPS", "OpDef", "get_op", "register_op"]
