"""Dynamic quantization (onnxruntime's quantize_dynamic) on the integer kernels, with a
float32 epilogue; passes of ``passes/fuse_qdq.py``: MatMulInteger / ConvInteger chains scaled
back to float (``plan_integer_products``, ``plan_integer_convs``), DynamicQuantizeLSTM's input
projection (``plan_requantized_products``: its weights were dequantized at import; the integers
are recovered exactly from the float32 constant) and its recurrent product
(``integer_recurrences``)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ir.graph import Binding, Call, Constant, Function, TensorType, Value, Var
from ..ops.qlinear import PANEL, pack_conv_weights, pack_weights_offset
from .fuse_qdq_common import I8, const_of, conv_channels, matmul_columns, sole_reader, static_shapes


def integer_recurrences(fn: Function) -> Function:
    """DynamicQuantizeLSTM's recurrent product (``nn.recurrence`` with ``quantize_h``) in
    integers, as ONNX Runtime computes it: when the packed float32 R is exactly int8 times a
    scale per weight row (it was dequantized at import; ``_integer_columns`` recovers both),
    R becomes the int8 constant of ``pack_recurrent_int8`` and its scales a further input
    (``int_r``), so each step streams 1 byte per weight instead of 4 (an LSTM with H = 512
    reads 1 MB per step and direction instead of 4 MB)."""
    changed = False
    blocks = []
    for block in fn.blocks:
        new_block = type(block)()
        for b in block.bindings:
            v = b.value
            new = _integer_recurrence(v) if (isinstance(v, Call) and v.op == "nn.recurrence"
                                             and v.attrs.get("quantize_h")
                                             and not v.attrs.get("int_r")) else None
            if new is not None:
                changed = True
                v = new
            new_block.bindings.append(Binding(b.var, v, b.source))
        blocks.append(new_block)
    if not changed:
        return fn
    return Function(fn.name, list(fn.params), blocks, list(fn.outputs), list(fn.output_names))


def _integer_recurrence(c: Call) -> Call | None:
    from ..ops.sequence import UNIT_BLOCK, pack_recurrent_int8, unpack_recurrent
    packed = const_of(c.args[1])
    hidden = int(c.attrs["hidden"])
    if (packed is None or packed.dtype != np.float32 or c.attrs.get("cell") != "lstm"
            or len(c.args) != 4):
        return None
    rr = unpack_recurrent(packed, "lstm", hidden, False)          # [D, 4H, H]
    dirs = rr.shape[0]
    ints, scales = [], []
    for d in range(dirs):
        got = _integer_columns(np.ascontiguousarray(rr[d].T))     # columns: the 4H rows
        if got is None or got[0].min() < -128 or got[0].max() > 127:
            return None
        ints.append(got[0].T)
        scales.append(got[1])
    hpad = -(-hidden // UNIT_BLOCK) * UNIT_BLOCK
    scale = np.zeros((dirs, 4, hpad), np.float32)
    scale[:, :, :hidden] = np.stack(scales).reshape(dirs, 4, hidden)
    q = pack_recurrent_int8(np.stack(ints).astype(np.int8))
    return Call("nn.recurrence", [c.args[0], Constant("r_int8", q), c.args[2], c.args[3],
                                  Constant("r_scale", scale.reshape(dirs, 4 * hpad))],
                {**c.attrs, "int_r": True}, c.type)


def _unit(v: Value) -> bool:
    a = const_of(v)
    return a is not None and a.size == 1 and a.dtype in (np.float32, np.float64) and a.item() == 1.0


def _integer_operands(c: Call, defs: dict, w_ndim: int):
    """The integer operands of a float ``matmul`` / ``nn.conv2d`` of two dequantizes with unit
    scales, as the importer writes MatMulInteger / ConvInteger: (x int8/uint8, its scalar zero
    point xzp, the constant weights w int8/uint8 with ``w_ndim`` dims, ws, wzp), else None."""
    dx, dw = defs.get(id(c.args[0])), defs.get(id(c.args[1]))
    if (dx is None or dw is None or dx.op != "dequantize" or dw.op != "dequantize"
            or len(dx.args) != 3 or len(dw.args) != 3):
        return None
    x, xs, xzp = dx.args
    w, ws, wzp = (const_of(a) for a in dw.args)
    if (x.type.dtype not in I8 or not _unit(xs) or xzp.type.shape != ()
            or xzp.type.dtype not in I8 + ("int32",) or w is None or ws is None
            or wzp is None or w.dtype.name not in I8 or w.ndim != w_ndim
            or ws.size != 1 or ws.item() != 1.0):
        return None
    return x, xzp, w, ws, wzp


def plan_integer_products(fn: Function, defs: dict, uses: Counter, reader_of: dict) -> dict:
    """ONNX MatMulInteger with its result scaled back to float (what ONNX Runtime's dynamic
    quantizer writes, e.g. ddddocr's vocabulary projection), as the importer writes it:

        cast(cast(matmul(dequantize(x, 1, xzp), dequantize(W const, 1, wzp)), int32), float32)
        [* s] [+ b]

    x int8/uint8 with a zero point that may be computed at run time (DynamicQuantizeLinear),
    s a float32 scalar (run time too) or a constant per column, b a float32 constant per
    column or scalar. The importer emits the float matmul only where its sums are exact, so
    the int32 accumulation of ``qmatmul`` gives the same integers; its float32 epilogue is
    float32(acc) * s + b, the graph's operations in order. Returns {id(var the chain ends in):
    the ``qmatmul`` call}, as ``fuse_qdq_float.plan_float_products``."""
    plan: dict[int, Call] = {}

    for b in fn.bindings():
        c = b.value
        if (not isinstance(c, Call) or c.op != "matmul" or len(c.args) != 2
                or set(c.attrs) - {"transpose_b"}):
            continue
        got = _integer_operands(c, defs, 2)
        if got is None or len(got[0].type.shape) < 2:
            continue
        x, xzp, w, ws, wzp = got
        cols = matmul_columns(w, ws, wzp, bool(c.attrs.get("transpose_b", False)))
        if cols is None:
            continue
        wk = cols[0]
        n = wk.shape[1]
        # 8-bit weights and zero points: w - wzp in int16 (a quarter of int64's traffic)
        wide = np.int16 if cols[2].dtype.name in I8 else np.int64
        wd = wk.astype(wide) - cols[2].astype(wide).reshape(1, n)
        if (np.abs(wd).sum(axis=0, dtype=np.int64).max() * 255 >= 2 ** 31
                or not static_shapes(x, c)
                or tuple(c.type.shape) != tuple(x.type.shape[:-1]) + (n,)):
            continue
        r1 = sole_reader(reader_of, uses, b.var)
        if r1 is None or r1.value.op != "cast" or r1.value.attrs.get("dtype") != "int32":
            continue
        r2 = sole_reader(reader_of, uses, r1.var)
        if r2 is None or r2.value.op != "cast" or r2.value.attrs.get("dtype") != "float32":
            continue
        end = r2.var
        out_t = r2.value.type
        mult: Value = Constant("dequant_scale", np.ones(-(-n // PANEL) * PANEL, np.float32))
        offset = np.zeros(n, np.float32)
        r = sole_reader(reader_of, uses, end)
        if r is not None and r.value.op == "multiply" and r.value.type == out_t:
            other = [a for a in r.value.args if a is not end]
            s = other[0] if len(other) == 1 else None
            sc = const_of(s) if s is not None else None
            if s is not None and s.type.dtype == "float32" and s.type.shape == ():
                mult, end = s, r.var                       # a scalar, maybe computed
            elif sc is not None and sc.dtype == np.float32 and sc.shape in ((n,), (1, n)):
                pad = np.zeros(-(-n // PANEL) * PANEL, np.float32)
                pad[:n] = sc.reshape(n)
                mult, end = Constant("dequant_scale", pad), r.var
            if end is r.var:
                r = sole_reader(reader_of, uses, end)
        if r is not None and r.value.op == "add" and r.value.type == out_t:
            other = [a for a in r.value.args if a is not end]
            bc = const_of(other[0]) if len(other) == 1 else None
            if (bc is not None and bc.dtype == np.float32
                    and (bc.size == 1 or bc.shape in ((n,), (1, n)))):
                offset = np.broadcast_to(bc.reshape(-1), (n,)).astype(np.float32)
                end = r.var
        wp, w_off = pack_weights_offset(wd)
        npn = wp.shape[0] * PANEL
        off = np.zeros(npn, np.float32)
        off[:n] = offset
        zp = xzp if const_of(xzp) is None else Constant(
            "x_zp", np.asarray(int(const_of(xzp).reshape(())), np.int32))
        args = [x, Constant(f"{getattr(x, 'name', 'x')}_qw", wp), zp,
                Constant("bias_i32", np.zeros(npn, np.int32)), mult,
                Constant("bias_f32", off)]
        plan[id(end)] = Call("qmatmul", args, {"n": n, "dtype": "float32", "w_offset": w_off},
                             out_t)
    return plan


def plan_integer_convs(fn: Function, defs: dict, uses: Counter, reader_of: dict,
                        pre: dict) -> dict:
    """ONNX ConvInteger scaled back to float (onnxruntime's quantize_dynamic of a conv,
    ddddocr's 21 convolutions), as the importer writes it:

        cast(cast(nn.conv2d(dequantize(x, 1, xzp), dequantize(W const, 1, wzp)), int32)
             [+ B int32 [1, O, 1, 1]], float32) [* s]

    x int8/uint8, xzp, B (the bias quantized at run time by the model's own Div / Floor /
    Cast) and the scalar float32 s may all be computed at run time. Becomes a ``qconv2d``
    with a float32 result, float32(acc + B) * s: the graph's integers (the importer emits the
    float convolution only where its sums are exact) and its float operations in order.
    Returns {id(var the chain ends in): the call}; a reshape of B to [O] goes in ``pre``."""
    plan: dict[int, Call] = {}

    for b in fn.bindings():
        c = b.value
        if (not isinstance(c, Call) or c.op != "nn.conv2d" or len(c.args) != 2
                or c.attrs.get("groups", 1) != 1
                or tuple(c.attrs.get("dilation", (1, 1))) != (1, 1)):
            continue
        got = _integer_operands(c, defs, 4)
        if got is None or not static_shapes(got[0], c):
            continue
        x, xzp, w, ws, wzp = got
        o = w.shape[0]
        chans = conv_channels(ws, wzp, o)
        if chans is None:
            continue
        wzp_o = chans[1].astype(np.int64)
        wd = w.astype(np.int64) - wzp_o.reshape(o, 1, 1, 1)
        if np.abs(wd).sum(axis=(1, 2, 3)).max() * 255 >= 2 ** 30:
            continue
        r1 = sole_reader(reader_of, uses, b.var)
        if r1 is None or r1.value.op != "cast" or r1.value.attrs.get("dtype") != "int32":
            continue
        end, steps = r1.var, []
        bias: Value = Constant("bias_i32", np.zeros(o, np.int32))
        r = sole_reader(reader_of, uses, end)
        if r is not None and r.value.op == "add" and r.value.type == r1.value.type:
            other = [a for a in r.value.args if a is not end]
            bv = other[0] if len(other) == 1 else None
            if (bv is not None and bv.type.dtype == "int32"
                    and tuple(bv.type.shape) in ((o,), (1, o, 1, 1))):
                bc = const_of(bv)
                if bc is not None:
                    bias = Constant("bias_i32", bc.reshape(o).astype(np.int32))
                elif tuple(bv.type.shape) == (o,):
                    bias = bv
                else:
                    bias = Var(f"{b.var.name}_bias", TensorType((o,), "int32"))
                    steps.append(Binding(bias, Call("reshape", [bv], {"shape": (o,)},
                                                    bias.type)))
                end = r.var
                r = sole_reader(reader_of, uses, end)
        if r is None or r.value.op != "cast" or r.value.attrs.get("dtype") != "float32":
            continue
        end, out_t = r.var, r.value.type
        mult: Value = Constant("dequant_scale", np.ones(o, np.float32))
        r = sole_reader(reader_of, uses, end)
        if r is not None and r.value.op == "multiply" and r.value.type == out_t:
            other = [a for a in r.value.args if a is not end]
            sv = other[0] if len(other) == 1 else None
            if sv is not None and sv.type.dtype == "float32" and sv.type.shape == ():
                mult, end = sv, r.var
        if steps:
            pre[id(end)] = steps
        args = [x, Constant(f"{getattr(x, 'name', 'x')}_qw", pack_conv_weights(wd)), xzp,
                bias, mult, Constant("bias_f32", np.zeros(o, np.float32))]
        attrs = {"out_channels": o, "kernel": tuple(w.shape[2:]),
                 "strides": tuple(c.attrs["strides"]), "padding": tuple(c.attrs["padding"]),
                 "dtype": "float32"}
        plan[id(end)] = Call("qconv2d", args, attrs, out_t)
    return plan


PROBE_ROWS = 8   # rows a candidate scale is tried on before the whole column (_integer_columns)


def _integer_columns(wk: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(d int64 [K, N], s float32 [N]) with float32(d * s[n]) == wk exactly and |d| <= 255,
    when the float32 constant ``wk`` [K, N] is such a product column by column (weights that
    were dequantized at import, e.g. DynamicQuantizeLSTM's W); else None. The scale of a
    column is searched near max|w| / m for the largest integer m a quantizer maps the largest
    weight to (127, 255, 128, 254), a few float32 ulps either side; every candidate is
    checked on the whole column."""
    if wk.dtype != np.float32 or wk.ndim != 2 or not np.all(np.isfinite(wk)):
        return None
    k, n = wk.shape
    d = np.zeros((k, n), np.int64)
    s = np.ones(n, np.float32)
    top = np.abs(wk).max(axis=0)
    todo = top > 0

    def attempt(cols: np.ndarray, sc: np.ndarray) -> None:
        # the first rows first: a candidate that fails there fails the whole column (the
        # test is elementwise), so most wrong scales cost 8 rows, not k
        probe = wk[:PROBE_ROWS, cols]
        qp = np.rint(probe / sc)
        keep = (sc > 0) & (np.abs(qp) <= 255).all(axis=0) & (
            qp.astype(np.float32) * sc == probe).all(axis=0)
        if not keep.all():
            cols = cols[keep]
            sc = sc[keep] if sc.ndim else sc
        q = np.rint(wk[:, cols] / sc)
        ok = (sc > 0) & (np.abs(q) <= 255).all(axis=0) & (
            q.astype(np.float32) * sc == wk[:, cols]).all(axis=0)
        d[:, cols[ok]] = q[:, ok].astype(np.int64)
        s[cols[ok]] = sc[ok] if sc.ndim else sc
        todo[cols[ok]] = False

    # the smallest integers first (127 before 255: a column that fits int8 stays int8); after
    # each, the scales found so far for the columns whose largest weight is not the
    # quantizer's largest integer (a scale per tensor or per LSTM direction)
    for m in (127, 128, 255, 254):
        for step in (0, 1, -1, 2, -2):
            if todo.any():
                cand = (top / np.float32(m)).astype(np.float32)
                for _ in range(abs(step)):
                    cand = np.nextafter(cand, np.float32(np.inf if step > 0 else 0),
                                        dtype=np.float32)
                cols = np.nonzero(todo)[0]
                attempt(cols, cand[cols])
        for sc in np.unique(s[(top > 0) & ~todo])[::-1][:256]:
            if todo.any():
                attempt(np.nonzero(todo)[0], np.float32(sc))
    return None if todo.any() else (d, s)


