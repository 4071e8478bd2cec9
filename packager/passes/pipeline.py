"""Pipelines are named lists of passes, each a function from IRModule to IRModule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..ir.graph import IRModule
from ..ir.printer import module_text
from ..ir.verify import verify_module
from .conv_nd import decompose_conv_nd
from .conv_transpose import decompose_conv_transpose
from .fuse import fuse_ops
from .gelu import fuse_gelu
from .normalize import fuse_normalize
from .layout import (pack_conv_rows, pack_conv_weights, pack_matmul_weights, pretranspose_weights,
                     weights_to_bf16)
from .legalize import legalize
from .rnn import drop_unread_cell_state
from .quantize import fuse_quantized
from .quantize_lut import tabulate_quantized_chains
from .simplify import eliminate_dead_code, fold_constants, fold_dequantize


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[IRModule], IRModule]


DEFAULT_PIPELINE: tuple[Pass, ...] = (
    Pass("fold_constants", fold_constants),
    Pass("fuse_gelu", fuse_gelu),
    Pass("fuse_normalize", fuse_normalize),
    Pass("eliminate_dead_code", eliminate_dead_code),
    Pass("fuse_quantized", fuse_quantized),
    Pass("tabulate_quantized_chains", tabulate_quantized_chains),
    Pass("fold_dequantize", fold_dequantize),
    Pass("drop_unread_cell_state", drop_unread_cell_state),
    Pass("decompose_conv_transpose", decompose_conv_transpose),
    Pass("decompose_conv_nd", decompose_conv_nd),
    Pass("pretranspose_weights", pretranspose_weights),
    Pass("pack_conv_weights", pack_conv_weights),
    Pass("pack_conv_rows", pack_conv_rows),
    Pass("pack_matmul_weights", pack_matmul_weights),
    Pass("weights_to_bf16", weights_to_bf16),
    Pass("legalize", legalize),
    Pass("fuse_ops", fuse_ops),
    Pass("eliminate_dead_code", eliminate_dead_code),
)


def run_pipeline(mod: IRModule, passes: Sequence[Pass] = DEFAULT_PIPELINE, verify: bool = False,
                 trace: Callable[[str, str], None] | None = None) -> IRModule:
    """Run ``passes`` in order; ``verify`` checks IR invariants after each one; ``trace(name,
    text)`` receives the printed module after each pass (for ``--dump-ir``-style debugging)."""
    if verify:
        verify_module(mod)
    for p in passes:
        mod = p.run(mod)
        if verify:
            verify_module(mod)
        if trace is not None:
            trace(p.name, module_text(mod))
    return mod
