"""Small LLVM-emission helpers that keep kernel emitters short (after numba's cgutils)."""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

from llvmlite import ir

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
VOID = ir.VoidType()

LLVM_TYPES = {
    "float32": F32, "float64": F64, "bool": I1,
    "int8": I8, "uint8": I8, "int16": ir.IntType(16), "uint16": ir.IntType(16),
    "int32": I32, "uint32": I32, "int64": I64, "uint64": I64,
    # Reduced-precision floats are computed in float32; only their storage is narrow.
    "float16": F32, "bfloat16": F32,
    "float8_e4m3fn": F32, "float8_e4m3fnuz": F32, "float8_e5m2": F32, "float8_e5m2fnuz": F32,
    # 4- and 2-bit integers: one per byte (ml_dtypes' layout: the low bits), computed as int8
    "int4": I8, "uint4": I8, "int2": I8, "uint2": I8,
}
# How a dtype is stored in memory (bool is one byte, as numpy stores it).
STORAGE_TYPES = {**LLVM_TYPES, "bool": I8, "float16": I16, "bfloat16": I16,
                 "float8_e4m3fn": I8, "float8_e4m3fnuz": I8, "float8_e5m2": I8,
                 "float8_e5m2fnuz": I8}

# Fast-math flags on reductions: reassociation lets the loop vectorizer split the accumulator.
REDUCE_FLAGS = ("reassoc", "contract")
ARITH_FLAGS = ("contract",)


def const_i64(value: int) -> ir.Constant:
    return ir.Constant(I64, int(value))


def shared_constant(ty: ir.Type, value) -> ir.Constant:
    """``ir.Constant(ty, value)``, one object per distinct type and value (``value`` a scalar,
    None or a list of them) in this process. llvmlite formats a constant's text once per
    object: a vector constant made afresh each time (a splat's shuffle mask, a SiLU's
    polynomial coefficients) cost a Constant object per lane and a formatting of every lane
    wherever it was used: ~35 % of printing yolo11n_seg_nms's x86-64-v4 module. The text is the
    same (keyed by ``repr`` too: 0.0 and -0.0, True and 1 stay apart)."""
    return _constant(str(ty), repr(value), ty, tuple(value) if isinstance(value, list) else value)


@functools.cache
def _constant(type_text: str, value_text: str, ty: ir.Type, value) -> ir.Constant:
    return ir.Constant(ty, list(value) if isinstance(value, tuple) else value)


def alloca_once(builder: ir.IRBuilder, ty: ir.Type, name: str = "") -> ir.AllocaInstr:
    """An alloca in the entry block, so mem2reg can promote it wherever it is used."""
    entry = builder.function.entry_basic_block
    with builder.goto_block(entry):
        if entry.instructions:
            builder.position_before(entry.instructions[0])
        return builder.alloca(ty, name=name)


