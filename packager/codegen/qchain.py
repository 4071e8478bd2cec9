"""The elementwise chain an integer convolution with a float32 result takes into its copy out
(pure Python, no llvmlite: ``passes/fuse.py`` asks it which chains to fuse, the kernels in
``codegen/qgemm_conv.py`` and ``codegen/qdepthwise.py`` evaluate what it matched with
``qgemm.QEmitter.chain_vector``).

A ``--quantize int8`` graph keeps each product's result float32 (``qconv2d`` / ``qdwconv2d``
with ``dtype="float32"``, ``passes/fuse_qdq_float.py``); what follows is often a chain of
per-channel arithmetic ending in the next layer's QuantizeLinear: Paddle's PP-LCNetV3 blocks
write ``affine -> HardSwish -> affine -> quantize`` (PP-OCRv4 recognizer: 71 such chains, each
its own generic loop nest, 14-30 us, where the fp32 bundle folds them into its convolutions).
``passes/fuse.py`` fuses such a chain into the kernel's function (inputs: the op's operands,
then the chain's); the kernel applies it to each float32 result vector as it stores it,
writing the chain's own result (8-bit when it ends in the quantize).

A chain the kernels take (``match_chain``): every stage after the kernel's result has the
result's shape [B, C, H, W] and reads it, and the chain's other stages, at its own indices;
its other inputs are per-tensor or per-channel values (every index 0 but the channel's), of
float32, or of an 8-bit / int32 type under a float32 cast (a zero point); the arithmetic is
float32 add, sub, mul, div, max, min, compares and selects, the math functions ``CHAIN_MATH``
(lane-wise in ``codegen/vecmath_lanes.py``: the scalar functions' own polynomials, round as
roundeven); the last stage may end in a cast to int8 / uint8 (a quantize, clamped before it),
every other stage is float32. So the chain is one function of the value per channel: the
pixel-lane kernels evaluate it a row's vector at a time (the channel fixed per row or plane).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag

# the integer kernels whose float32 result takes a chain (their ops' reduction tags)
CHAIN_KINDS = ("qconv2d", "qdwconv2d")
# what the chain's result may be
CHAIN_OUT = ("float32", "uint8", "int8")
# math functions evaluated lane-wise (codegen/vecmath_lanes.VECTOR_MATH: a test checks the two
# agree)
CHAIN_MATH = frozenset({"round", "abs", "floor", "ceil", "exp", "tanh", "sigmoid", "erf",
                        "sqrt"})
_BINARY = ("add", "sub", "mul", "div", "max", "min")
_INT_READ = ("int8", "uint8", "int32")


@dataclass(frozen=True)
class Chain:
    """A matched chain: the function's output ``out``, the kernel's own result ``mid`` it
    reads, its stages from ``mid`` (exclusive) to ``out`` in order, and its placeholders."""
    out: te.Tensor
    mid: te.Tensor
    stages: tuple[te.Tensor, ...]
    inputs: tuple[te.Tensor, ...]


def kernel_tag(func: PrimFunc):
    """The ``qconv2d`` / ``qdwconv2d`` reduction tag in ``func`` whose operands are its first
    inputs, else None."""
    for stage in te.stages(func.outputs):
        if stage.body is None:
            continue
        for node in te.walk(stage.body):
            if isinstance(node, te.Reduce):
                tag = reduction_tag(node)
                if tag is not None and tag.kind in CHAIN_KINDS:
                    n = len(tag.operands)
                    ok = [o.uid for o in tag.operands] == [i.uid for i in func.inputs[:n]]
                    return tag if ok else None
    return None


def chained(func: PrimFunc, tag) -> bool:
    """Whether ``func``'s output is a stage after the kernel of ``tag`` (an elementwise chain
    fused after it) rather than the op's own result: it neither reduces nor reads one of the
    op's operands."""
    out = func.outputs[0]
    operands = {t.uid for t in tag.operands}
    return out.body is not None and not (
        any(r.tensor.uid in operands for r in te.reads(out.body))
        or any(isinstance(x, te.Reduce) for x in te.walk(out.body)))


def match_chain(func: PrimFunc, tag) -> Chain | None:
    """The chain after the integer kernel of ``tag`` in ``func`` (see the module docstring);
    None when ``func`` has none (the op alone) or one the kernels do not take."""
    if len(func.outputs) != 1 or tag.attrs.get("dtype") != "float32":
        return None
    n = len(tag.operands)
    chain_inputs = func.inputs[n:]
    operands = {t.uid for t in func.inputs[:n]}
    out = func.outputs[0]
    # the kernel's stages: those whose bodies reduce or read the op's operands
    kernel = {s.uid for s in te.stages(func.outputs) if s.body is not None
              and (any(r.tensor.uid in operands for r in te.reads(s.body))
                   or any(isinstance(x, te.Reduce) for x in te.walk(s.body)))}
    if out.uid in kernel:
        return None
    placeholders = {t.uid for t in chain_inputs}
    order: list[te.Tensor] = []
    mids: dict[int, te.Tensor] = {}
    seen: set[int] = set()

    def visit(t: te.Tensor) -> bool:
        if t.uid in seen:
            return True
        seen.add(t.uid)
        if t.uid in kernel:
            mids[t.uid] = t
            return True
        if t.body is None:
            return t.uid in placeholders
        for r in te.reads(t.body):
            if not visit(r.tensor):
                return False
        order.append(t)
        return True

    if not visit(out) or len(mids) != 1:
        return None
    (mid,) = mids.values()
    if mid.dtype != "float32" or len(mid.shape) != 4 or out.dtype not in CHAIN_OUT:
        return None
    inner = {t.uid for t in order} | {mid.uid}
    for stage in order:
        if not _stage_ok(stage, stage is out, mid, inner):
            return None
    return Chain(out, mid, tuple(order), tuple(chain_inputs))


