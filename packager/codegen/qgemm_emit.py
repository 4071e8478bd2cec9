"""The integer contraction kernels' entry point: picks the kernel class for a qmatmul / qconv2d
prim func (qgemm_matmul.QMatmul or qgemm_conv.QConv, both built on qgemm.QEmitter) and sets the
instruction choices the target allows (AVX2, AVX-512 VNNI, aarch64 sdot). Kept apart from
qgemm.py so the base class's module does not import its own subclasses."""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from .lower import KernelInfo
from .qchain import match_chain
from .qgemm import match_qgemm
from .qgemm_conv import QConv
from .qgemm_matmul import QMatmul


def emit_qgemm(module: ir.Module, func: PrimFunc, symbol: str, vl: int, features: str = "",
               vnni_emulate: bool = False, level: str = "",
               size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The integer kernel of ``func`` (None when it is no qmatmul / qconv2d); ``features``:
    the target's LLVM features; ``vnni_emulate`` (``CompileOptions.vnni_emulate``); ``level``:
    the target's level name (x86-64-v2 has SSSE3's 128-bit pmaddubsw). With ``size_vars``
    (run-time extents): a quad ``qconv2d`` with run-time image sizes (``QConv._emit_open``)
    or a ``qmatmul`` with run-time rows (``QMatmul._open_rows``), else None."""
    m = match_qgemm(func, sized=bool(size_vars), chain=True)
    if m is None:
        return None
    kind, tag = m
    if size_vars and not (QConv.takes_open(func, tag) if kind == "qconv2d"
                          else QMatmul.takes_open(func)):
        return None
    avx2 = module.triple.startswith("x86_64") and vl >= 8
    cls = QMatmul if kind == "qmatmul" else QConv
    emitter = cls(module, func, symbol, tag, avx2, size_vars)
    # an elementwise chain fused after a qconv2d's float32 result (codegen/qchain.py): its
    # pixel-lane copy out applies it
    emitter.chain = match_chain(func, tag) if kind == "qconv2d" else None
    emitter.vl = vl     # floats per vector of the target: 16 where 512-bit (QConv._zmm)
    # AVX-512 VNNI: where the target's LLVM features name it (level x86-64-v4+vnni)
    emitter.vnni = avx2 and "+avx512vnni" in features
    # tests: the VNNI kernel with vpdpbusd written in portable IR, so its packing, column sums
    # and epilogue run (and are checked) on a CPU without VNNI
    emitter.vnni_emulated = vnni_emulate
    # aarch64 with dotprod: the same kernels with sdot (int8 x int8 quads, uint8 x shifted)
    emitter.sdot = module.triple.startswith("aarch64") and "+dotprod" in features
    # x86 without VNNI, a qconv2d_quads of 7-bit weights (passes/quad_weights.py ``w7``): the
    # quad kernel with vpmaddubsw + vpmaddwd by ones (AVX2) or the exact products (x86-64-v2)
    emitter.madd7 = (module.triple.startswith("x86_64") and bool(tag.attrs.get("w7"))
                     and not emitter.vnni and not emitter.vnni_emulated)
    emitter.vnni = emitter.vnni or emitter.vnni_emulated or emitter.sdot or emitter.madd7
    emitter.ssse3 = emitter.madd7 and not avx2 and level == "x86-64-v2"
    # full-range weights in [-127, 127] on int8 planes (passes/quad_weights.py ``signed_x``):
    # vpmaddubsw(|x|, sign(w, x)), exact for any such weights, on every x86 level
    emitter.signed_x = module.triple.startswith("x86_64") and bool(tag.attrs.get("signed_x"))
    # AVX-512 levels: 32 vector registers (EVEX), so qmatmul's VNNI tile may take more rows
    emitter.registers32 = avx2 and vl >= 16
    return emitter.emit()
