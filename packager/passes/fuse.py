"""Operator fusion: an elementwise ``call_tir`` that is the only reader of another ``call_tir``'s
output is merged into that producer, so the pair becomes one kernel and the intermediate tensor
disappears (FuseOps + FuseTIR in one step, as our primitive functions are tensor expressions that
splice together).

The reader may read that output several times: a diamond such as HardSwish written as
``y * clip(y + 3, 0, 6) / 6`` or SiLU as ``y * sigmoid(y)`` first fuses its branches into one
elementwise call that takes ``y`` twice, then fuses into ``y``'s producer (a convolution's
epilogue) as long as no other binding reads ``y``.

Opaque ops (a recurrence's time loop, the integer kernels) take no epilogue, but for the
integer convolutions with a float32 result (``qconv2d`` / ``qdwconv2d`` of ``--quantize int8``
graphs): a chain of per-channel arithmetic after them, up to the next layer's quantize, fuses
where every kernel they may compile to applies it as it stores (``codegen/qchain.py``)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from ..ir import te
from ..ir.graph import (Binding, CallTIR, Function, IRModule, PrimFunc, is_broadcast_read,
                        merge_sources, used_values)
from ..codegen.qchain import chain_paths, kernel_tag, match_chain
from ..ir.patterns import reduction_tag
from ..ops.qlookup import is_table_read
from ..ops.registry import OPAQUE, REDUCTION

# Math functions a matmul's epilogue does not take: evaluated on the register tile, erf (GELU)
# cost ~1 ns per element (its ~60 vector operations and ~30 constants beside the tile), as its
# own vectorized elementwise kernel ~0.6 ns, memory pass included. DeiT-tiny's
# 198x192 @ 192x768 + bias + GELU: 652 us fused, 503 + 105 us apart (ORT 626). Convolutions
# (depthwise ones above all, which are memory-bound) keep it in their epilogue.
EPILOGUE_EXCLUDED_MATH = frozenset({"erf"})

# The attribute of a fused open global mean and its quantize (``_is_open_mean_quantize``): its
# kernel (codegen/pool.py) stores the quantized means and takes nothing more (a dequantize
# after it fused made it a generic loop nest).
_NO_EPILOGUE = "no_epilogue"

# The float contractions whose fast kernels (codegen/contraction, depthwise, conv_oc, bf16
# pairs) store a float32 output: none takes an epilogue that ends in another dtype.
FLOAT_CONTRACTIONS = ("conv2d", "conv2d_rows", "conv2d_oc", "conv2d_bf16p", "matmul",
                      "matmul_packed", "matmul_bf16p")


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


def fuse_pair(producer: PrimFunc, consumer: PrimFunc, slot: int | Sequence[int]) -> PrimFunc:
    """Splice ``producer``'s output into ``consumer``'s input number ``slot`` (or each of several
    slots that receive the same value). Inputs of the result: the producer's, then the
    consumer's others."""
    slots = {slot} if isinstance(slot, int) else set(slot)
    mapping = {consumer.inputs[i].uid: producer.outputs[0] for i in slots}
    (out,) = te.replace_tensors(consumer.outputs, mapping)
    others = [t for i, t in enumerate(consumer.inputs) if i not in slots]
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
        # Each fusion may bring the consumer more arguments that all its uses now share (the
        # other branch of a diamond): try again until nothing fuses.
        fused = _fuse_one(mod, b, producer_of, uses) if isinstance(b.value, CallTIR) else None
        while fused is not None:
            prod, b = fused
            result.remove(prod)
            fused = _fuse_one(mod, b, producer_of, uses)
        if isinstance(b.value, CallTIR):   # library calls and copies are no producers
            producer_of[id(b.var)] = b
        result.append(b)
    block_type = type(fn.blocks[0]) if fn.blocks else None
    blocks = [block_type(result)] if block_type else []
    return Function(fn.name, fn.params, blocks, fn.outputs, fn.output_names)


