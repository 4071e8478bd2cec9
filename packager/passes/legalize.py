"""Legalization: every high-level operator call becomes a ``call_tir`` of a primitive function
written in tensor expressions. View operators (reshape) stay: the VM maps them to aliases."""

from __future__ import annotations

from ..ir import te
from ..ir.graph import Call, CallTIR, Constant, Function, IRModule, PrimFunc, Value
from ..ops import get_op
from ..ops.registry import BIND, BRANCH, VIEW
from .common import rewrite_function


def _placeholder_name(v: Value, used: set[str]) -> str:
    base = v.name if isinstance(v, Constant) else getattr(v, "name", "x")
    name, n = base, 1
    while name in used:
        name = f"{base}_{n}"
        n += 1
    used.add(name)
    return name


def _elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def contraction_macs(call: Call) -> int:
    """The multiply-adds a contraction computes (0 for other operators): what the profiler
    divides by a kernel's time for its GFLOP/s, however the kernel is written."""
    if call.op in ("matmul", "matmul_packed", "matmul_bf16p"):   # a [..., K]
        return _elements(call.type.shape) * call.args[0].type.shape[-1]
    if call.op in ("nn.conv2d", "nn.conv"):          # weight [O, C/groups, k...]
        return _elements(call.type.shape) * _elements(call.args[1].type.shape[1:])
    if call.op == "nn.conv2d_bf16p":                 # x [N, C, H, W], wp [O, C/2, kh, kw, 2]
        return _elements(call.type.shape) * _elements(call.args[0].type.shape[1:2]) \
            * _elements(call.args[1].type.shape[2:4])
    if call.op == "nn.conv2d_oc":   # the direct convolution's, Winograd's too (its packed
        kh, kw = call.attrs["kernel"]   # weight [blocks, 16 * C, lanes] has 16 taps)
        return _elements(call.type.shape) * call.args[0].type.shape[1] * kh * kw
    if call.op == "nn.conv2d_rows":                  # packed [blocks, C*kh*kw, rows]
        return _elements(call.type.shape) * call.args[1].type.shape[1]
    if call.op == "nn.conv_transpose":               # weight [C, O/groups, k...]
        return _elements(call.args[0].type.shape) * _elements(call.args[1].type.shape[1:])
    if call.op == "nn.recurrence":                   # xw [T, B, D*G*H] times R [G*H, H] per step
        return _elements(call.args[0].type.shape) * int(call.attrs["hidden"])
    return 0


def legalize_call(call: Call) -> PrimFunc:
    """The primitive function computing ``call``; its inputs follow ``call.args`` in order."""
    opdef = get_op(call.op)
    used: set[str] = set()
    inputs = [te.placeholder(a.type.shape, a.type.dtype, _placeholder_name(a, used))
              for a in call.args]
    short = call.op.split(".")[-1]
    out = opdef.legalize(*inputs, out_type=call.type, name=short, **call.attrs)
    attrs = {"op_kind": opdef.kind}
    macs = contraction_macs(call)
    if macs:
        attrs["macs"] = macs
    return PrimFunc(short, inputs, [out], attrs)


def legalize(mod: IRModule) -> IRModule:
    out = mod.copy()

    def visit(b, lookup):
        v = b.value
        if not isinstance(v, Call) or get_op(v.op).kind in (VIEW, BIND, BRANCH):
            return None
        fname = out.add_prim_func(legalize_call(v))
        return CallTIR(fname, list(v.args), v.type)

    for name, fn in mod.functions.items():
        if isinstance(fn, Function):
            out.functions[name] = rewrite_function(fn, visit)
    return out
