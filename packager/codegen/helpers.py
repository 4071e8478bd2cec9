"""Small LLVM-emission helpers that keep kernel emitters short (after numba's cgutils)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from llvmlite import ir

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
VOID = ir.VoidType()

LLVM_TYPES = {
    "float32": F32, "float64": F64, "bool": I1,
    "int8": I8, "uint8": I8, "int16": ir.IntType(16), "uint16": ir.IntType(16),
    "int32": I32, "uint32": I32, "int64": I64, "uint64": I64,
}
# How a dtype is stored in memory (bool is one byte, as numpy stores it).
STORAGE_TYPES = {**LLVM_TYPES, "bool": I8}

# Fast-math flags on reductions: reassociation lets the loop vectorizer split the accumulator.
REDUCE_FLAGS = ("reassoc", "contract")
ARITH_FLAGS = ("contract",)


def const_i64(value: int) -> ir.Constant:
    return ir.Constant(I64, int(value))


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
