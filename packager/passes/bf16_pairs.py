"""bf16 pair words between two bf16 convolutions (``mlcpack export --precision bf16`` where every
target has vdpbf16ps at 16 lanes; docs/precision.md).

Both bf16 convolution kernels read their input as *pair words*: per input-channel pair j and
pixel the 32-bit word (bf16(x[2j]), bf16(x[2j + 1])) that vdpbf16ps multiplies, made by a copy
of the float32 input (codegen/bf16conv.py's pair planes, codegen/conv_oc.py's band copy). Where
a tensor is written by a bf16 convolution and read by nothing but one bf16 convolution's
reduction, the producer's epilogue writes those words
itself and the consumer reads them in place: the tensor's buffer (an arena buffer sized for the
float32 tensor) holds ``[N, ceil(C / 2), H + pt + pb, W + pl + pr]`` words, the consumer's
padding (pt, pl, pb, pr) as zero words, which needs at most half the bytes plus the border. The
words are the ones the copy made (vcvtne2ps2bf16 of the same float32 values): the outputs are
bit for bit those without this pass.

Which pairs (after ``fuse_ops``, on the fused functions' attributes, ``PrimFunc.attrs``):

- producer ``bf16_pairs_out`` = the padding: a channel-lane ``conv2d_oc`` with ``pairs`` (not
  Winograd) or an ``nn.conv2d_bf16p`` whose output rows its panels hold without dropped columns
  (a 1x1, stride 1 or 2, no padding), static shapes, whole vectors of output channels, an
  epilogue the vector path computes, its only output the tensor;
- consumer ``bf16_pairs_in``: an ``nn.conv2d_bf16p`` with a 1x1 window, stride 1 and no padding
  (its pair planes are then the words themselves, one plane per pair of H * W words) or a
  channel-lane ``conv2d_oc`` with ``pairs`` (channel pairs, not tap pairs, not Winograd: its band
  reads the padded words in place);
- the tensor is no output of the model and is read only by the consumer's reduction (not by its
  epilogue, as a residual).

``options.bf16_pair_activations`` False turns it off (for comparison)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..ir import te
from ..ir.graph import Binding, CallTIR, Function, IRModule, PrimFunc, used_values
from ..ir.patterns import reduction_tag
from ..options import CompileOptions

PAIRS_OUT = "bf16_pairs_out"
PAIRS_IN = "bf16_pairs_in"
PAIRS_READ = "bf16_pairs_read"
PAIRS_FILL = "bf16_pairs_fill"


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


class _Conv:
    """A fused function's bf16 convolution (its tagged reduction) and the stages after it."""

    def __init__(self, func: PrimFunc, reduce, stage) -> None:
        tag = reduction_tag(reduce)
        self.kind, self.attrs, self.operands = tag.kind, tag.attrs, tag.operands
        self.reduce, self.stage, self.out = reduce, stage, func.outputs[0]
        self.epilogue = [s for s in te.stages(func.outputs) if s.body is not None
                         and s is not stage]


def _match(func: PrimFunc, kinds=("conv2d_oc", "conv2d_bf16p")) -> _Conv | None:
    """The one ``conv2d_oc`` / ``conv2d_bf16p`` (``kinds``) reduction of ``func`` (one float32
    output of the reduction's shape, every other stage elementwise after it), or None."""
    if len(func.outputs) != 1 or func.outputs[0].dtype != "float32":
        return None
    found = []
    for s in te.stages(func.outputs):
        if s.body is None:
            continue
        for n in te.walk(s.body):
            if isinstance(n, te.Reduce):
                found.append((n, s))
    if len(found) != 1:
        return None
    reduce, stage = found[0]
    tag = reduction_tag(reduce)
    if tag is None or tag.kind not in kinds \
            or tuple(stage.shape) != tuple(func.outputs[0].shape) \
            or not all(any(t is i for i in func.inputs) for t in tag.operands):
        return None
    return _Conv(func, reduce, stage)