def _fuse_one(mod: IRModule, b: Binding, producer_of: dict[int, Binding], uses: Counter
              ) -> tuple[Binding, Binding] | None:
    """Fuse one producer of ``b``'s arguments into it, if one qualifies: ``b`` is elementwise,
    reads that argument only at its own indices, and holds every use of it. Returns (the
    producer's binding, the fused binding), or None."""
    v = b.value
    consumer = mod.functions[v.func]
    assert isinstance(consumer, PrimFunc)
    if not (consumer.is_elementwise or _is_float_table_lookup(consumer)):
        return None
    for arg in v.args:
        prod = producer_of.get(id(arg))
        slots = [i for i, a in enumerate(v.args) if a is arg]
        if prod is None or uses[id(arg)] != len(slots):
            continue
        pv = prod.value
        producer = mod.functions[pv.func]
        if not (all(_reads_at_identity(consumer, consumer.inputs[i]) for i in slots)
                or _is_gate_dequantize(producer, consumer, slots)):
            continue
        if len(producer.outputs) != 1:
            continue
        # an opaque kernel (a recurrence's time loop) has no loop nest to take an epilogue, but
        # for the integer convolutions with a float32 result, whose copy out takes a chain of
        # per-channel arithmetic and the next quantize (codegen/qchain.py)
        if producer.attrs.get("op_kind") == OPAQUE:
            chained = _integer_chain(producer, consumer, slots)
            if chained is None:
                continue
            new_name = mod.add_prim_func(chained)
            args = list(pv.args) + [a for i, a in enumerate(v.args) if i not in slots]
            return prod, Binding(b.var, CallTIR(new_name, args, v.type),
                                 merge_sources(prod.source, b.source))
        if _is_matmul(producer) and _calls_excluded_math(consumer):
            continue
        # a table lookup with run-time extents keeps its own kernel (codegen/qelementwise.py:
        # vpshufb, 32 bytes a step); fused with the dequantize after it, it fell to the scalar
        # generic loop nest, but for the vector kernel of the two (``_QTableDequantize``)
        if _is_sized_table_lookup(producer) and not _is_dequantize(consumer):
            continue
        # the reduction kernels (softmax, global mean, normalization) take no quantize
        # epilogue: fused, a QDQ model's reduction and its QuantizeLinear fell to the generic
        # loop nest (PP-OCRv4 recognizer's attention softmax 0.55 ms, sixth in its profile;
        # MobileNetV3-small's SE means 0.14 ms)
        no_epilogue = False
        if producer.attrs.get("op_kind") == REDUCTION and _calls_math(consumer, ("round",)):
            if not _is_open_mean_quantize(producer, consumer, slots):
                continue
            no_epilogue = True
        if producer.attrs.get(_NO_EPILOGUE):
            continue
        # nor does a float contraction take one (its fast kernels store float32): a float
        # convolution the quantization guard kept between quantized layers, fused with the next
        # layer's QuantizeLinear, fell to the generic loop nest (PP-OCRv4 recognizer's 480x480
        # 1x1 p2o.Conv.28: 85 % of the int8 bundle's time). The quantize stays its own
        # elementwise kernel, the rest of the epilogue fused.
        if consumer.outputs[0].dtype != "float32" and _has_tag(producer, FLOAT_CONTRACTIONS):
            continue
        fused = fuse_pair(producer, consumer, slots)
        if no_epilogue:
            fused.attrs[_NO_EPILOGUE] = True
        new_name = mod.add_prim_func(fused)
        args = list(pv.args) + [a for i, a in enumerate(v.args) if i not in slots]
        # the fused kernel comes from both nodes, in graph order
        return prod, Binding(b.var, CallTIR(new_name, args, v.type),
                             merge_sources(prod.source, b.source))
    return None


def _integer_chain(producer: PrimFunc, consumer: PrimFunc, slots: list[int]
                   ) -> PrimFunc | None:
    """``producer`` (a ``qconv2d`` / ``qdwconv2d`` with a float32 result, and the chain it
    already took) fused with ``consumer`` when the kernel takes the result as its chain
    (``codegen/qchain.py`` ``match_chain``) on every path it may compile to; else None."""
    tag = kernel_tag(producer)
    if tag is None or tag.attrs.get("dtype") != "float32" or not chain_paths(producer, tag):
        return None
    fused = fuse_pair(producer, consumer, slots)
    return fused if match_chain(fused, tag) is not None else None


def _is_float_table_lookup(func: PrimFunc) -> bool:
    """``func`` is elementwise but for gathers from float32 [C, 256] tables (``qlookup``,
    ops/qlookup.py): a float contraction takes it as its epilogue (the vector epilogue gathers
    the table, codegen/contraction/epilogue.py)."""
    if len(func.outputs) != 1 or func.outputs[0].dtype != "float32":
        return False
    stages = [st for st in te.stages(func.outputs) if st.body is not None]
    if len(stages) != 1 or any(isinstance(n, te.Reduce) for n in te.walk(stages[0].body)):
        return False
    tables = 0
    for r in te.reads(stages[0].body):
        if is_table_read(r):
            tables += 1
        elif not is_broadcast_read(stages[0], r):
            return False
    return tables > 0


def _is_sized_table_lookup(func: PrimFunc) -> bool:
    """``func`` is a ``lut8`` (8-bit x through an 8-bit [C, 256] table) of run-time extents."""
    if len(func.inputs) != 2 or len(func.outputs) != 1:
        return False
    x, table = func.inputs
    return (x.dtype in ("int8", "uint8") and table.dtype in ("int8", "uint8")
            and len(table.shape) == 2 and table.shape[1] == 256
            and not all(isinstance(d, int) for d in func.outputs[0].shape)
            and not func.is_elementwise)


