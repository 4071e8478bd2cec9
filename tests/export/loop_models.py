"""Small ONNX loops run by the VM (format 1.8: LOOP ... NEXT), shared by
tests/export/test_run_time_loops.py and the C runtime's test: ``counted_loop`` (below), a Scan
over an open axis (``open_scan``) and a Loop over a tensor's rows with a scan output and a break
(``rows_loop``), two nested Loops (``nested_loops``), and a Loop on a fed trip count whose scan
outputs have no bound at export (``stored_rows``, format 1.9's row stores), a greedy decode
whose carried values grow (``grown_values``, format 1.10), and a decoder loop whose body reads
carried values that grow, shrink or are recomputed at another size (``kv_cache``).

``counted_loop``: a Loop whose trip count and condition are graph inputs, with a break
condition computed in the body and an If on the iteration number inside the body (a jump within
the loop's body).

M int64 scalar, cond bool scalar, x0 float32 [N], lim float32 [1]; carried x [N], s [1]:
    for i in range(M) while cond:
        x = (x * 1.5 if i % 2 == 0 else x * -0.5) + i
        s = s + sum(x)
        cond = s < lim
    outputs x, s
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _scaled(tag: str, scale: float) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Mul", ["x", f"{tag}_k"], [f"{tag}_y"])], tag, [],
        [helper.make_tensor_value_info(f"{tag}_y", F, None)],
        [numpy_helper.from_array(np.array(scale, np.float32), f"{tag}_k")])


def counted_loop(path: Path, symbolic: bool = True) -> Path:
    """The model above, saved at ``path`` (``symbolic``: x's length open, else 3)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mod", ["i", "two"], ["odd"]),
         helper.make_node("Equal", ["odd", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["xm"], then_branch=_scaled("up", 1.5),
                          else_branch=_scaled("down", -0.5)),
         helper.make_node("Add", ["xm", "fi"], ["x2"]),
         helper.make_node("ReduceSum", ["x2"], ["total"], keepdims=1),
         helper.make_node("Add", ["s", "total"], ["s2"]),
         helper.make_node("Less", ["s2", "lim"], ["below"]),
         helper.make_node("Squeeze", ["below"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("x", F, None), helper.make_tensor_value_info("s", F, [1])],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("x2", F, None), helper.make_tensor_value_info("s2", F, [1])],
        [numpy_helper.from_array(np.array(2, np.int64), "two"),
         numpy_helper.from_array(np.array(0, np.int64), "zero")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "x0", "s0"], ["x", "s"], body=body)],
        "counted_loop",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("cond", B, []),
         helper.make_tensor_value_info("x0", F, ["N"] if symbolic else [3]),
         helper.make_tensor_value_info("lim", F, [1])],
        [helper.make_tensor_value_info("x", F, None), helper.make_tensor_value_info("s", F, None)],
        [numpy_helper.from_array(np.zeros(1, np.float32), "s0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def open_scan(path: Path) -> Path:
    """A Scan over x [4, L] along axis 1, backwards, L open (no --max-shape): two states and
    a scan output written forwards along axis 1 (ONNX's test_scan9 pattern)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Mul", ["p_in", "x_t"], ["p_out"]),
         helper.make_node("Sub", ["s_out", "p_out"], ["scan_out"])],
        "body", [helper.make_tensor_value_info(n, F, [4]) for n in ("s_in", "p_in", "x_t")],
        [helper.make_tensor_value_info(n, F, [4]) for n in ("s_out", "p_out", "scan_out")])
    node = helper.make_node("Scan", ["s0", "p0", "x"], ["s", "p", "z"], body=body,
                            num_scan_inputs=1, scan_input_axes=[1], scan_input_directions=[1],
                            scan_output_axes=[1], scan_output_directions=[0])
    graph = helper.make_graph(
        [node], "open_scan",
        [helper.make_tensor_value_info("s0", F, [4]), helper.make_tensor_value_info("p0", F, [4]),
         helper.make_tensor_value_info("x", F, [4, "L"])],
        [helper.make_tensor_value_info(k, F, None) for k in ("s", "p", "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def open_scan_feeds(length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"s0": rng.standard_normal(4).astype(np.float32),
            "p0": rng.standard_normal(4).astype(np.float32),
            "x": rng.standard_normal((4, length)).astype(np.float32)}


def rows_loop(path: Path) -> Path:
    """``for i in range(x.shape[0])`` as torch.jit exports it (the trip count Shape(x)[0], N
    open, no --max-shape), summing x's rows and emitting 2 * the sum each iteration (a scan
    output), breaking once the sum's total reaches ``lim``."""
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
         helper.make_node("Add", ["acc", "row"], ["acc2"]),
         helper.make_node("Mul", ["acc2", "two"], ["out"]),
         helper.make_node("ReduceSum", ["acc2"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "lim"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         helper.make_tensor_value_info("acc", F, [3])],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("acc2", F, [3]), helper.make_tensor_value_info("out", F, [3])],
        [numpy_helper.from_array(np.array(2, np.float32), "two")])
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
         helper.make_node("Loop", ["n", "", "acc0"], ["acc", "outs"], body=body)], "rows_loop",
        [helper.make_tensor_value_info("x", F, ["N", 3]), helper.make_tensor_value_info("lim", F, [])],
        [helper.make_tensor_value_info("acc", F, None), helper.make_tensor_value_info("outs", F, None)],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.zeros(3, np.float32), "acc0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def rows_loop_feeds(n: int, lim: float, seed: int = 0) -> dict[str, np.ndarray]:
    x = np.abs(np.random.default_rng(seed).standard_normal((n, 3))).astype(np.float32)
    return {"x": x, "lim": np.array(lim, np.float32)}