def _vector_epilogue(m: _Conv, rows: bool) -> bool:
    """The stages after the convolution are float32 arithmetic (+, -, *, max, min) of it,
    constants and reads whose indices are the stage's own axes (the last one only last) or
    constants, as codegen/contraction/epilogue.py ``vector_epilogue_ok`` takes them (a subset:
    no casts, selects or math calls); ``rows``: also ``rows_contiguous`` (a read along the last
    axis reads along the one before it, rows of the output's length)."""
    for s in m.epilogue:
        axes = {id(a) for a in s.axes}
        last = s.axes[-1]
        for n in te.walk(s.body):
            if isinstance(n, te.Binary):
                if n.dtype != "float32" or n.op not in ("add", "sub", "mul", "max", "min"):
                    return False
            elif isinstance(n, te.Read):
                if n.dtype != "float32" or n.tensor.dtype != "float32":
                    return False
                for d, idx in enumerate(n.indices):
                    if isinstance(idx, te.IndexVar):
                        if id(idx) not in axes or (idx is last and d != len(n.indices) - 1):
                            return False
                    elif not isinstance(idx, te.Const):
                        return False
                if rows and n.indices and n.indices[-1] is last and (
                        len(n.indices) < 2 or n.indices[-2] is not s.axes[-2]
                        or n.tensor.shape[-1] != s.shape[-1]):
                    return False
            elif not isinstance(n, (te.Const, te.IndexVar)):
                return False
    return True


