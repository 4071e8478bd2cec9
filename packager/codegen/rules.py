"""The kernel rule table: which emitter computes a primitive function.

Each row names a kernel family (``op``), an optional precondition on the function's
contraction match (``applies``), and its two emitters: ``static`` for fully static shapes and
``symbolic`` for run-time extents (None: that mode has no such kernel). Every emitter matches
the function itself and returns None when it is not its kind. ``emit_function`` tries the rows
in order, the first kernel emitted wins; the generic loop-nest lowering (``lower.emit_kernel``)
is the fallback. Depthwise and one-pixel (dot product) convolutions come before the general
register-blocked contraction, which would also take them. A new kernel is a new row.

The symbolic emitters' matchers take disjoint reduction tags (conv2d_oc, depthwise conv2d,
matmul_bf16p, matmul, conv2d, max_pool2d, softmax, normalize), so their order among
themselves only matters for depthwise before conv2d.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ir.sym import SymbolicShapeError
from ..options import CompileOptions
from .bf16conv import emit_pair_conv
from .bf16dot import emit_pair_matmul
from .contraction.conv_symbolic import emit_symbolic_conv
from .contraction.dot import emit_dot_product, is_dot_product
from .contraction.kernel import emit_contraction, emit_symbolic_matmul
from .contraction.match import Contraction, match_contraction
from .conv_oc import emit_conv_oc
from .depthwise.static import emit_depthwise, is_depthwise
from .depthwise.symbolic import emit_symbolic_depthwise
from .lower import KernelInfo, emit_kernel, is_symbolic
from .compact import emit_nonzero_index
from .nms import emit_nms
from .norm import emit_normalize, emit_symbolic_normalize
from .pad import emit_pad
from .pool import emit_max_pool, emit_symbolic_max_pool
from .qdepthwise import emit_qdepthwise
from .qelementwise import emit_qelementwise, emit_qelementwise_sized
from .qgemm_emit import emit_qgemm
from .resize import emit_resize
from .rnn import emit_recurrence
from .softmax import emit_softmax, emit_symbolic_softmax
from .target import Target
from .transpose import emit_transpose
from .trees import emit_trees
from .unique import emit_unique

# (module, func, symbol, vector width, the func's contraction match or None, the target, the
# compile options) -> the kernel it emitted, or None when ``func`` is not its kind.
StaticEmit = Callable[[ir.Module, PrimFunc, str, int, "Contraction | None", Target,
                       CompileOptions], "KernelInfo | None"]
# (module, func, symbol, vector width, the module's size variables, the target, the compile
# options) -> the kernel or None.
SymbolicEmit = Callable[[ir.Module, PrimFunc, str, int, tuple[str, ...], Target, CompileOptions],
                        "KernelInfo | None"]


@dataclass(frozen=True)
class KernelRule:
    """One row of the table (see the module docstring)."""
    op: str
    applies: Callable[[Contraction | None], bool] | None   # on the match, before ``static``
    static: StaticEmit | None
    symbolic: SymbolicEmit | None


def _with_match(emit: Callable[..., KernelInfo]) -> StaticEmit:
    """A static emitter of the contraction ``applies`` accepted (it reads the options'
    thresholds of splitting over threads)."""
    def rule(module, func, symbol, vl, match, target, options):
        return emit(module, match, func, symbol, vl, options=options)
    return rule


def _on_func(emit: Callable[..., KernelInfo | None], takes_options: bool = False) -> StaticEmit:
    """A static emitter that matches ``func`` itself (recurrences, pools, softmax); with
    ``takes_options``, handed the compile options."""
    def rule(module, func, symbol, vl, match, target, options):
        if takes_options:
            return emit(module, func, symbol, vl, options=options)
        return emit(module, func, symbol, vl)
    return rule


def _sized(emit: Callable[..., KernelInfo | None], takes_options: bool = False) -> SymbolicEmit:
    """A symbolic emitter that needs only the size variables (and with ``takes_options`` the
    compile options)."""
    def rule(module, func, symbol, vl, size_vars, target, options):
        if takes_options:
            return emit(module, func, symbol, vl, size_vars, options=options)
        return emit(module, func, symbol, vl, size_vars)
    return rule


def _bf16_pairs(module, func, symbol, vl, match, target, options):
    """matmul_bf16p (``--precision bf16``): vdpbf16ps where the target has avx512_bf16."""
    return emit_pair_matmul(module, func, symbol, vl, target.llvm_features,
                            emulate=options.bf16_emulate)


def _bf16_pairs_sized(module, func, symbol, vl, size_vars, target, options):
    """matmul_bf16p with run-time extents."""
    return emit_pair_matmul(module, func, symbol, vl, target.llvm_features, size_vars)


def _bf16_conv(module, func, symbol, vl, match, target, options):
    """nn.conv2d_bf16p (``--precision bf16``): vdpbf16ps where the target has avx512_bf16."""
    return emit_pair_conv(module, func, symbol, vl, target.llvm_features, options.bf16_emulate)


def _integer_gemm(module, func, symbol, vl, match, target, options):
    """qmatmul / qconv2d: the target's features and the options choose VNNI."""
    return emit_qgemm(module, func, symbol, vl, target.llvm_features, options.vnni_emulate,
                      level=target.name)