def _is_gate_dequantize(producer: PrimFunc, consumer: PrimFunc, slots: list[int]) -> bool:
    """``producer`` dequantizes a squeeze-and-excitation gate [N, C, 1, 1] that ``consumer``, a
    quantize of y * gate (float32 y of the output's run-time extents, one scale and zero
    point), broadcasts over each plane: fused, the gate kernel dequantizes it once per row
    (codegen/qelementwise.py ``match_gated_quantize``, the kernel's own match) instead of a
    kernel of its own (PP-OCR's classifier, open sizes: ten of 0.4 us)."""
    if not _is_dequantize(producer) or len(slots) != 1 or len(consumer.inputs) != 4:
        return False
    gate = tuple(producer.outputs[0].shape)
    out = consumer.outputs[0]
    shape = tuple(out.shape)
    if (len(gate) != 4 or gate[2:] != (1, 1) or len(shape) != 4 or gate[:2] != shape[:2]
            or out.dtype not in ("int8", "uint8") or all(isinstance(d, int) for d in shape)
            or not _calls_math(consumer, ("round",))):
        return False
    others = [t for i, t in enumerate(consumer.inputs) if i not in slots]
    return sum(t.dtype == "float32" and tuple(t.shape) == shape for t in others) == 1 and \
        sum(len(t.shape) == 0 for t in others) == 2


def _is_open_mean_quantize(producer: PrimFunc, consumer: PrimFunc, slots: list[int]) -> bool:
    """``producer`` a global mean (a float32 sum over the trailing axes, scaled) of run-time
    extents and ``consumer`` the quantize after it (one scale and zero point): the open mean
    kernel quantizes each mean as it stores it (codegen/pool.py ``match_global_mean_quantize``;
    PP-OCR's classifier, open sizes: nine squeeze-and-excitation quantizes of 0.4 us). The
    pair then takes no further epilogue (``_NO_EPILOGUE``)."""
    if (len(slots) != 1 or len(producer.inputs) != 1 or len(producer.outputs) != 1
            or len(consumer.inputs) != 3):
        return False
    out = consumer.outputs[0]
    mean = producer.outputs[0]
    body = mean.body
    if isinstance(body, te.Binary) and body.op in ("mul", "div"):
        body = body.a
    others = [t for i, t in enumerate(consumer.inputs) if i not in slots]
    return (isinstance(body, te.Reduce) and body.combiner == "sum" and mean.dtype == "float32"
            and out.dtype in ("int8", "uint8") and tuple(out.shape) == tuple(mean.shape)
            and not all(isinstance(d, int) for d in out.shape)
            and all(len(t.shape) == 0 for t in others) and _calls_math(consumer, ("round",)))


def _is_dequantize(func: PrimFunc) -> bool:
    """``func`` has a ``dequantize``'s signature: 8-bit x, one float32 scale and one 8-bit zero
    point, a float32 result of x's shape."""
    if len(func.inputs) != 3 or len(func.outputs) != 1:
        return False
    x, s, z = func.inputs
    out = func.outputs[0]
    return (x.dtype in ("int8", "uint8") and z.dtype == x.dtype and s.dtype == "float32"
            and out.dtype == "float32" and tuple(out.shape) == tuple(x.shape)
            and len(s.shape) == 0 and len(z.shape) == 0)


def _calls_math(func: PrimFunc, names: tuple[str, ...]) -> bool:
    """Whether ``func`` computes one of the math functions ``names``."""
    stack = [st.body for st in te.stages(func.outputs) if st.body is not None]
    while stack:
        node = stack.pop()
        if isinstance(node, te.MathCall) and node.name in names:
            return True
        stack.extend(te.children(node))
    return False


def _is_matmul(func: PrimFunc) -> bool:
    """Whether ``func``'s output contains a reduction tagged ``matmul``."""
    return _has_tag(func, ("matmul", "matmul_packed", "matmul_bf16p"))


def _has_tag(func: PrimFunc, kinds: tuple[str, ...]) -> bool:
    """Whether ``func``'s output contains a reduction tagged one of ``kinds``."""
    stack = [st.body for st in te.stages(func.outputs) if st.body is not None]
    while stack:
        node = stack.pop()
        if isinstance(node, te.Reduce):
            tag = reduction_tag(node)
            if tag is not None and tag.kind in kinds:
                return True
        stack.extend(te.children(node))
    return False


def _calls_excluded_math(func: PrimFunc) -> bool:
    """Whether ``func`` computes one of EPILOGUE_EXCLUDED_MATH."""
    return _calls_math(func, tuple(EPILOGUE_EXCLUDED_MATH))