def _whole_rows(m: _Conv) -> bool:
    """The pixel-lane kernel's panels hold whole output rows (codegen/bf16conv.py
    ``pair_conv_geometry``'s ``wq`` equals the output width: no dropped columns)."""
    x, wp = m.operands
    kw = wp.shape[3]
    sw = m.attrs["strides"][1]
    _, pl, _, pr = m.attrs["padding"]
    ow = m.out.shape[3]
    return max(-(-(x.shape[3] + pl + pr) // sw), ow + (kw - 1) // sw) == ow


def _producer_ok(func: PrimFunc) -> bool:
    m = _match(func)
    if m is None:
        return False
    shape, x = tuple(m.out.shape), m.operands[0]
    if not (len(shape) == 4 and _static(shape) and _static(x.shape) and shape[1] % 16 == 0):
        return False
    if m.kind == "conv2d_bf16p":   # output rows flattened without dropped columns
        return _whole_rows(m) and _vector_epilogue(m, rows=True)
    return bool(m.attrs.get("pairs")) and not m.attrs.get("winograd") \
        and _vector_epilogue(m, rows=False)


def _depthwise_producer_ok(func: PrimFunc) -> bool:
    """``func`` is a depthwise convolution (``conv2d``, one input channel per group, every
    channel its own group, horizontal stride 1 or 2: codegen/depthwise/static.py's kernel)
    with static shapes, an even number of output channels and an epilogue the vector path
    computes, its only output the tensor: it may write that as unpadded pair words, each
    channel's values rounded into its half of its pair's words (``bf16_pairs_out`` (0, 0, 0,
    0), ``bf16_pair_depthwise``)."""
    m = _match(func, kinds=("conv2d",))
    if m is None:
        return False
    x, w = m.operands
    shape = tuple(m.out.shape)
    if not (len(shape) == 4 and len(x.shape) == 4 and _static(shape) and _static(x.shape)):
        return False
    groups = m.attrs.get("groups", 1)
    return (w.shape[1] == 1 and groups == x.shape[1] and groups > 1 and shape[1] % 2 == 0
            and tuple(m.attrs.get("strides", (1, 1)))[1] in (1, 2)
            and all(d == 1 for d in m.attrs.get("dilation", (1, 1)))
            and _vector_epilogue(m, rows=False))


def _consumer_padding(func: PrimFunc, index: int) -> tuple[int, int, int, int] | None:
    """The padding with which the consumer ``func`` reads its input ``index`` as pair words, or
    None where it does not."""
    m = _match(func)
    if m is None or func.inputs[index] is not m.operands[0]:
        return None
    x = m.operands[0]
    if len(x.shape) != 4 or not _static(x.shape) or not _static(m.out.shape):
        return None
    # the input read by the reduction only (no residual read of it in the epilogue)
    if any(r.tensor is x for s in m.epilogue for r in te.reads(s.body)):
        return None
    padding = tuple(m.attrs.get("padding", (0, 0, 0, 0)))
    if m.kind == "conv2d_bf16p":
        kh, kw = m.operands[1].shape[2:4]
        if (kh, kw) != (1, 1) or tuple(m.attrs.get("strides", (1, 1))) != (1, 1) \
                or any(padding):
            return None
        return padding
    if not m.attrs.get("pairs") or m.attrs.get("tap_pairs") or m.attrs.get("winograd"):
        return None
    return padding


def _fill_reader(func: PrimFunc, index: int) -> bool:
    """Whether ``func`` is a pixel-lane ``nn.conv2d_bf16p`` with a 1x1 window, a stride and no
    padding reading its input ``index`` by its reduction only: its planes (one stride phase)
    can be filled from pair words of any padding (``bf16_pairs_fill``, codegen/bf16conv.py)
    instead of from the float32 input, a quarter of its pixels for a stride of 2."""
    m = _match(func)
    if m is None or m.kind != "conv2d_bf16p" or func.inputs[index] is not m.operands[0]:
        return False
    x = m.operands[0]
    if len(x.shape) != 4 or not _static(x.shape) or not _static(m.out.shape):
        return False
    if any(r.tensor is x for s in m.epilogue for r in te.reads(s.body)):
        return False
    kh, kw = m.operands[1].shape[2:4]
    return (kh, kw) == (1, 1) and tuple(m.attrs.get("strides", (1, 1))) != (1, 1) \
        and not any(m.attrs.get("padding", (0, 0, 0, 0)))


def _fits(shape, padding) -> bool:
    """The padded words (plus 16 words a 1x1 kernel's last vector may read past them) fit the
    float32 tensor's buffer."""
    n, c, h, w = shape
    pt, pl, pb, pr = padding
    words = n * -(-c // 2) * (h + pt + pb) * (w + pl + pr) + 16
    return words <= n * c * h * w


def bf16_pair_activations(mod: IRModule, options: CompileOptions) -> IRModule:
    if options.precision != "bf16" or not options.bf16_pair_activations \
            or not options.bf16_oc_targets or options.bf16_emulate:
        return mod
    out = mod.copy()
    for fname, fn in mod.functions.items():
        if isinstance(fn, Function):
            out.functions[fname] = _rewrite(out, fn, options.bf16_pair_residuals,
                                            options.bf16_pair_shared,
                                            options.bf16_pair_depthwise)
    return out


def _rewrite(mod: IRModule, fn: Function, residuals: bool, shared: bool,
             depthwise: bool = False) -> Function:
    bindings = list(fn.bindings())
    uses = Counter(id(a) for b in bindings for a in used_values(b.value))
    uses.update(id(o) for o in fn.outputs)
    calls = Counter(b.value.func for b in bindings if isinstance(b.value, CallTIR))
    value = {id(b): b.value for b in bindings}   # the calls as rewritten so far
    producer = {id(b.var): b for b in bindings if isinstance(b.value, CallTIR)}
    for b in bindings:
        if not isinstance(b.value, CallTIR):
            continue
        for i, arg in enumerate(b.value.args):
            prod = producer.get(id(arg))
            if prod is None or uses[id(arg)] != 1:
                continue
            pcall, call = value[id(prod)], value[id(b)]
            pfunc, func = mod.functions[pcall.func], mod.functions[call.func]
            if not (isinstance(pfunc, PrimFunc) and isinstance(func, PrimFunc)) \
                    or PAIRS_OUT in pfunc.attrs:
                continue
            # a depthwise producer writes unpadded words only
            dw = depthwise and not _producer_ok(pfunc) and _depthwise_producer_ok(pfunc)
            if not (dw or _producer_ok(pfunc)):
                continue
            padding = _consumer_padding(func, i)
            if padding is None or (dw and any(padding)) \
                    or not _fits(tuple(pfunc.outputs[0].shape), padding):
                continue
            value[id(prod)] = _with_attr(mod, pcall, pfunc, calls, PAIRS_OUT, padding)
            value[id(b)] = _with_attr(mod, call, func, calls, PAIRS_IN, True)
            break   # one pair-word input per consumer
    if residuals:
        _residual_pairs(mod, bindings, uses, calls, value, producer)
    if shared:
        _shared_pairs(mod, fn, bindings, uses, calls, value, producer)
    blocks = [type(block)([Binding(b.var, value[id(b)], b.source) for b in block.bindings])
              for block in fn.blocks]
    return Function(fn.name, list(fn.params), blocks, list(fn.outputs), list(fn.output_names))


def _residual_read(func: PrimFunc, index: int, padding) -> bool:
    """Whether the bf16 convolution ``func`` reads its input ``index`` only in its epilogue,
    at the output's own indices (a residual), a vector along a row at a time (channel lanes),
    or along rows its vector epilogue takes whole (pixel lanes, then only an unpadded
    ``padding``): so that it may read it as pair words of that padding."""
    m = _match(func)
    if m is None:
        return False
    t = func.inputs[index]
    if t is m.operands[0] or tuple(t.shape) != tuple(m.out.shape) or not _static(m.out.shape):
        return False
    reads = [(r, s) for s in m.epilogue for r in te.reads(s.body) if r.tensor is t]
    if not reads or any(list(r.indices) != list(s.axes) for r, s in reads):
        return False
    if m.kind == "conv2d_oc":
        return bool(m.attrs.get("pairs")) and not m.attrs.get("winograd") \
            and _vector_epilogue(m, rows=False)
    return not any(padding) and _whole_rows(m) and _vector_epilogue(m, rows=True)


def _residual_pairs(mod: IRModule, bindings, uses: Counter, calls: Counter, value: dict,
                    producer: dict) -> None:
    """A tensor read by a bf16 convolution that takes pair words (as its input) and by one
    bf16 convolution's epilogue (a residual, ``_residual_read``): a ResNet block's output,
    written as pair words too (``bf16_pairs_out``, the first reader's padding), read in place
    by the first (``bf16_pairs_in``) and widened from its half word by the second
    (``bf16_pairs_read``: (input index, padding) pairs). The residual then adds the
    bf16-rounded value (as OpenVINO's bf16 does): outputs change, within the export's bf16
    guard."""
    readers: dict[int, list] = {}
    for b in bindings:
        if isinstance(b.value, CallTIR):
            for i, arg in enumerate(b.value.args):
                readers.setdefault(id(arg), []).append((b, i))
    for b in bindings:
        prod_b = producer.get(id(b.var))
        if prod_b is None or uses[id(b.var)] != 2 or len(readers.get(id(b.var), ())) != 2:
            continue
        pcall = value[id(prod_b)]
        pfunc = mod.functions[pcall.func]
        if PAIRS_OUT in pfunc.attrs or not _producer_ok(pfunc):
            continue
        (r1, i1), (r2, i2) = readers[id(b.var)]
        for (conv, ci), (res, ri) in (((r1, i1), (r2, i2)), ((r2, i2), (r1, i1))):
            cfunc, rfunc = mod.functions[value[id(conv)].func], mod.functions[value[id(res)].func]
            if conv is res or PAIRS_IN in cfunc.attrs:
                continue
            padding = _consumer_padding(cfunc, ci)
            if padding is None or not _residual_read(rfunc, ri, padding) \
                    or not _fits(tuple(pfunc.outputs[0].shape), padding):
                continue
            value[id(prod_b)] = _with_attr(mod, pcall, pfunc, calls, PAIRS_OUT, padding)
            value[id(conv)] = _with_attr(mod, value[id(conv)], cfunc, calls, PAIRS_IN, True)
            rfunc = mod.functions[value[id(res)].func]
            value[id(res)] = _with_attr(mod, value[id(res)], rfunc, calls, PAIRS_READ,
                                        tuple(rfunc.attrs.get(PAIRS_READ, ()))
                                        + ((ri, padding),))
            break


def _shared_pairs(mod: IRModule, fn: Function, bindings, uses: Counter, calls: Counter,
                  value: dict, producer: dict) -> None:
    """A tensor still float32 whose every reader is a bf16 convolution's reduction that takes
    pair words: in place (``_consumer_padding``) or through its plane fill (``_fill_reader``:
    a strided 1x1 on pixel lanes, any padding): a ResNet stage's first block input, read by
    the block's first convolution and by its downsample. The producer writes the words with
    the largest padding the in-place readers want (none where a pixel-lane 1x1 reads them in
    place); a channel-lane reader of a smaller padding reads its frame within them
    (``bf16_pairs_in`` = the words' padding, codegen/conv_oc.py). The outputs are bit for bit
    those without (the same words, made by the producer instead of each reader)."""
    readers: dict[int, list] = {}
    for b in bindings:
        if isinstance(b.value, CallTIR):
            for i, arg in enumerate(b.value.args):
                readers.setdefault(id(arg), []).append((b, i))
    outputs = {id(o) for o in fn.outputs}
    for b in bindings:
        prod_b = producer.get(id(b.var))
        found = readers.get(id(b.var), ())
        if prod_b is None or id(b.var) in outputs or len(found) < 2 \
                or uses[id(b.var)] != len(found) or len({id(r) for r, _ in found}) != len(found):
            continue
        pcall = value[id(prod_b)]
        pfunc = mod.functions[pcall.func]
        if PAIRS_OUT in pfunc.attrs or not _producer_ok(pfunc):
            continue
        own, exact, fills, ok = {}, False, [], True
        for r, i in found:
            rfunc = mod.functions[value[id(r)].func]
            if not isinstance(rfunc, PrimFunc) or PAIRS_IN in rfunc.attrs \
                    or PAIRS_FILL in rfunc.attrs:
                ok = False
                break
            padding = _consumer_padding(rfunc, i)
            if padding is not None:
                own[id(r)] = padding
                # the pixel-lane 1x1 reads unpadded words only; the channel-lane kernel
                # reads its own padding's frame within larger padded words
                exact = exact or _match(rfunc).kind == "conv2d_bf16p"
            elif _fill_reader(rfunc, i):
                fills.append(r)
            else:
                ok = False
                break
        padding = tuple(max(p[k] for p in own.values()) if own else 0 for k in range(4))
        if not ok or (exact and any(padding)) \
                or not _fits(tuple(pfunc.outputs[0].shape), padding):
            continue
        value[id(prod_b)] = _with_attr(mod, pcall, pfunc, calls, PAIRS_OUT, padding)
        for r, _ in found:
            rfunc = mod.functions[value[id(r)].func]
            key, val = (PAIRS_FILL, padding) if r in fills else \
                (PAIRS_IN, True if own[id(r)] == padding else padding)
            value[id(r)] = _with_attr(mod, value[id(r)], rfunc, calls, key, val)


def _with_attr(mod: IRModule, call: CallTIR, func: PrimFunc, calls: Counter, key: str,
               value) -> CallTIR:
    """``call`` of a copy of ``func`` with ``attrs[key] = value`` (in place when ``call`` is
    its only caller)."""
    new = replace(func, attrs={**func.attrs, key: value})
    if calls[call.func] == 1:
        mod.functions[call.func] = new
        return call
    name = mod.add_prim_func(new)
    calls[name] = 1
    calls[call.func] -= 1
    return CallTIR(name, call.args, call.type)
