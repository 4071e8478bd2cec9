"""Operator fusion: an elementwise ``call_tir`` whose input is the only use of another
``call_tir``'s output is merged into that producer, so the pair becomes one kernel and the
intermediate tensor disappears (FuseOps + FuseTIR in one step, as our primitive functions are
tensor expressions that splice together)."""

from __future__ import annotations

from collections import Counter

from ..ir import te
from ..ir.graph import (Binding, CallTIR, Function, IRModule, PrimFunc, merge_sources,
                        used_values)


def _reads_at_identity(func: PrimFunc, ph: te.Tensor) -> bool:
    """Every read of placeholder ``ph`` in ``func`` is at the reading stage's own indices."""
    for stage in te.stages(func.outputs):
        if stage.body is None:
            continue
        for r in te.reads(stage.body):
            if r.tensor is ph and (stage.shape != ph.shape
                                   or any(i is not a for i, a in zip(r.indices, stage.axes))):
                return False
    return True


def _fused_name(a: str, b: str) -> str:
    strip = lambda s: s[len("fused_"):] if s.startswith("fused_") else s  # noqa: E731
    return f"fused_{strip(a)}_{strip(b)}"


def fuse_pair(producer: PrimFunc, consumer: PrimFunc, slot: int) -> PrimFunc:
    """Splice ``producer``'s output into ``consumer``'s input number ``slot``.
    Inputs of the result: the producer's, then the consumer's others."""
    ph = consumer.inputs[slot]
    (out,) = te.replace_tensors(consumer.outputs, {ph.uid: producer.outputs[0]})
    others = [t for i, t in enumerate(consumer.inputs) if i != slot]
    attrs = {"op_kind": producer.attrs.get("op_kind", "complex")}
    macs = producer.attrs.get("macs", 0) + consumer.attrs.get("macs", 0)
    if macs:
        attrs["macs"] = macs   # the contraction's multiply-adds, for the profiler's GFLOP/s
    return PrimFunc(_fused_name(producer.name, consumer.name), producer.inputs + others, [out],
                    attrs)


def fuse_ops(mod: IRModule) -> IRModule:
    out = mod.copy()
    for fname, fn in mod.functions.items():
        if isinstance(fn, Function):
            out.functions[fname] = _fuse_function(out, fn)
    return out


def _fuse_function(mod: IRModule, fn: Function) -> Function:
    bindings = list(fn.bindings())
    uses = Counter(id(a) for b in bindings for a in used_values(b.value))
    uses.update(id(o) for o in fn.outputs)
    producer_of: dict[int, Binding] = {}
    result: list[Binding] = []
    for b in bindings:
        v = b.value
        if isinstance(v, CallTIR):
            consumer = mod.functions[v.func]
            assert isinstance(consumer, PrimFunc)
            for slot, arg in enumerate(v.args):
                prod = producer_of.get(id(arg))
                if prod is None or uses[id(arg)] != 1 or not consumer.is_elementwise:
                    continue
                if not _reads_at_identity(consumer, consumer.inputs[slot]):
                    continue
                pv = prod.value
                producer = mod.functions[pv.func]
                fused = fuse_pair(producer, consumer, slot)
                new_name = mod.add_prim_func(fused)
                args = list(pv.args) + [a for i, a in enumerate(v.args) if i != slot]
                result.remove(prod)
                # the fused kernel comes from both nodes, in graph order
                b = Binding(b.var, CallTIR(new_name, args, v.type),
                            merge_sources(prod.source, b.source))
                break
            producer_of[id(b.var)] = b
        result.append(b)
    block_type = type(fn.blocks[0]) if fn.blocks else None
    blocks = [block_type(result)] if block_type else []
    return Function(fn.name, fn.params, blocks, fn.outputs, fn.output_names)

