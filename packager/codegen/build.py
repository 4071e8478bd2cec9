"""From primitive functions to one relocatable object: emit LLVM IR, optimize at -O3, and write
position-independent, small-code-model ELF for the target."""

from __future__ import annotations

import os
import time

import functools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import llvmlite.binding as llvm
from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ir.sym import SymbolicShapeError
from ..ir.structure import structural_key
from .conv_oc import emit_conv_oc
from .depthwise import emit_depthwise, is_depthwise
from .gemm import (Contraction, emit_contraction, emit_symbolic_matmul, match_contraction,
                   vector_width)
from .gemv import emit_dot_product, is_dot_product
from .lower import KernelInfo, emit_kernel, is_symbolic
from .norm import emit_normalize, emit_symbolic_normalize
from .pool import emit_max_pool
from .qgemm import emit_qgemm
from .qdepthwise import emit_qdepthwise
from .rnn import emit_recurrence
from . import cache
from .conv_symbolic import emit_symbolic_conv, emit_symbolic_max_pool, emit_symbolic_softmax
from .depthwise_symbolic import emit_symbolic_depthwise
from .softmax import emit_softmax
from .transpose import emit_transpose
from .objinfo import undefined_symbols
from .target import Target
from .threadpool import emit_thread_pool

SYMBOL_PREFIX = "mlc_"
# The only symbols compiled kernels may import; the runtime resolves them from libc.
ALLOWED_EXTERNALS = ("memcpy", "memmove", "memset")


class CodegenError(Exception):
    """LLVM rejected the generated module, or the object imports something not allowed."""


@dataclass(frozen=True)
class CompiledCode:
    target: Target
    object_code: bytes
    kernels: dict[str, KernelInfo]    # prim func name -> kernel
    llvm_ir: str
    # for `export --timings`: wall seconds of compile_prim_funcs, and whether the object came
    # from the compile cache
    seconds: float = field(default=0.0, compare=False)
    from_cache: bool = field(default=False, compare=False)


@functools.cache
def _init_llvm() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def _target_machine(target: Target) -> llvm.TargetMachine:
    _init_llvm()
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic",
        codemodel="small")


# A rule: (module, func, symbol, vector width, the func's contraction match or None) -> the
# kernel it emitted, or None when the rule does not apply.
KernelRule = Callable[[ir.Module, PrimFunc, str, int, "Contraction | None"], "KernelInfo | None"]


def _when(applies: Callable[[Contraction | None], bool],
          emit: Callable[[ir.Module, Contraction, PrimFunc, str, int], KernelInfo]) -> KernelRule:
    """A rule for the contractions ``applies`` accepts."""
    def rule(module, func, symbol, vl, match):
        return emit(module, match, func, symbol, vl) if applies(match) else None
    return rule


def _without_match(emit: Callable[[ir.Module, PrimFunc, str, int], KernelInfo | None]
                   ) -> KernelRule:
    """A rule that matches ``func`` itself (recurrences, pools, softmax)."""
    def rule(module, func, symbol, vl, match):
        return emit(module, func, symbol, vl)
    return rule


# Every specialized kernel, tried in order (the first that applies wins); the generic loop-nest
# lowering is the fallback. Depthwise and one-pixel (dot product) convolutions come before the
# general register-blocked contraction, which would also take them.
KERNEL_RULES: tuple[tuple[str, KernelRule], ...] = (
    ("recurrence", _without_match(emit_recurrence)),
    ("integer GEMM", _without_match(emit_qgemm)),   # qmatmul / qconv2d (ops/qlinear.py)
    ("integer depthwise", _without_match(emit_qdepthwise)),   # qdwconv2d
    ("channel-lane convolution", _without_match(emit_conv_oc)),   # nn.conv2d_oc
    ("depthwise convolution", _when(is_depthwise, emit_depthwise)),
    ("dot-product convolution", _when(is_dot_product, emit_dot_product)),
    ("contraction", _when(lambda match: match is not None, emit_contraction)),
    ("max pool", _without_match(emit_max_pool)),
    ("softmax", _without_match(emit_softmax)),
    ("normalization", _without_match(emit_normalize)),
    ("transpose", _without_match(emit_transpose)),
)