def nested_loops(path: Path) -> Path:
    """A Loop of M iterations (a graph input) whose body runs a Loop of K iterations (another
    graph input, read from the outer scope): two nested LOOP ... NEXT regions."""
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    inner = helper.make_graph(
        [helper.make_node("Cast", ["j"], ["fj"], to=F), helper.make_node("Add", ["a", "fj"], ["a2"]),
         helper.make_node("Mul", ["a2", "half"], ["a3"]),
         helper.make_node("Identity", ["cj"], ["cj_out"])],
        "inner", [helper.make_tensor_value_info("j", I64, []), helper.make_tensor_value_info("cj", B, []),
                  helper.make_tensor_value_info("a", F, [2])],
        [helper.make_tensor_value_info("cj_out", B, []), helper.make_tensor_value_info("a3", F, [2])],
        [half])
    outer = helper.make_graph(
        [helper.make_node("Loop", ["K", "", "y"], ["y2"], body=inner),
         helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Add", ["y2", "fi"], ["y3"]),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "outer", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
                  helper.make_tensor_value_info("y", F, [2])],
        [helper.make_tensor_value_info("c_out", B, []), helper.make_tensor_value_info("y3", F, [2])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "y0"], ["yf"], body=outer)], "nested_loops",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("K", I64, []),
         helper.make_tensor_value_info("y0", F, [2])], [helper.make_tensor_value_info("yf", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def nested_feeds(m: int, k: int) -> dict[str, np.ndarray]:
    return {"M": np.array(m, np.int64), "K": np.array(k, np.int64),
            "y0": np.array([1.0, -2.0], np.float32)}


def feeds(m: int, cond: bool = True, lim: float = 1e9, n: int = 3, seed: int = 0
          ) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return {"M": np.array(m, np.int64), "cond": np.array(cond), "x0": x,
            "lim": np.array([lim], np.float32)}


def stored_rows(path: Path, open_lim: bool = False) -> Path:
    """A Loop whose trip count M is a graph input, with two scan outputs whose rows have no bound
    at export (format 1.9: row stores): ``rows`` (float32 [3] a row, the carried value) and
    ``iters`` (the iteration number, int64 scalars); it breaks once the carried sum reaches
    ``lim`` (``open_lim``: the sum of ``lim`` float32 [N], N open, so the plan is made per
    shape at run time).

        for i in range(M) while cond: acc = acc * 0.5 + i; rows += [acc]; iters += [i];
                                      cond = sum(acc) < lim
    """
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["acc", "half"], ["scaled"]),
         helper.make_node("Add", ["scaled", "fi"], ["acc2"]),
         helper.make_node("ReduceSum", ["acc2"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "lim"], ["cond_out"]),
         helper.make_node("Identity", ["acc2"], ["row"]),
         helper.make_node("Identity", ["i"], ["it"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         helper.make_tensor_value_info("acc", F, [3])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("acc2", F, [3]),
         helper.make_tensor_value_info("row", F, [3]), helper.make_tensor_value_info("it", I64, [])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    nodes = [helper.make_node("Loop", ["M", "", "x0"], ["acc", "rows", "iters"], body=body)]
    if open_lim:   # the body reads the outer "lim" scalar: the sum of an open-length input
        nodes.insert(0, helper.make_node("ReduceSum", ["lims"], ["lim"], keepdims=0))
    graph = helper.make_graph(
        nodes, "stored_rows",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("x0", F, [3]),
         helper.make_tensor_value_info("lims", F, ["N"]) if open_lim
         else helper.make_tensor_value_info("lim", F, [])],
        [helper.make_tensor_value_info("acc", F, None), helper.make_tensor_value_info("rows", F, None),
         helper.make_tensor_value_info("iters", I64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def stored_feeds(m: int, lim: float = 1e9, seed: int = 0, n: int = 0
                 ) -> dict[str, np.ndarray]:
    """Feeds of ``stored_rows``; ``n`` > 0: of its ``open_lim`` form, ``lim`` spread over n."""
    x = np.random.default_rng(seed).standard_normal(3).astype(np.float32)
    if n:
        return {"M": np.array(m, np.int64), "x0": x, "lims": np.full(n, lim / n, np.float32)}
    return {"M": np.array(m, np.int64), "x0": x, "lim": np.array(lim, np.float32)}


def onnx_loop11(path: Path) -> Path:
    """ONNX's node test ``test_loop11`` (onnx 1.22.0's data), as shipped: a Loop on a fed trip
    count whose body slices a constant [1, 2, 3, 4, 5] by the iteration number (``x[i:i+1]``,
    a Slice whose starts and ends are computed at run time), adds it to the carried ``y`` (its
    extent the slice's counted length) and emits ``y`` as a scan output with no bound."""
    import shutil

    src = Path(onnx.__file__).parent / "backend/test/data/node/test_loop11/model.onnx"
    shutil.copyfile(src, path)
    return path


def loop11_feeds(m: int, cond: bool = True) -> dict[str, np.ndarray]:
    return {"trip_count": np.array(m, np.int64), "cond": np.array(cond),
            "y": np.array([-2.0], np.float32)}


def grown_values(path: Path) -> Path:
    """A greedy decode (format 1.10: carried values that grow between iterations): a Loop on a
    fed trip count M with a break, whose body steps a hidden state and appends to three carried
    values that only a Concat reads, as a torch export of ``tokens = torch.cat([tokens, tok],
    1)`` writes:

        for i in range(M) while cond:
            h = tanh(h @ W + i * 0.25)
            tokens = Concat(tokens, ArgMax(h)[None, :], axis=1)     # int64 [1, T + i]
            hist = Concat(hist, h[None, :], axis=0)                 # float32 [i, 4] from [0, 4]
            kept = Concat(kept, Compress(h, h > 0), axis=0)         # a counted number each time
            cond = sum(h) < lim
        outputs h, tokens, hist, kept

    ``tokens0`` [1, T] is an input of open length T (the prompt); ``hist`` starts empty (a
    constant [0, 4]), ``kept`` with ``kept0`` [K] (K open)."""
    w = (np.arange(16, dtype=np.float32).reshape(4, 4) % 5 - 2) * 0.4
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["fi", "quarter"], ["shift"]),
         helper.make_node("MatMul", ["h_in", "w"], ["hw"]),
         helper.make_node("Add", ["hw", "shift"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("ArgMax", ["h_out"], ["tok"], axis=0, keepdims=1),
         helper.make_node("Unsqueeze", ["tok", "zero"], ["tok2"]),
         helper.make_node("Concat", ["tokens_in", "tok2"], ["tokens_out"], axis=1),
         helper.make_node("Unsqueeze", ["h_out", "zero"], ["h_row"]),
         helper.make_node("Concat", ["hist_in", "h_row"], ["hist_out"], axis=0),
         helper.make_node("Greater", ["h_out", "zerof"], ["pos"]),
         helper.make_node("Compress", ["h_out", "pos"], ["sel"], axis=0),
         helper.make_node("Concat", ["kept_in", "sel"], ["kept_out"], axis=0),
         helper.make_node("ReduceSum", ["h_out"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "lim"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         helper.make_tensor_value_info("h_in", F, [4]),
         helper.make_tensor_value_info("tokens_in", I64, [1, None]),
         helper.make_tensor_value_info("hist_in", F, [None, 4]),
         helper.make_tensor_value_info("kept_in", F, [None])],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("h_out", F, [4]),
         helper.make_tensor_value_info("tokens_out", I64, [1, None]),
         helper.make_tensor_value_info("hist_out", F, [None, 4]),
         helper.make_tensor_value_info("kept_out", F, [None])],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array(0.25, np.float32), "quarter"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array(0.0, np.float32), "zerof")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "h0", "tokens0", "hist0", "kept0"],
                          ["h", "tokens", "hist", "kept"], body=body)],
        "grown_values",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("h0", F, [4]),
         helper.make_tensor_value_info("tokens0", I64, [1, "T"]),
         helper.make_tensor_value_info("kept0", F, ["K"]),
         helper.make_tensor_value_info("lim", F, [])],
        [helper.make_tensor_value_info("h", F, None), helper.make_tensor_value_info("tokens", I64, None),
         helper.make_tensor_value_info("hist", F, None), helper.make_tensor_value_info("kept", F, None)],
        [numpy_helper.from_array(np.zeros((0, 4), np.float32), "hist0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def grown_feeds(m: int, lim: float = 1e9, seed: int = 0, t: int = 2, k: int = 1
                ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"M": np.array(m, np.int64), "h0": rng.standard_normal(4).astype(np.float32),
            "tokens0": rng.integers(0, 4, (1, t)).astype(np.int64),
            "kept0": rng.standard_normal(k).astype(np.float32),
            "lim": np.array(lim, np.float32)}


def kv_cache(path: Path) -> Path:
    """A decoder step loop whose carried values change extent and are read by the body (no
    format change: ``carriedK`` sizes bound at run time, ``carried_copy``): a Loop on a fed trip
    count M with a break,

        for i in range(M) while cond:
            k, v = (h @ Wk).reshape(1, 2, 1, 4), (h @ Wv).reshape(1, 2, 1, 4)
            cache = Concat(cache, k, axis=2)             # [1, 2, P + i, 4]: 2 heads before T
            vals = Concat(vals, v, axis=2)               # the values' cache, as long
            q = (h @ Wq).reshape(1, 2, 1, 4)
            a = softmax(q @ cache^T) @ vals               # attention over the whole cache
            h = tanh(a.reshape(1, 8) + h * 0.5 + T(cache) * 0.01 + sum(queue) * 0.1
                     + sum(sel) * 0.05 + i * 0.1)
            queue = queue[1:]                             # shrinks to empty
            sel = Compress(h.reshape(8), h > 0)           # recomputed at a counted size
            cond = sum(h) < lim
        outputs h, cache, queue, sel, mean(cache, axis=2), vals  # a reader after the loop

    ``cache0`` and ``vals0`` [1, 2, P, 4] (P open: the prompt's keys and values), ``queue0``
    [Q] and ``sel0`` [S] open."""
    rng = np.random.default_rng(7)
    wk, wq, wv = (rng.standard_normal((3, 8, 8)) * 0.5).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["fi", "tenth"], ["shift"]),
         helper.make_node("MatMul", ["h_in", "wk"], ["hk"]),
         helper.make_node("Reshape", ["hk", "head_shape"], ["k"]),
         helper.make_node("Concat", ["cache_in", "k"], ["cache_out"], axis=2),
         helper.make_node("MatMul", ["h_in", "wv"], ["hv"]),
         helper.make_node("Reshape", ["hv", "head_shape"], ["v"]),
         helper.make_node("Concat", ["vals_in", "v"], ["vals_out"], axis=2),
         helper.make_node("MatMul", ["h_in", "wq"], ["hq"]),
         helper.make_node("Reshape", ["hq", "head_shape"], ["q"]),
         helper.make_node("Transpose", ["cache_out"], ["kt"], perm=[0, 1, 3, 2]),
         helper.make_node("MatMul", ["q", "kt"], ["scores"]),
         helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
         helper.make_node("MatMul", ["probs", "vals_out"], ["att"]),
         helper.make_node("Reshape", ["att", "row_shape"], ["att_row"]),
         helper.make_node("Mul", ["h_in", "half"], ["h_half"]),
         helper.make_node("Shape", ["cache_out"], ["cshape"]),
         helper.make_node("Gather", ["cshape", "two"], ["clen"], axis=0),
         helper.make_node("Cast", ["clen"], ["fclen"], to=F),
         helper.make_node("Mul", ["fclen", "hundredth"], ["pos"]),
         helper.make_node("ReduceSum", ["queue_in"], ["qsum"], keepdims=0),
         helper.make_node("Mul", ["qsum", "tenth"], ["qterm"]),
         helper.make_node("ReduceSum", ["sel_in"], ["ssum"], keepdims=0),
         helper.make_node("Mul", ["ssum", "twentieth"], ["sterm"]),
         helper.make_node("Sum", ["att_row", "h_half", "pos", "qterm", "sterm", "shift"],
                          ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("Slice", ["queue_in", "one", "big", "zero"], ["queue_out"]),
         helper.make_node("Reshape", ["h_out", "flat"], ["h_flat"]),
         helper.make_node("Greater", ["h_flat", "zerof"], ["pos_mask"]),
         helper.make_node("Compress", ["h_flat", "pos_mask"], ["sel_out"], axis=0),
         helper.make_node("ReduceSum", ["h_out"], ["tot"], keepdims=0),
         helper.make_node("Less", ["tot", "lim"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         helper.make_tensor_value_info("h_in", F, [1, 8]),
         helper.make_tensor_value_info("cache_in", F, [1, 2, None, 4]),
         helper.make_tensor_value_info("queue_in", F, [None]),
         helper.make_tensor_value_info("sel_in", F, [None]),
         helper.make_tensor_value_info("vals_in", F, [1, 2, None, 4])],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("h_out", F, [1, 8]),
         helper.make_tensor_value_info("cache_out", F, [1, 2, None, 4]),
         helper.make_tensor_value_info("queue_out", F, [None]),
         helper.make_tensor_value_info("sel_out", F, [None]),
         helper.make_tensor_value_info("vals_out", F, [1, 2, None, 4])],
        [numpy_helper.from_array(wk, "wk"), numpy_helper.from_array(wq, "wq"),
         numpy_helper.from_array(wv, "wv"),
         numpy_helper.from_array(np.array([1, 2, 1, 4], np.int64), "head_shape"),
         numpy_helper.from_array(np.array([1, 8], np.int64), "row_shape"),
         numpy_helper.from_array(np.array([8], np.int64), "flat"),
         numpy_helper.from_array(np.array(2, np.int64), "two"),
         numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.array([1 << 40], np.int64), "big"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array(0.0, np.float32), "zerof"),
         numpy_helper.from_array(np.array(0.5, np.float32), "half"),
         numpy_helper.from_array(np.array(0.1, np.float32), "tenth"),
         numpy_helper.from_array(np.array(0.05, np.float32), "twentieth"),
         numpy_helper.from_array(np.array(0.01, np.float32), "hundredth")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "h0", "cache0", "queue0", "sel0", "vals0"],
                          ["h", "cache", "queue", "sel", "vals"], body=body),
         helper.make_node("ReduceMean", ["cache", "axis2"], ["cache_mean"], keepdims=0)],
        "kv_cache",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("h0", F, [1, 8]),
         helper.make_tensor_value_info("cache0", F, [1, 2, "P", 4]),
         helper.make_tensor_value_info("queue0", F, ["Q"]),
         helper.make_tensor_value_info("sel0", F, ["S"]),
         helper.make_tensor_value_info("lim", F, []),
         helper.make_tensor_value_info("vals0", F, [1, 2, "P", 4])],
        [helper.make_tensor_value_info(n, F, None)
         for n in ("h", "cache", "queue", "sel", "cache_mean", "vals")],
        [numpy_helper.from_array(np.array([2], np.int64), "axis2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def kv_feeds(m: int, lim: float = 1e9, seed: int = 0, p: int = 2, q: int = 3, s: int = 1
             ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"M": np.array(m, np.int64), "h0": rng.standard_normal((1, 8)).astype(np.float32),
            "cache0": rng.standard_normal((1, 2, p, 4)).astype(np.float32),
            "queue0": rng.standard_normal(q).astype(np.float32),
            "sel0": rng.standard_normal(s).astype(np.float32),
            "lim": np.array(lim, np.float32),
            "vals0": rng.standard_normal((1, 2, p, 4)).astype(np.float32)}


# the "stored" bundle's row stores stop at this many bytes (40 rows of float32 [3]), so that a
# loop that would pass them is refused in a test of seconds (the export's default is 256 MiB)
STORED_TEST_BYTES = 480

# the "grown" bundle's carried values stop at this many bytes (128 tokens, 64 rows of hist, 256
# kept values), so that a loop that would pass them is refused in a test of seconds
GROWN_TEST_BYTES = 1024

# the "kv" bundle's resized values stop at this many bytes past their initial extents (64 cache
# rows of 2 x 4 floats, 512 queue or sel values), so that a loop past them is refused quickly
KV_TEST_BYTES = 2048

MODELS = {"counted": lambda p: counted_loop(p), "counted-static": lambda p: counted_loop(p, False),
          "counted-bounded": lambda p: counted_loop(p),
          "open-scan": open_scan, "rows-loop": rows_loop, "nested": nested_loops,
          "stored": stored_rows, "stored-open": lambda p: stored_rows(p, open_lim=True),
          "loop11": onnx_loop11, "grown": grown_values, "kv": kv_cache}


def exported(tmp_path_factory, kind: str = "counted") -> tuple[Path, Path]:
    """(onnx file, bundle) of one of ``MODELS``, exported with the command line's defaults
    (golden check on), once per test run (shared with tests/runtime/test_c_runtime.py)."""
    import fcntl
    import os

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / f"loop-{kind}"
    folder.mkdir(exist_ok=True)
    src, bundle = folder / "model.onnx", folder / "model.mlc"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not bundle.exists():
            from mlcpack.packager.api import Options, export

            from mlcpack.frontends.onnx import loops

            MODELS[kind](src)
            # "counted-bounded": one arena planned at x0's largest length for every length
            bounds = {"x0": (64,)} if kind == "counted-bounded" else None
            cap = loops.STORE_BYTES
            loops.STORE_BYTES = {"stored": STORED_TEST_BYTES, "grown": GROWN_TEST_BYTES,
                                 "kv": KV_TEST_BYTES}.get(kind, cap)
            try:
                result = export(src, bundle, Options(max_shapes=bounds or {}))
            finally:
                loops.STORE_BYTES = cap
            assert result.check and "golden check passed" in result.check, result.check
    return src, bundle


def instruction_starts(words: list[int]) -> list[int]:
    """The word of each instruction (docs/format.md section 6's encoding)."""
    starts, pc = [], 0
    size = {3: 3, 4: 3, 5: 3, 6: 2, 7: 2, 8: 5, 9: 3, 10: 3}
    while pc < len(words):
        starts.append(pc)
        op = words[pc]
        pc += 3 + words[pc + 2] if op in (1, 2) else size[op]
    return starts


def opcodes(bundle: Path) -> list[int]:
    """The opcode of each instruction of ``bundle``'s (top-level) bytecode."""
    import struct

    from bundle_parts import payload_spans, read_parts

    header, payloads = read_parts(bundle)
    ref = header["vm"]["bytecode"]
    data = payloads[payload_spans(header).index((ref["offset"], ref["size"]))]
    words = list(struct.unpack(f"<{len(data) // 4}i", data))
    return [words[p] for p in instruction_starts(words)]


DAMAGE = ("next_elsewhere", "next_forward", "end_elsewhere", "count_float", "number_constant",
          "jump_out")
# format 1.9's row stores, damaged (damaged_bytecode on the "stored" bundle)
STORE_DAMAGE = ("append_to_arena", "append_other_row", "store_read")


# format 1.10's grown values, damaged (damaged_grows on the "grown" bundle)
GROWN_DAMAGE = ("rows_not_grown", "grows_arena", "grows_duplicate", "grows_not_list")


def damaged_grows(bundle: Path, out: Path, change: str) -> Path:
    """``bundle`` with its vm record's ``grows`` changed (digest valid): "rows_not_grown" (its
    first STORE row left out: its APPENDs of several rows, and of the initial value before the
    loop, then name a 1.9 row store), "grows_arena" (an arena row named), "grows_duplicate" (a
    row named twice), "grows_not_list" (an int)."""
    from bundle_parts import read_parts, write_parts

    header, payloads = read_parts(bundle)
    grows = header["vm"]["grows"]
    if change == "rows_not_grown":
        grows = grows[1:]
    elif change == "grows_arena":
        grows = [next(i for i, t in enumerate(header["tensors"]) if t[0] == 0)] + grows[1:]
    elif change == "grows_duplicate":
        grows = [grows[0]] + grows[:-1]
    elif change == "grows_not_list":
        grows = grows[0]
    else:
        raise ValueError(change)
    header["vm"]["grows"] = grows
    for plan in header.get("plans") or ():
        plan["vm"]["grows"] = grows
    return write_parts(out, header, payloads)


def damaged_bytecode(bundle: Path, out: Path, change: str) -> Path:
    """``bundle`` with its loop's bytecode changed in place (same length, digest valid):
    "next_elsewhere" (NEXT names the word after its LOOP), "end_elsewhere" (LOOP's end is one
    instruction early), "count_float" (the count is a float32 tensor), "number_constant" (the
    iteration number is a constant row: the VM would write it), "jump_out" (the body's JUMP
    leaves the body), "next_forward" (NEXT names a word after itself)."""
    import struct

    from bundle_parts import payload_spans, read_parts, write_parts

    header, payloads = read_parts(bundle)
    ref = header["vm"]["bytecode"]
    k = payload_spans(header).index((ref["offset"], ref["size"]))
    words = list(struct.unpack(f"<{ref['size'] // 4}i", payloads[k]))
    starts = instruction_starts(words)
    head = next(p for p in starts if words[p] == 8)
    nxt = next(p for p in starts if words[p] == 9)
    tensors = header["tensors"]
    if change == "next_elsewhere":
        words[nxt + 2] = head + 5
    elif change == "end_elsewhere":
        words[head + 4] = starts[starts.index(nxt) - 1]
    elif change == "count_float":
        words[head + 1] = next(i for i, t in enumerate(tensors) if t[3] == "float32")
    elif change == "number_constant":
        words[head + 3] = next(i for i, t in enumerate(tensors) if t[0] == 1)
    elif change == "jump_out":
        jump = next(p for p in starts if words[p] == 6 and head < p < nxt)
        words[jump + 1] = nxt + 3
    elif change == "next_forward":
        words[nxt + 2] = nxt + 3
    elif change in STORE_DAMAGE:
        app = next(p for p in starts if words[p] == 10)
        if change == "append_to_arena":   # APPEND into the row it reads (an arena row)
            words[app + 1] = words[app + 2]
        elif change == "append_other_row":   # a row of another shape: the trip count
            words[app + 2] = words[head + 1]
        else:   # the first COPY reads the STORE row
            copy = next(p for p in starts if words[p] == 3)
            words[copy + 1] = words[app + 1]
    else:
        raise ValueError(change)
    payloads[k] = struct.pack(f"<{len(words)}i", *words)
    return write_parts(out, header, payloads)