def _stage_ok(stage: te.Tensor, last: bool, mid: te.Tensor, inner: set[int]) -> bool:
    if len(stage.shape) != 4 or not all(_same(a, b) for a, b in zip(stage.shape, mid.shape)):
        return False
    if stage.dtype != "float32" and not last:
        return False
    body = stage.body
    root_cast = None
    if stage.dtype != "float32":
        if not (isinstance(body, te.Cast) and body.value.dtype == "float32"):
            return False
        root_cast = body
    for node in te.walk(body):
        if node is root_cast:
            continue
        if isinstance(node, te.Read):
            if not _read_ok(stage, node, inner):
                return False
        elif isinstance(node, te.Binary):
            if node.dtype != "float32" or node.op not in _BINARY:
                return False
        elif isinstance(node, te.Compare):
            if node.a.dtype != "float32":
                return False
        elif isinstance(node, te.Select):
            if node.dtype != "float32":
                return False
        elif isinstance(node, te.MathCall):
            if node.dtype != "float32" or node.name not in CHAIN_MATH:
                return False
        elif isinstance(node, te.Cast):
            v = node.value
            if node.dtype != "float32":
                return False
            if v.dtype != "float32" and not (isinstance(v, te.Read)
                                             and v.tensor.dtype in _INT_READ
                                             and v.tensor.uid not in inner):
                return False
        elif isinstance(node, te.Const):
            if node.dtype not in ("float32", "int64"):
                return False
        elif isinstance(node, te.IndexVar):
            continue   # a read's index (checked with the read; no index is used as a value)
        else:
            return False
    return not _index_as_value(body)


def _same(a: object, b: object) -> bool:
    """Two sizes (ints or size expressions) known to be equal."""
    try:
        return bool(a == b)
    except Exception:   # noqa: BLE001  (an undecidable comparison: not known to be equal)
        return False


def _read_ok(stage: te.Tensor, r: te.Read, inner: set[int]) -> bool:
    """A read of the kernel's result or a chain stage at ``stage``'s own indices, or of a
    placeholder per tensor or per channel (index 0, or an axis of extent-1 dims, but on the
    channel axis)."""
    t = r.tensor
    if t.uid in inner:
        return len(r.indices) == 4 and all(i is a for i, a in zip(r.indices, stage.axes))
    if t.dtype != "float32" and t.dtype not in _INT_READ:
        return False
    offset = len(stage.axes) - len(r.indices)
    if offset < 0:
        return False
    for d, idx in enumerate(r.indices):
        axis = offset + d
        if isinstance(idx, te.Const):
            if idx.value != 0:
                return False
        elif isinstance(idx, te.IndexVar):
            if idx is not stage.axes[axis]:
                return False
            if axis != 1 and t.shape[d] != 1:
                return False
            if axis == 1 and t.shape[d] != 1 and not _same(t.shape[d], stage.shape[1]):
                return False
        else:
            return False
    return True


def _index_as_value(body: te.Expr) -> bool:
    """Some index appears in ``body`` other than as a read's index."""
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, te.IndexVar):
            return True
        if isinstance(node, te.Read):
            continue
        stack.extend(te.children(node))
    return False


def channel_offset(r: te.Read, stage: te.Tensor) -> tuple[int, bool]:
    """(the stride of the channel in ``r``'s tensor, whether ``r`` reads by channel): the read
    is at ``channel * stride`` (``match_chain`` allowed only such reads)."""
    t = r.tensor
    offset = len(stage.axes) - len(r.indices)
    stride = 1
    by_channel = False
    ch_stride = 0
    for d in reversed(range(len(r.indices))):
        idx = r.indices[d]
        if offset + d == 1 and idx is stage.axes[1] and t.shape[d] != 1:
            by_channel, ch_stride = True, stride
        stride *= int(t.shape[d])
    return ch_stride, by_channel


def chain_paths(func: PrimFunc, tag) -> bool:
    """Whether every kernel the integer op of ``tag`` (in ``func``) may compile to takes a
    chain: ``qdwconv2d`` always (codegen/qdepthwise.py, static and run-time sizes); ``qconv2d``
    on its pixel-lane kernels (codegen/qgemm_conv.py ``emit`` and ``_emit_open``: in the copy
    out) and its channel-lane one (``oc_lanes``: into the staging rows, channels on the
    lanes), not on the matrix-vector product of a 1x1 image."""
    if tag.kind == "qdwconv2d":
        return True
    if tag.kind != "qconv2d":
        return False
    _, _, h, w = tag.operands[0].shape
    one = (h, w, *tag.attrs["kernel"]) == (1, 1, 1, 1) and not any(tag.attrs["padding"])
    return not one