@contextlib.contextmanager
def for_range(builder: ir.IRBuilder, start: ir.Value, stop: ir.Value, name: str = "i"
              ) -> Iterator[ir.Value]:
    """``for i in range(start, stop)`` over int64; yields the loop index inside the body."""
    pre = builder.block
    cond_bb = builder.append_basic_block(f"{name}.cond")
    body_bb = builder.append_basic_block(f"{name}.body")
    end_bb = builder.append_basic_block(f"{name}.end")
    builder.branch(cond_bb)
    with builder.goto_block(cond_bb):
        index = builder.phi(I64, name=name)
        index.add_incoming(start, pre)
        builder.cbranch(builder.icmp_signed("<", index, stop), body_bb, end_bb)
    builder.position_at_end(body_bb)
    yield index
    nxt = builder.add(index, const_i64(1), name=f"{name}.next", flags=("nsw",))
    index.add_incoming(nxt, builder.block)
    builder.branch(cond_bb)
    builder.position_at_end(end_bb)


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """Declare (once) an LLVM intrinsic such as ``llvm.maximum.f32``."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, ir.FunctionType(ret, args), name=name)


def type_suffix(ty: ir.Type) -> str:
    return {F32: "f32", F64: "f64"}.get(ty, f"i{getattr(ty, 'width', 0)}")


# ---- float16 / bfloat16 <-> float32 in integer IR ------------------------------------------------
# LLVM's own ``fptrunc float to half`` becomes a ``__truncsfhf2`` libcall on x86-64 without F16C
# (and ``fpext`` an ``__extendhfsf2``), which a bundle cannot import. These are branch-free (selects
# only, so they vectorize), round to nearest even, and keep NaN, infinities, signed zeros and
# subnormals.

def _i32(value: int) -> ir.Constant:
    return ir.Constant(I32, value)


def _f32_bits(value: float) -> ir.Constant:
    return ir.Constant(F32, value)


def half_to_float(b: ir.IRBuilder, h: ir.Value) -> ir.Value:
    """IEEE binary16 bits (i16) -> float32, exactly."""
    h32 = b.zext(h, I32)
    sign = b.shl(b.and_(h32, _i32(0x8000)), _i32(16))
    shifted = b.shl(b.and_(h32, _i32(0x7FFF)), _i32(13))
    exp = b.and_(h32, _i32(0x7C00))
    normal = b.add(shifted, _i32(0x38000000))          # rebias 15 -> 127
    inf_nan = b.add(shifted, _i32(0x70000000))         # exponent 31 -> 255, payload kept
    # subnormal (and zero): m * 2^-24 = float(2^-14 * (1 + m/2^10)) - 2^-14, exact
    magic = b.bitcast(b.add(shifted, _i32(0x38800000)), F32)
    sub = b.bitcast(b.fsub(magic, _f32_bits(2.0 ** -14)), I32)
    bits = b.select(b.icmp_unsigned("==", exp, _i32(0x7C00)), inf_nan,
                    b.select(b.icmp_unsigned("==", exp, _i32(0)), sub, normal))
    return b.bitcast(b.or_(bits, sign), F32)


def float_to_half(b: ir.IRBuilder, f: ir.Value) -> ir.Value:
    """float32 -> IEEE binary16 bits (i16), round to nearest even; overflow gives infinity."""
    x = b.bitcast(f, I32)
    sign = b.and_(b.lshr(x, _i32(16)), _i32(0x8000))
    ax = b.and_(x, _i32(0x7FFFFFFF))
    # normal results: rebias, then add 0xFFF plus the lowest kept bit and drop 13 bits (RNE)
    v = b.sub(ax, _i32(0x38000000))
    odd = b.and_(b.lshr(v, _i32(13)), _i32(1))
    normal = b.lshr(b.add(b.add(v, _i32(0xFFF)), odd), _i32(13))
    # subnormal results: adding 0.5 puts the binary16 subnormal ulp (2^-24) at float32's last bit,
    # so the FPU's own round-to-nearest-even does the rounding
    sum_ = b.fadd(b.bitcast(ax, F32), _f32_bits(0.5))
    sub = b.sub(b.bitcast(sum_, I32), _i32(0x3F000000))
    bits = b.select(b.icmp_unsigned(">=", ax, _i32(0x38800000)), normal, sub)
    bits = b.select(b.icmp_unsigned(">=", ax, _i32(0x477FF000)), _i32(0x7C00), bits)  # >= 65520
    quiet_nan = b.or_(_i32(0x7E00), b.and_(b.lshr(ax, _i32(13)), _i32(0x1FF)))
    bits = b.select(b.icmp_unsigned(">", ax, _i32(0x7F800000)), quiet_nan, bits)
    return b.trunc(b.or_(bits, sign), I16)


def bfloat16_to_float(b: ir.IRBuilder, h: ir.Value) -> ir.Value:
    """bfloat16 bits (i16) -> float32 (the top half of a float32)."""
    return b.bitcast(b.shl(b.zext(h, I32), _i32(16)), F32)


def float_to_bfloat16(b: ir.IRBuilder, f: ir.Value) -> ir.Value:
    """float32 -> bfloat16 bits (i16), round to nearest even; NaN stays a (quiet) NaN."""
    x = b.bitcast(f, I32)
    odd = b.and_(b.lshr(x, _i32(16)), _i32(1))
    rounded = b.lshr(b.add(b.add(x, _i32(0x7FFF)), odd), _i32(16))
    nan = b.or_(b.lshr(x, _i32(16)), _i32(0x40))
    is_nan = b.icmp_unsigned(">", b.and_(x, _i32(0x7FFFFFFF)), _i32(0x7F800000))
    return b.trunc(b.select(is_nan, nan, rounded), I16)


# float8 formats (OCP / ONNX): exponent bits, mantissa bits, bias, largest finite code, and how
# they encode NaN ("ieee": e5m2 has inf and NaNs like binary16; "fn": S.1111.111 is NaN, no inf;
# "fnuz": 0x80 is the only NaN, no inf, no negative zero).
FLOAT8_FORMATS = {
    "float8_e4m3fn": (4, 3, 7, 0x7E, "fn"),
    "float8_e4m3fnuz": (4, 3, 8, 0x7F, "fnuz"),
    "float8_e5m2": (5, 2, 15, 0x7B, "ieee"),
    "float8_e5m2fnuz": (5, 2, 16, 0x7F, "fnuz"),
}
# 4- and 2-bit integers: bit width and signedness.
SUBBYTE_INTS = {"int4": (4, True), "uint4": (4, False), "int2": (2, True), "uint2": (2, False)}


def float8_to_float(b: ir.IRBuilder, v: ir.Value, dtype: str) -> ir.Value:
    """float8 bits (i8) -> float32, exactly."""
    _, mbits, bias, _, nan_kind = FLOAT8_FORMATS[dtype]
    x = b.zext(v, I32)
    mag = b.and_(x, _i32(0x7F))
    sign = b.shl(b.lshr(x, _i32(7)), _i32(31))
    normal = b.add(b.shl(mag, _i32(23 - mbits)), _i32((127 - bias) << 23))
    mant = b.and_(mag, _i32((1 << mbits) - 1))
    sub = b.bitcast(b.fmul(b.uitofp(mant, F32), _f32_bits(2.0 ** (1 - bias - mbits))), I32)
    exp = b.lshr(mag, _i32(mbits))
    bits = b.select(b.icmp_unsigned("==", exp, _i32(0)), sub, normal)
    nan = _i32(0x7FC00000)
    if nan_kind == "fn":
        bits = b.select(b.icmp_unsigned("==", mag, _i32(0x7F)), nan, bits)
    elif nan_kind == "ieee":  # exponent 31: inf (mantissa 0) or NaN
        top = b.icmp_unsigned("==", exp, _i32(0x1F))
        bits = b.select(top, b.select(b.icmp_unsigned("==", mant, _i32(0)), _i32(0x7F800000),
                                      nan), bits)
    bits = b.or_(bits, sign)
    if nan_kind == "fnuz":  # 0x80 (which would be -0) is NaN (sign bit set, as ml_dtypes')
        bits = b.select(b.icmp_unsigned("==", x, _i32(0x80)), _i32(0xFFC00000), bits)
    return b.bitcast(bits, F32)


def float_to_float8(b: ir.IRBuilder, f: ir.Value, dtype: str) -> ir.Value:
    """float32 -> float8 bits (i8), round to nearest even, without saturation: values past the
    largest finite one become inf (e5m2) or NaN (the others), as ONNX's saturate=0. (Saturating
    casts clamp to the largest finite value first.)"""
    _, mbits, bias, max_code, nan_kind = FLOAT8_FORMATS[dtype]
    shift = 23 - mbits
    x = b.bitcast(f, I32)
    sign = b.and_(b.lshr(x, _i32(24)), _i32(0x80))
    ax = b.and_(x, _i32(0x7FFFFFFF))
    v = b.sub(ax, _i32((127 - bias) << 23))
    odd = b.and_(b.lshr(v, _i32(shift)), _i32(1))
    normal = b.lshr(b.add(b.add(v, _i32((1 << (shift - 1)) - 1)), odd), _i32(shift))
    magic = 2.0 ** (1 - bias - mbits + 23)  # its float32 ulp is the float8 subnormal step
    sum_ = b.fadd(b.bitcast(ax, F32), _f32_bits(magic))
    sub = b.sub(b.bitcast(sum_, I32), b.bitcast(_f32_bits(magic), I32))
    code = b.select(b.icmp_unsigned(">=", ax, _i32((128 - bias) << 23)), normal, sub)
    nan_code = _i32(0x80 if nan_kind == "fnuz" else 0x7F)
    over = _i32(0x7C) if nan_kind == "ieee" else nan_code
    code = b.select(b.icmp_unsigned(">", code, _i32(max_code)), over, code)
    is_nan = b.icmp_unsigned(">", ax, _i32(0x7F800000))
    if nan_kind == "fnuz":  # no signed zero or signed NaN
        signed = b.select(b.icmp_unsigned("==", code, _i32(0)), code, b.or_(code, sign))
        code = b.select(b.icmp_unsigned("==", code, nan_code), nan_code, signed)
        code = b.select(is_nan, nan_code, code)
    else:
        code = b.or_(b.select(is_nan, _i32(0x7E if nan_kind == "ieee" else 0x7F), code), sign)
    return b.trunc(code, I8)


def load_converted(b: ir.IRBuilder, stored: ir.Value, dtype: str) -> ir.Value:
    """A value loaded from memory as ``dtype`` -> its computing type (LLVM_TYPES[dtype])."""
    if dtype == "float16":
        return half_to_float(b, stored)
    if dtype == "bfloat16":
        return bfloat16_to_float(b, stored)
    if dtype in FLOAT8_FORMATS:
        return float8_to_float(b, stored, dtype)
    if dtype in SUBBYTE_INTS:
        width, signed = SUBBYTE_INTS[dtype]
        if signed:  # sign-extend the low bits
            return b.ashr(b.shl(stored, ir.Constant(I8, 8 - width)), ir.Constant(I8, 8 - width))
        return b.and_(stored, ir.Constant(I8, (1 << width) - 1))
    if dtype == "bool":
        return b.trunc(stored, I1)
    return stored


def store_converted(b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
    """A computed ``dtype`` value -> how it is stored (STORAGE_TYPES[dtype])."""
    if dtype == "float16":
        return float_to_half(b, value)
    if dtype == "bfloat16":
        return float_to_bfloat16(b, value)
    if dtype in FLOAT8_FORMATS:
        return float_to_float8(b, value, dtype)
    if dtype in SUBBYTE_INTS:  # wrap to the width, kept in the low bits
        return b.and_(value, ir.Constant(I8, (1 << SUBBYTE_INTS[dtype][0]) - 1))
    if dtype == "bool":
        return b.zext(value, I8)
    return value


def round_to(b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
    """A computed value made one ``dtype`` can hold: a float32 rounded to a reduced float's
    precision, an int8 wrapped to a 4- or 2-bit integer's range."""
    return load_converted(b, store_converted(b, value, dtype), dtype)