def _integer_gemm_sized(module, func, symbol, vl, size_vars, target, options):
    """qconv2d quads with run-time image sizes (QConv._emit_open), qmatmul with run-time rows
    (QMatmul._open_rows)."""
    return emit_qgemm(module, func, symbol, vl, target.llvm_features, options.vnni_emulate,
                      level=target.name, size_vars=size_vars)


def _integer_depthwise(module, func, symbol, vl, match, target, options):
    """qdwconv2d: the target's features and the options choose VNNI quads."""
    return emit_qdepthwise(module, func, symbol, vl, target.llvm_features, options.vnni_emulate)


def _integer_depthwise_sized(module, func, symbol, vl, size_vars, target, options):
    """qdwconv2d with run-time image sizes (``_QDepthwise._emit_open``)."""
    return emit_qdepthwise(module, func, symbol, vl, target.llvm_features, options.vnni_emulate,
                           size_vars=size_vars)


def _resize(module, func, symbol, vl, match, target, options):
    """resize_axis: permuted row blocks / weighted rows on x86 with AVX2 or AVX-512."""
    return emit_resize(module, func, symbol, vl, target.arch)


def _resize_sized(module, func, symbol, vl, size_vars, target, options):
    """resize_axis with run-time extents (tables from resize_taps or constants)."""
    return emit_resize(module, func, symbol, vl, target.arch, size_vars)


def _symbolic_contraction(module, func, symbol, vl, size_vars, target, options):
    """A matmul (M, N, K, batch may be run-time sizes), else a conv2d with run-time image
    sizes (``contraction/conv_symbolic.py``)."""
    return emit_symbolic_matmul(module, func, symbol, vl, size_vars, options) or \
        emit_symbolic_conv(module, func, symbol, vl, size_vars, options)


