"""Pipelines are named lists of passes, each a function from IRModule to IRModule; a pass whose
choices depend on the compile options (``Pass.takes_options``) also takes the
``CompileOptions``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..ir.graph import IRModule
from ..ir.printer import module_text
from ..ir.invariants import VerifyError, verify_module
from ..options import CompileOptions
from .bf16_pairs import bf16_pair_activations
from .concat_views import concats_in_place
from .conv_nd import decompose_conv_nd
from .conv_transpose import decompose_conv_transpose
from .fuse import fuse_ops
from .gelu import fuse_gelu
from .normalize import fuse_normalize
from .layout import (pack_conv_rows, pack_conv_weights, pack_matmul_weights, pretranspose_weights,
                     weights_to_bf16)
from .legalize import legalize
from .slice_views import slices_as_views
from .quad_weights import pack_conv_quads
from .rnn import drop_unread_cell_state
from .fuse_qdq import fuse_quantized
from .fuse_qdq_elementwise import fuse_quantized_elementwise
from .fuse_qdq_attention import fuse_quantized_attention
from .fuse_qdq_layout import fuse_quantized_layout
from .quantize_lut import (fuse_table_chains, lookup_dequantized_tables,
                           tabulate_quantized_chains)
from .simplify import eliminate_dead_code, fold_constants, fold_dequantize
from .strided_frames import strided_frames_as_matmul


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[..., IRModule]   # (mod) -> mod, or (mod, options) -> mod
    takes_options: bool = False    # run takes the CompileOptions too


DEFAULT_PIPELINE: tuple[Pass, ...] = (
    Pass("fold_constants", fold_constants),
    Pass("fuse_gelu", fuse_gelu),
    Pass("fuse_normalize", fuse_normalize),
    Pass("eliminate_dead_code", eliminate_dead_code),
    Pass("fuse_quantized", fuse_quantized, takes_options=True),
    Pass("tabulate_quantized_chains", tabulate_quantized_chains, takes_options=True),
    Pass("fuse_quantized_layout", fuse_quantized_layout, takes_options=True),
    Pass("fuse_quantized_attention", fuse_quantized_attention, takes_options=True),
    Pass("fuse_quantized_elementwise", fuse_quantized_elementwise, takes_options=True),
    Pass("lookup_dequantized_tables", lookup_dequantized_tables, takes_options=True),
    Pass("fuse_table_chains", fuse_table_chains, takes_options=True),
    Pass("fold_dequantize", fold_dequantize),
    Pass("drop_unread_cell_state", drop_unread_cell_state),
    Pass("decompose_conv_transpose", decompose_conv_transpose),
    Pass("decompose_conv_nd", decompose_conv_nd),
    Pass("strided_frames_as_matmul", strided_frames_as_matmul),
    Pass("pretranspose_weights", pretranspose_weights, takes_options=True),
    Pass("pack_conv_weights", pack_conv_weights, takes_options=True),
    Pass("pack_conv_rows", pack_conv_rows, takes_options=True),
    Pass("pack_matmul_weights", pack_matmul_weights, takes_options=True),
    Pass("weights_to_bf16", weights_to_bf16, takes_options=True),
    Pass("pack_conv_quads", pack_conv_quads, takes_options=True),
    Pass("slices_as_views", slices_as_views),
    Pass("legalize", legalize),
    Pass("fuse_ops", fuse_ops),
    Pass("bf16_pair_activations", bf16_pair_activations, takes_options=True),
    Pass("eliminate_dead_code", eliminate_dead_code),
    Pass("concats_in_place", concats_in_place),
)


def run_pipeline(mod: IRModule, passes: Sequence[Pass] = DEFAULT_PIPELINE, *,
                 options: CompileOptions, verify: bool = False, verify_result: bool = False,
                 trace: Callable[[str, str], None] | None = None) -> IRModule:
    """Run ``passes`` in order with ``options`` (required: the pipeline's result is a function
    of the module and the options; layout choices ``options`` leaves to the targets are made
    for ``options.target`` as an export makes them, ``CompileOptions.for_targets``);
    ``verify`` checks IR invariants before the first pass and after each one (a broken
    invariant names the pass); ``verify_result`` checks them once, on the result (what an
    export does by default); ``trace(name, text)`` receives the printed module after each pass
    (for ``--dump-ir``-style debugging)."""
    options = options.for_targets()
    if verify:
        _verify(mod, "the pipeline's input")
    for p in passes:
        mod = p.run(mod, options) if p.takes_options else p.run(mod)
        if verify:
            _verify(mod, f"pass {p.name}")
        if trace is not None:
            trace(p.name, module_text(mod))
    if verify_result and not verify:
        _verify(mod, "the pipeline's result")
    return mod


def _verify(mod: IRModule, where: str) -> None:
    try:
        verify_module(mod)
    except VerifyError as exc:
        raise VerifyError(f"after {where}: {exc}" if where.startswith("pass") else
                          f"{where}: {exc}") from None
