"""High-level operators; importing this package registers every row of the table."""

from . import (bf16, elementwise, index, logic, nn, norm, qconv_quads, qlinear,  # noqa: F401
               quant, resize, sequence, shape)  # (registration side effect)
from .registry import OPS, OpDef, get_op, register_op

__all__ = ["OPS", "OpDef", "get_op", "register_op"]