def _emit(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
          size_vars: tuple[str, ...] = ()) -> KernelInfo:
    if size_vars and is_symbolic(func):   # run-time extents: matmul fast path, else generic
        info = emit_recurrence(module, func, symbol, vl, size_vars) or \
            emit_symbolic_matmul(module, func, symbol, vl, size_vars)
        if info is not None:
            return info
        # Convolutions take their run-time extents as arguments (codegen/conv_symbolic.py);
        # one it does not handle would get the generic loop nest, many times slower, so it
        # is refused (fix the shapes instead). Pools take the generic loop nest.
        info = emit_conv_oc(module, func, symbol, vl, size_vars) or \
            emit_symbolic_depthwise(module, func, symbol, vl, size_vars) or \
            emit_symbolic_conv(module, func, symbol, vl, size_vars) or \
            emit_symbolic_softmax(module, func, symbol, vl, size_vars) or \
            emit_symbolic_normalize(module, func, symbol, vl, size_vars) or \
            emit_symbolic_max_pool(module, func, symbol, vl, size_vars)
        if info is not None:
            return info
        match = match_contraction(func)
        if (match is not None and match.tag.kind == "conv2d") \
                and not os.environ.get("MLCPACK_SYMBOLIC_GENERIC"):
            kind = match.tag.kind if match is not None else "max pool"
            raise SymbolicShapeError(f"{func.name}: a {kind} with symbolic shapes ("
                                     + ", ".join(str(d) for d in func.outputs[0].shape)
                                     + ") has no fast kernel yet")
        return emit_kernel(module, func, symbol, size_vars)
    match = match_contraction(func)
    for _, rule in KERNEL_RULES:
        info = rule(module, func, symbol, vl, match)
        if info is not None:
            return info
    return emit_kernel(module, func, symbol)


def compile_prim_funcs(funcs: Sequence[PrimFunc], target: Target,
                       size_vars: tuple[str, ...] = ()) -> CompiledCode:
    """Compile ``funcs`` into one object for ``target``; kernel symbols are ``mlc_<name>``.
    ``size_vars`` (a symbolic module's size variables, in the order of the runtime's sizes
    array) gives symbolic kernels their run-time extents."""
    start = time.perf_counter()
    module = ir.Module(name="mlcpack_kernels")
    module.triple = target.triple
    module.mlcpack_features = target.llvm_features   # qgemm.py gates AVX-512 VNNI on it
    vl = vector_width(target.name)
    # Functions that differ only in names (unrolled recurrences, repeated layers) share one
    # compiled kernel: the first one's symbol serves them all.
    kernels: dict[str, KernelInfo] = {}
    first: dict[object, str] = {}
    for f in funcs:
        key = structural_key(f)
        if key in first:
            kernels[f.name] = kernels[first[key]]
        else:
            first[key] = f.name
            kernels[f.name] = _emit(module, f, SYMBOL_PREFIX + f.name, vl, size_vars)
    emit_thread_pool(module, target)
    text = str(module)
    directory = cache.cache_dir()
    key = cache.cache_key(text, target) if directory is not None else ""
    cached = cache.load(directory, key) if directory is not None else None
    if cached is not None:
        obj, optimized = cached
        _check_imports(obj, target)
        return CompiledCode(target, obj, kernels, optimized, time.perf_counter() - start, True)
    try:
        parsed = llvm.parse_assembly(text)
        parsed.verify()
    except RuntimeError as exc:
        raise CodegenError(f"LLVM rejected the generated kernels: {exc}") from None
    tm = _target_machine(target)
    parsed.triple = target.triple
    parsed.data_layout = str(tm.target_data)
    # llvmlite leaves the SLP vectorizer off; without it an inner loop that the unroller
    # flattens (a 64-float row of a transpose) stays scalar.
    tuning = llvm.PipelineTuningOptions(speed_level=3)
    tuning.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, tuning)
    pb.getModulePassManager().run(parsed, pb)
    undefined = sorted(f.name for f in parsed.functions
                       if f.is_declaration and not f.name.startswith("llvm.")
                       and f.name not in ALLOWED_EXTERNALS)
    if undefined:
        raise CodegenError(f"kernels would import {', '.join(undefined)}, which the runtime "
                           "does not provide")
    obj = tm.emit_object(parsed)
    _check_imports(obj, target)
    optimized = str(parsed)
    if directory is not None:
        cache.store(directory, key, obj, optimized)
    return CompiledCode(target, obj, kernels, optimized, time.perf_counter() - start)


def _check_imports(obj: bytes, target: Target) -> None:
    imported = sorted(undefined_symbols(obj) - set(ALLOWED_EXTERNALS))
    if imported:
        raise CodegenError(f"kernels for {target.name} would import {', '.join(imported)}, "
                           "which the runtime does not provide")
