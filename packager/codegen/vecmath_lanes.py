"""The float32 math functions of ``vecmath`` emitted directly on vectors (``<vl x float>``), for
code that already works a vector at a time: the fused epilogues of the contraction, depthwise
kernels, where a SiLU (``x * sigmoid(x)``) or GELU (``erf``) after a convolution would otherwise
drop the whole epilogue to element-by-element scalar code.

The bodies are ``vecmath``'s own emitters (the same polynomials, so the same results lane by
lane as the scalar functions); only the building blocks differ: constants are splats and
intrinsics are the vector overloads. Functions whose body needs more than those blocks (log's
int-to-float conversion, the float64 trigonometric ones) are not offered here.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from . import vecmath
from .helpers import intrinsic, shared_constant
from .vecmath import F32, I32

# Functions this module emits on vectors: vecmath's polynomial ones whose bodies use only the
# _Ops blocks overridden below, and those that are one LLVM intrinsic.
_POLYNOMIAL = frozenset({"exp", "tanh", "sigmoid", "erf", "sqrt"})
_INTRINSIC = {"abs": "llvm.fabs", "floor": "llvm.floor", "ceil": "llvm.ceil",
              "round": "llvm.roundeven"}
VECTOR_MATH: frozenset[str] = _POLYNOMIAL | frozenset(_INTRINSIC)


class _LaneOps(vecmath._Ops):
    """vecmath's building blocks on ``<n x float>`` values (and ``<n x i32>`` bit patterns)."""

    def __init__(self, builder: ir.IRBuilder, lanes: int, opaque: ir.Value | None = None
                 ) -> None:
        super().__init__(builder)
        self.vty = ir.VectorType(F32, lanes)
        self.ity = ir.VectorType(I32, lanes)
        self.opaque_scalar = opaque
        self.opaque = None if opaque is None else splat_i32(builder, opaque, lanes)

    def c(self, value: float) -> ir.Value:
        if self.opaque is None:
            return shared_constant(self.vty, [value] * self.vty.count)
        return opaque_constant(self.b, value, self.opaque)

    def ci(self, value: int) -> ir.Constant:
        return shared_constant(self.ity, [value] * self.ity.count)

    def _intrinsic(self, name: str, nargs: int) -> ir.Function:
        return intrinsic(self.module, f"{name}.v{self.vty.count}f32", self.vty,
                         [self.vty] * nargs)

    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.ity)

    def from_bits(self, i: ir.Value) -> ir.Value:
        return self.b.bitcast(i, self.vty)

    def call(self, name: str, x: ir.Value) -> ir.Value:
        return vector_math(self.b, name, x, self.opaque_scalar)


def opaque_zero(builder: ir.IRBuilder) -> ir.Value:
    """An i32 0 that LLVM cannot see through (an empty inline asm that returns its operand)."""
    fnty = ir.FunctionType(I32, [I32])
    return builder.asm(fnty, "", "=r,0", [ir.Constant(I32, 0)], side_effect=True)


def splat_i32(builder: ir.IRBuilder, x: ir.Value, lanes: int) -> ir.Value:
    ity = ir.VectorType(I32, lanes)
    undef = shared_constant(ity, None)
    v = builder.insert_element(undef, x, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, undef, shared_constant(ity, [0] * lanes))


def opaque_constant(builder: ir.IRBuilder, value: float, opaque: ir.Value) -> ir.Value:
    """The float32 splat ``value`` computed from ``opaque`` (a splat of ``opaque_zero``), so
    that it cannot be hoisted above where ``opaque`` was made.

    Why: in a contraction kernel the epilogue follows the register-blocked reduction loop
    inside the loop over blocks; LLVM hoists plain constants (clip bounds, a sigmoid's
    polynomial) out of that loop, where they hold registers across the reduction and push
    its accumulators to the stack (a 3x3 stride-2 stem conv with HardSwish measured 510 us
    instead of 256 us with ReLU). Made from a fresh opaque zero after each reduction, they
    live only during the epilogue, at one integer add each."""
    ity = opaque.type
    bits = int(np.array(value, dtype=np.float32).view(np.int32))
    raw = shared_constant(ity, [bits] * ity.count)
    return builder.bitcast(builder.add(raw, opaque), ir.VectorType(F32, ity.count))


def vector_math(builder: ir.IRBuilder, name: str, x: ir.Value, opaque: ir.Value | None = None
                ) -> ir.Value:
    """``name`` (one of ``VECTOR_MATH``) applied to every lane of the float32 vector ``x``,
    emitted inline at the builder's position; ``opaque`` (an ``opaque_zero``), if given, makes
    the functions' constants with ``opaque_constant``."""
    ops = _LaneOps(builder, x.type.count, opaque)
    if name in _INTRINSIC:
        return builder.call(ops._intrinsic(_INTRINSIC[name], 1), [x])
    if name not in _POLYNOMIAL:
        raise ValueError(f"no lane-wise math function {name!r}")
    return vecmath._EMITTERS[name](ops, x)