KERNEL_RULES: tuple[KernelRule, ...] = (
    KernelRule("recurrence", None, _on_func(emit_recurrence), _sized(emit_recurrence)),
    KernelRule("non-maximum suppression", None, _on_func(emit_nms),   # ops/dynamic.py
               _sized(emit_nms)),
    KernelRule("tree ensemble", None, _on_func(emit_trees), _sized(emit_trees)),   # ops/trees.py
    KernelRule("nonzero index", None, _on_func(emit_nonzero_index),   # ops/dynamic.py
               _sized(emit_nonzero_index)),
    KernelRule("unique by sorting", None, _on_func(emit_unique), _sized(emit_unique)),   # ditto
    KernelRule("integer GEMM", None, _integer_gemm,   # qmatmul / qconv2d (ops/qlinear.py)
               _integer_gemm_sized),   # qconv2d quads / qmatmul rows with run-time sizes
    KernelRule("integer depthwise", None, _integer_depthwise,   # qdwconv2d
               _integer_depthwise_sized),   # with run-time image sizes (_emit_open)
    KernelRule("integer elementwise", None, _on_func(emit_qelementwise, True),   # qbinary, qgavgpool
               _sized(emit_qelementwise_sized, True)),   # lut8, qtable, (de)quantize, open
    KernelRule("channel-lane convolution", None, _on_func(emit_conv_oc, True),   # nn.conv2d_oc
               _sized(emit_conv_oc, True)),
    KernelRule("depthwise convolution", is_depthwise, _with_match(emit_depthwise),
               _sized(emit_symbolic_depthwise, True)),
    KernelRule("dot-product convolution", is_dot_product, _with_match(emit_dot_product), None),
    KernelRule("bf16 pair matmul", None, _bf16_pairs, _bf16_pairs_sized),   # matmul_bf16p
    KernelRule("bf16 pair convolution", None, _bf16_conv, None),   # nn.conv2d_bf16p (static)
    KernelRule("contraction", lambda match: match is not None, _with_match(emit_contraction),
               _symbolic_contraction),
    KernelRule("max pool", None, _on_func(emit_max_pool), _sized(emit_symbolic_max_pool)),
    KernelRule("softmax", None, _on_func(emit_softmax, True),
               _sized(emit_symbolic_softmax, True)),
    KernelRule("normalization", None, _on_func(emit_normalize, True),
               _sized(emit_symbolic_normalize, True)),
    KernelRule("transpose", None, _on_func(emit_transpose), _sized(emit_transpose)),
    KernelRule("resize", None, _resize, _resize_sized),   # resize_axis (ops/resize.py)
    KernelRule("pad", None, _on_func(emit_pad, True), None),   # reflect / edge / wrap borders
)


def emit_function(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                  size_vars: tuple[str, ...], target: Target, options: CompileOptions
                  ) -> KernelInfo:
    """Emit ``func`` into ``module`` as ``symbol`` with the first rule whose kernel takes it,
    else the generic loop nest. With run-time extents (``size_vars`` and a symbolic ``func``),
    a conv2d no rule takes is refused (its generic loop nest is many times slower; fix the
    shapes instead) unless ``options.symbolic_generic``."""
    if size_vars and is_symbolic(func):
        for rule in KERNEL_RULES:
            if rule.symbolic is not None:
                info = rule.symbolic(module, func, symbol, vl, size_vars, target, options)
                if info is not None:
                    return _chosen(info, rule)
        match = match_contraction(func)
        if (match is not None and match.tag.kind == "conv2d") \
                and not options.symbolic_generic:
            kind = match.tag.kind if match is not None else "max pool"
            raise SymbolicShapeError(f"{func.name}: a {kind} with symbolic shapes ("
                                     + ", ".join(str(d) for d in func.outputs[0].shape)
                                     + ") has no fast kernel yet")
        return _chosen(emit_kernel(module, func, symbol, size_vars, options), None)
    match = match_contraction(func)
    for rule in KERNEL_RULES:
        if rule.static is None or (rule.applies is not None and not rule.applies(match)):
            continue
        info = rule.static(module, func, symbol, vl, match, target, options)
        if info is not None:
            return _chosen(info, rule)
    return _chosen(emit_kernel(module, func, symbol, options=options), None)


def _chosen(info: KernelInfo, rule: KernelRule | None) -> KernelInfo:
    """``info`` with its ``choice`` (what ``mlcpack inspect`` shows): the emitter's own, else
    the rule's row, else the generic loop nest."""
    if info.choice is not None:
        return info
    return replace(info, choice=rule.op if rule is not None else "generic loop nest")