def plan_requantized_products(fn: Function, defs: dict, uses: Counter, reader_of: dict,
                               pre: dict) -> dict:
    """matmul([reshape](dequantize(quantize(x, s, zp), s, zp)), W float32 const)[+ b const]
    with W exactly integers times a scale per output column (``_integer_columns``): ONNX
    Runtime's DynamicQuantizeLSTM input projection as the importer writes it (its int8 W
    dequantized at import, X round-tripped through DynamicQuantizeLinear). ONNX Runtime
    computes it as an integer product scaled to float, float32(acc) * (s * w_scale[n]); so
    does the ``qmatmul`` this becomes (s * w_scale computed at run time by a ``multiply``
    put before it, in ``pre``), instead of a float32 product of the dequantized values:
    int8 weights (4x smaller than the float32 ones), same numbers as ORT up to the float32
    rounding of the scale products. Returns {id(var the chain ends in): the call}."""
    plan: dict[int, Call] = {}

    for b in fn.bindings():
        c = b.value
        if (not isinstance(c, Call) or c.op != "matmul" or len(c.args) != 2
                or set(c.attrs) - {"transpose_b"} or c.type.dtype != "float32"):
            continue
        w = const_of(c.args[1])
        if w is None or w.dtype != np.float32 or w.ndim != 2:
            continue
        a = c.args[0]
        r = defs.get(id(a))
        if r is not None and r.op == "reshape":
            if tuple(r.type.shape[-1:]) != tuple(r.args[0].type.shape[-1:]):
                continue
            a = r.args[0]
        dq = defs.get(id(a))
        if dq is None or dq.op != "dequantize" or len(dq.args) != 3:
            continue
        q, xs, xzp = dq.args
        qc = defs.get(id(q))
        if (qc is None or qc.op != "quantize" or len(qc.args) != 3 or qc.args[1] is not xs
                or qc.args[2] is not xzp or q.type.dtype not in I8
                or xs.type.shape != () or xs.type.dtype != "float32" or xzp.type.shape != ()
                or xzp.type.dtype not in I8 or not static_shapes(q, c)):
            continue
        tb = bool(c.attrs.get("transpose_b", False))
        wk = np.ascontiguousarray(w.T if tb else w)
        k, n = wk.shape
        if c.args[0].type.shape[-1] != k or len(c.args[0].type.shape) < 2:
            continue
        got = _integer_columns(wk)
        if got is None or np.abs(got[0]).sum(axis=0).max() * 255 >= 2 ** 31:
            continue
        d, ws = got
        end, offset = b.var, np.zeros(n, np.float32)
        rd = sole_reader(reader_of, uses, end)
        if rd is not None and rd.value.op == "add" and rd.value.type == c.type:
            other = [x for x in rd.value.args if x is not end]
            bc = const_of(other[0]) if len(other) == 1 else None
            if (bc is not None and bc.dtype == np.float32
                    and (bc.size == 1 or bc.shape in ((n,), (1, n)))):
                offset = np.broadcast_to(bc.reshape(-1), (n,)).astype(np.float32)
                end = rd.var
        wp, w_off = pack_weights_offset(d)
        npn = wp.shape[0] * PANEL
        ws_pad, off = np.zeros(npn, np.float32), np.zeros(npn, np.float32)
        ws_pad[:n], off[:n] = ws, offset
        steps = []
        x_in = q
        if tuple(q.type.shape) != tuple(c.args[0].type.shape):
            x_in = Var(f"{b.var.name}_xq", TensorType(tuple(c.args[0].type.shape), q.type.dtype))
            steps.append(Binding(x_in, Call("reshape", [q], {"shape": tuple(c.args[0].type.shape)},
                                            x_in.type)))
        mult = Var(f"{b.var.name}_scale", TensorType((npn,), "float32"))
        steps.append(Binding(mult, Call("multiply", [xs, Constant("w_scale", ws_pad)], {},
                                        mult.type)))
        pre[id(end)] = steps
        args = [x_in, Constant(f"{b.var.name}_qw", wp), xzp,
                Constant("bias_i32", np.zeros(npn, np.int32)), mult, Constant("bias_f32", off)]
        plan[id(end)] = Call("qmatmul", args, {"n": n, "dtype": "float32", "w_offset": w_off},
                             c.type)
    return plan
