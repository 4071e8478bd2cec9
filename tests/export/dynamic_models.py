"""Small ONNX models whose output sizes depend on the data (issue 37 item 1), shared by the
tests of data-dependent shapes: a detector-like head with NMS inside, and a graph of NonZero,
TopK with a run-time k, Compress, Unique, GatherND and ScatterND on their results."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GRID = 8           # the detector's feature map is GRID x GRID cells, one anchor box each
CLASSES = 2


def detector(max_boxes: int = 30, iou: float = 0.3, score: float = 0.7) -> onnx.ModelProto:
    """x [1, 3, GRID, GRID] -> two 1x1 conv heads: box offsets around a 2x2 anchor per cell
    ([y1, x1, y2, x2]) and sigmoid class scores -> NonMaxSuppression -> the kept boxes and
    scores by GatherND; outputs the selected triples, their boxes and their scores. Seeded."""
    rng = np.random.default_rng(37)
    n = GRID * GRID
    ys, xs = np.meshgrid(np.arange(GRID), np.arange(GRID), indexing="ij")
    anchors = np.stack([ys, xs, ys + 2, xs + 2], -1).reshape(1, n, 4).astype(np.float32)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 1, 1)).astype(np.float32), "wb"),
        numpy_helper.from_array(rng.normal(0, 1.0, (CLASSES, 3, 1, 1)).astype(np.float32), "ws"),
        numpy_helper.from_array(anchors, "anchors"),
        numpy_helper.from_array(np.array([1, 4, n], np.int64), "shape_b"),
        numpy_helper.from_array(np.array([1, CLASSES, n], np.int64), "shape_s"),
        numpy_helper.from_array(np.array([max_boxes], np.int64), "max_boxes"),
        numpy_helper.from_array(np.array([iou], np.float32), "iou"),
        numpy_helper.from_array(np.array([score], np.float32), "score"),
        numpy_helper.from_array(np.array([0, 2], np.int64), "batch_box"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "wb"], ["hb"]),
        helper.make_node("Tanh", ["hb"], ["tb"]),
        helper.make_node("Reshape", ["tb", "shape_b"], ["rb"]),
        helper.make_node("Transpose", ["rb"], ["ob"], perm=[0, 2, 1]),
        helper.make_node("Add", ["ob", "anchors"], ["boxes"]),
        helper.make_node("Conv", ["x", "ws"], ["hs"]),
        helper.make_node("Sigmoid", ["hs"], ["ss"]),
        helper.make_node("Reshape", ["ss", "shape_s"], ["scores"]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou", "score"],
                         ["selected"]),
        helper.make_node("Gather", ["selected", "batch_box"], ["bb"], axis=1),
        helper.make_node("GatherND", ["boxes", "bb"], ["kept_boxes"]),
        helper.make_node("GatherND", ["scores", "selected"], ["kept_scores"]),
    ]
    g = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          [1, 3, GRID, GRID])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, ["n", 3]),
         helper.make_tensor_value_info("kept_boxes", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("kept_scores", TensorProto.FLOAT, ["n"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def counting() -> onnx.ModelProto:
    """x [3, 4], k [1] int64, keep [4] bool, u [8]: NonZero(x) -> GatherND -> * 2 -> ReduceSum
    over the counted axis; TopK(x, k) along axis 1; Compress(x, keep, axis 1) + 1; Unique(u,
    unsorted) and ScatterND of its values into zeros at its first indices; Unique of u's rows
    as [4, 2] (along axis 0, unsorted)."""
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.zeros(8, np.float32), "zeros"),
             numpy_helper.from_array(np.array([-1, 1], np.int64), "col"),
             numpy_helper.from_array(np.array([4, 2], np.int64), "pairs")]
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["nzt"], perm=[1, 0]),
        helper.make_node("GatherND", ["x", "nzt"], ["picked"]),
        helper.make_node("Mul", ["picked", "two"], ["doubled"]),
        helper.make_node("ReduceSum", ["doubled"], ["total"], keepdims=0),
        helper.make_node("TopK", ["x", "k"], ["top_values", "top_indices"], axis=1),
        helper.make_node("Compress", ["x", "keep"], ["kept"], axis=1),
        helper.make_node("Add", ["kept", "one"], ["kept1"]),
        helper.make_node("Unique", ["u"], ["uy", "ui", "uinv", "ucount"], sorted=0),
        helper.make_node("Reshape", ["ui", "col"], ["uicol"]),
        helper.make_node("ScatterND", ["zeros", "uicol", "uy"], ["scattered"]),
        helper.make_node("Reshape", ["u", "pairs"], ["u2"]),
        helper.make_node("Unique", ["u2"], ["rows", "ri", "rinv", "rcount"], axis=0, sorted=0),
    ]
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    g = helper.make_graph(
        nodes, "counting",
        [helper.make_tensor_value_info("x", f, [3, 4]),
         helper.make_tensor_value_info("k", i64, [1]),
         helper.make_tensor_value_info("keep", TensorProto.BOOL, [4]),
         helper.make_tensor_value_info("u", f, [8])],
        [helper.make_tensor_value_info(name, dtype, None) for name, dtype in (
            ("nz", i64), ("doubled", f), ("total", f), ("top_values", f), ("top_indices", i64),
            ("kept1", f), ("uy", f), ("ui", i64), ("uinv", i64), ("ucount", i64),
            ("scattered", f), ("rows", f), ("rinv", i64), ("rcount", i64))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def counting_feeds(seed: int, zeros: bool = False) -> dict[str, np.ndarray]:
    """Inputs for ``counting``: sparse x (all zero when ``zeros``), k in 0..4, a random keep
    mask, u with repeated values."""
    rng = np.random.default_rng(seed)
    x = np.where(rng.random((3, 4)) < 0.5, rng.normal(size=(3, 4)), 0).astype(np.float32)
    if zeros:
        x[:] = 0
    return {"x": x, "k": np.array([seed % 5], np.int64),
            "keep": rng.random(4) < 0.5,
            "u": rng.integers(0, 3, 8).astype(np.float32)}


def open_nonzero() -> onnx.ModelProto:
    """x [N, 3] (N open) -> NonZero -> Transpose -> GatherND -> ReduceSum over the count, and
    TopK of each row with k = how many rows' first value is above 0, at most 3 (a size computed
    from the data): counted sizes whose bounds are expressions of N."""
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero_i"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one_i"),
             numpy_helper.from_array(np.array([3], np.int64), "three")]
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["nzt"], perm=[1, 0]),
        helper.make_node("GatherND", ["x", "nzt"], ["picked"]),
        helper.make_node("ReduceSum", ["picked"], ["total"], keepdims=0),
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("Cast", ["positive"], ["pos_i"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["pos_i", "zero_i"], ["per_col"], keepdims=0),
        helper.make_node("Slice", ["per_col", "zero_i", "one_i"], ["first_col"]),
        helper.make_node("Min", ["first_col", "three"], ["k"]),
        helper.make_node("TopK", ["x", "k"], ["top", "top_i"], axis=1),
    ]
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    g = helper.make_graph(
        nodes, "open_nonzero", [helper.make_tensor_value_info("x", f, ["N", 3])],
        [helper.make_tensor_value_info(n, t, None) for n, t in (
            ("nz", i64), ("picked", f), ("total", f), ("top", f), ("top_i", i64))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def if_shapes(p: str = "") -> onnx.ModelProto:
    """x [1, 4, L] (L open), c bool: If(c) then Concat(x, x) on the last axis [1, 4, 2 L] else
    x's first 3 rows [1, 3, L], then + 1 and a sum: the output's extents are size variables the
    taken branch binds (at most 4 and 2 L). Every name prefixed ``p`` (the branches read
    outer names, which ``onnx.compose.add_prefix`` does not rename)."""
    f = TensorProto.FLOAT
    then_g = helper.make_graph([helper.make_node("Concat", [p + "x", p + "x"], [p + "t"],
                                                 axis=2)], "then", [],
                               [helper.make_tensor_value_info(p + "t", f, None)])
    else_g = helper.make_graph([helper.make_node("Slice", [p + "x", p + "s0", p + "s3",
                                                           p + "ax"], [p + "e"])],
                               "else", [], [helper.make_tensor_value_info(p + "e", f, None)])
    inits = [numpy_helper.from_array(np.array([0], np.int64), p + "s0"),
             numpy_helper.from_array(np.array([3], np.int64), p + "s3"),
             numpy_helper.from_array(np.array([1], np.int64), p + "ax"),
             numpy_helper.from_array(np.array(1.0, np.float32), p + "one")]
    nodes = [helper.make_node("If", [p + "c"], [p + "y"], then_branch=then_g,
                              else_branch=else_g),
             helper.make_node("Add", [p + "y", p + "one"], [p + "z"]),
             helper.make_node("ReduceSum", [p + "z"], [p + "total"], keepdims=0)]
    g = helper.make_graph(nodes, "if_shapes", [
        helper.make_tensor_value_info(p + "x", f, [1, 4, "L"]),
        helper.make_tensor_value_info(p + "c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(p + "z", f, None),
         helper.make_tensor_value_info(p + "total", f, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def combined() -> onnx.ModelProto:
    """The four models above in one graph (one export serves every test): their names
    prefixed ``d_`` (detector), ``c_`` (counting), ``o_`` (open N), ``i_`` (If)."""
    from onnx import compose

    parts = [compose.add_prefix(m, p) for m, p in ((detector(), "d_"), (counting(), "c_"),
                                                    (open_nonzero(), "o_"))]
    parts.append(if_shapes("i_"))
    g = helper.make_graph([n for m in parts for n in m.graph.node], "counted",
                          [i for m in parts for i in m.graph.input],
                          [o for m in parts for o in m.graph.output],
                          [t for m in parts for t in m.graph.initializer])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def combined_feeds(seed: int, zeros: bool = False, n: int = 5) -> dict[str, np.ndarray]:
    """Inputs for ``combined``: a detector image, ``counting_feeds(seed, zeros)``, an open x of
    ``n`` rows, about half zero, and the If's x of length ``n + 1``, its condition ``seed``
    odd."""
    rng = np.random.default_rng(100 + seed)
    y = np.where(rng.random((n, 3)) < 0.5, rng.normal(size=(n, 3)), 0).astype(np.float32)
    feeds = {"d_x": rng.normal(size=(1, 3, GRID, GRID)).astype(np.float32) * (0.5 + seed)}
    feeds.update({f"c_{k}": v for k, v in counting_feeds(seed, zeros).items()})
    feeds["o_x"] = y
    feeds["i_x"] = rng.normal(size=(1, 4, n + 1)).astype(np.float32)
    feeds["i_c"] = np.array(seed % 2 == 1)
    return feeds


def exported(tmp_path_factory, name: str = "counted") -> tuple:
    """(onnx file, bundle) of ``combined`` (or with ``name`` "open_detector" or
    "padded_detector", of that model), exported as ``mlcpack export`` does with its defaults
    (``packager.api.export``, which the command line calls, in process: portable, golden check
    on, at ``combined_feeds(1)``: TopK's k is an input the random check inputs could put beyond
    its axis). Once per test run: xdist workers share the folder above their own temporary
    folders, and the first to take the lock exports for the others (this module and
    tests/runtime/test_c_runtime.py run in different workers)."""
    import fcntl
    import os

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / f"{name}-sizes"
    folder.mkdir(exist_ok=True)
    src, bundle = folder / f"{name}.onnx", folder / f"{name}.mlc"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not bundle.exists():
            from mlcpack.packager.api import Options, export

            model, feeds = {
                "counted": lambda: (combined(), combined_feeds(1)),
                "open_detector": lambda: (open_detector(), open_detector_feeds(1, 16, 12, 0)),
                "padded_detector": lambda: (padded_detector(), padded_detector_feeds(1)),
            }[name]()
            onnx.save(model, src)
            result = export(src, bundle, Options(check_inputs=feeds))
            assert result.check and "golden check passed" in result.check, result.check
    return src, bundle

def open_detector(max_boxes: int = 60, iou: float = 0.4, score: float = 0.75, top: int = 10
                  ) -> onnx.ModelProto:
    """x [B, 3, H, W], every dim open (as torch.onnx exports a detector with dynamic axes):
    a 2x2 stride-2 conv head gives per cell a centre, a size and CLASSES sigmoid scores ->
    boxes [B, N, 4] (center_point_box 1) and scores [B, CLASSES, N], N = (H // 2) (W // 2) a
    run-time size -> NonMaxSuppression, then the post-processing detector exports put after
    it: the box, class and batch columns by Gather, the kept boxes by Gather on the flattened
    [B N, 4] boxes at batch * N + box, their scores by GatherND, class ids Cast to float,
    columns by Slice and Squeeze, one [count, 6] table by Concat, and Slices along the counted
    axis (its first ``top`` rows, all but two, the scores reversed)."""
    rng = np.random.default_rng(38)
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.6, (4 + CLASSES, 3, 2, 2)).astype(np.float32),
                                "w"),
        numpy_helper.from_array(np.array([0, 4 + CLASSES, -1], np.int64), "flat"),
        numpy_helper.from_array(np.array([0], np.int64), "at0"),
        numpy_helper.from_array(np.array([4], np.int64), "at4"),
        numpy_helper.from_array(np.array([4 + CLASSES], np.int64), "at_end"),
        numpy_helper.from_array(np.array([1], np.int64), "at1"),
        numpy_helper.from_array(np.array([2], np.int64), "at2"),
        numpy_helper.from_array(np.array([3], np.int64), "at3"),
        numpy_helper.from_array(np.array([top], np.int64), "at_top"),
        numpy_helper.from_array(np.array([2 ** 62], np.int64), "at_big"),
        numpy_helper.from_array(np.array([-1], np.int64), "at_last"),
        numpy_helper.from_array(np.array([-2 ** 63], np.int64), "at_small"),
        numpy_helper.from_array(np.array([-1], np.int64), "at_back"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([-1, 4], np.int64), "rows4"),
        numpy_helper.from_array(np.array([max_boxes], np.int64), "max_boxes"),
        numpy_helper.from_array(np.array([iou], np.float32), "iou"),
        numpy_helper.from_array(np.array([score], np.float32), "score"),
        numpy_helper.from_array(np.array(0, np.int64), "col0"),
        numpy_helper.from_array(np.array(1, np.int64), "col1"),
        numpy_helper.from_array(np.array(2, np.int64), "col2"),
        numpy_helper.from_array(np.array([4.0, 4.0, 2.0, 2.0], np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["head"], strides=[2, 2]),
        helper.make_node("Reshape", ["head", "flat"], ["cells"]),            # [B, 4 + C, N]
        helper.make_node("Slice", ["cells", "at4", "at_end", "axis1"], ["raw_scores"]),
        helper.make_node("Sigmoid", ["raw_scores"], ["scores"]),
        helper.make_node("Slice", ["cells", "at0", "at4", "axis1"], ["raw_box0"]),
        helper.make_node("Transpose", ["raw_box0"], ["raw_box"], perm=[0, 2, 1]),  # [B, N, 4]
        helper.make_node("Mul", ["raw_box", "scale"], ["boxes"]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou", "score"],
                         ["selected"], center_point_box=1),
        helper.make_node("Gather", ["selected", "col0"], ["batch_idx"], axis=1),
        helper.make_node("Gather", ["selected", "col1"], ["class_idx"], axis=1),
        helper.make_node("Gather", ["selected", "col2"], ["box_idx"], axis=1),
        helper.make_node("Shape", ["boxes"], ["bshape"]),
        helper.make_node("Gather", ["bshape", "col1"], ["n_boxes"], axis=0),
        helper.make_node("Mul", ["batch_idx", "n_boxes"], ["row0"]),
        helper.make_node("Add", ["row0", "box_idx"], ["row"]),
        helper.make_node("Reshape", ["boxes", "rows4"], ["all_boxes"]),
        helper.make_node("Gather", ["all_boxes", "row"], ["kept_boxes"], axis=0),
        helper.make_node("GatherND", ["scores", "selected"], ["kept_scores"]),
        helper.make_node("Cast", ["class_idx"], ["kept_classes"], to=f),
        helper.make_node("Slice", ["selected", "at1", "at3", "axis1"], ["class_box"]),
        helper.make_node("Slice", ["class_box", "at1", "at2", "axis1"], ["box_col"]),
        helper.make_node("Squeeze", ["box_col", "axis1"], ["box_idx2"]),
        helper.make_node("Unsqueeze", ["kept_scores", "axis1"], ["score_col"]),
        helper.make_node("Unsqueeze", ["kept_classes", "axis1"], ["class_col"]),
        helper.make_node("Concat", ["kept_boxes", "score_col", "class_col"], ["detections"],
                         axis=1),
        helper.make_node("Slice", ["detections", "at0", "at_top", "at0"], ["top_detections"]),
        helper.make_node("Slice", ["detections", "at2", "at_big", "at0"], ["rest_detections"]),
        helper.make_node("Slice", ["kept_scores", "at_last", "at_small", "at0", "at_back"],
                         ["reversed_scores"]),
    ]
    pf_nodes, pf_inits, pf_outputs = _prefiltered_nms()
    g = helper.make_graph(
        nodes + pf_nodes, "open_detector", [
            helper.make_tensor_value_info("x", f, ["B", 3, "H", "W"]),
            helper.make_tensor_value_info("pf_boxes", f, [1, "M", 4]),
            helper.make_tensor_value_info("pf_logits", f, [1, 3, "M"])],
        pf_outputs + [helper.make_tensor_value_info("selected", i64, None),
         helper.make_tensor_value_info("kept_boxes", f, None),
         helper.make_tensor_value_info("kept_scores", f, None),
         helper.make_tensor_value_info("kept_classes", f, None),
         helper.make_tensor_value_info("class_box", i64, None),
         helper.make_tensor_value_info("box_idx2", i64, None),
         helper.make_tensor_value_info("detections", f, None),
         helper.make_tensor_value_info("top_detections", f, None),
         helper.make_tensor_value_info("rest_detections", f, None),
         helper.make_tensor_value_info("reversed_scores", f, None)], inits + pf_inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _prefiltered_nms() -> tuple[list, list, list]:
    """Nodes, initializers and outputs (names ``pf_``) of the other common form: boxes [1, M,
    4] and class logits [1, 3, M] (M open) kept where the best class's sigmoid passes a
    threshold (NonZero, Gather: a counted box count), NMS over those, the kept boxes and
    scores, then the best ``min(count, 8)`` by TopK with k from Shape and Min, and each score
    over the best (ReduceMax along the counted axis)."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    inits = [numpy_helper.from_array(np.array(v, dt), "pf_" + n) for n, v, dt in (
        ("ax0", [0], np.int64), ("ax1", [1], np.int64), ("col2", 2, np.int64), ("thr", [0.6], np.float32),
        ("maxb", [30], np.int64), ("iou", [0.5], np.float32), ("maxdet", [8], np.int64))]
    p = "pf_"
    nodes = [helper.make_node(op, [p + i for i in ins], [p + o for o in outs], **attrs)
             for op, ins, outs, attrs in (
        ("Sigmoid", ["logits"], ["scores"], {}),                         # [1, 3, M]
        ("ReduceMax", ["scores"], ["conf"], {"axes": [1], "keepdims": 0}),   # [1, M]
        ("Greater", ["conf", "thr"], ["mask"], {}),
        ("NonZero", ["mask"], ["nz"], {}),                               # [2, k]
        ("Gather", ["nz", "ax1"], ["idx2"], {"axis": 0}),
        ("Squeeze", ["idx2", "ax0"], ["idx"], {}),                       # [k] (row 1 of nz)
        ("Gather", ["boxes", "idx"], ["boxes_k"], {"axis": 1}),          # [1, k, 4]
        ("Gather", ["scores", "idx"], ["scores_k"], {"axis": 2}),        # [1, 3, k]
        ("NonMaxSuppression", ["boxes_k", "scores_k", "maxb", "iou"], ["selected"], {}),
        ("Gather", ["selected", "col2"], ["box_i"], {"axis": 1}),
        ("Gather", ["boxes_k", "box_i"], ["kept_boxes"], {"axis": 1}),   # [1, s, 4]
        ("GatherND", ["scores_k", "selected"], ["kept_scores"], {}),      # [s]
        ("Shape", ["kept_scores"], ["count"], {}),
        ("Min", ["count", "maxdet"], ["k"], {}),
        ("TopK", ["kept_scores", "k"], ["top_scores", "top_i"], {}),
        ("Gather", ["kept_boxes", "top_i"], ["top_boxes"], {"axis": 1}),
        ("ReduceMax", ["kept_scores"], ["best"], {"axes": [0], "keepdims": 1}),
        ("Div", ["kept_scores", "best"], ["relative"], {}))]
    outputs = [helper.make_tensor_value_info(p + n, t, None) for n, t in (
        ("nz", i64), ("selected", i64), ("kept_boxes", f), ("top_scores", f), ("top_i", i64),
        ("top_boxes", f), ("relative", f))]
    return nodes, inits, outputs


def open_detector_feeds(batch: int, h: int, w: int, seed: int, scale: float = 1.5
                        ) -> dict[str, np.ndarray]:
    """Inputs for ``open_detector``: x [batch, 3, h, w], and M = h w // 4 - 2 candidate boxes
    (at least 1) with their logits, in steps of 0.5 (many equal scores: NMS orders ties by
    lower index)."""
    rng = np.random.default_rng(seed)
    m = max(1, h * w // 4 - 2)
    corner = rng.uniform(0, 10, (1, m, 2)).astype(np.float32)
    size = rng.uniform(0.5, 3, (1, m, 2)).astype(np.float32)
    return {"x": (rng.normal(size=(batch, 3, h, w)) * scale).astype(np.float32),
            "pf_boxes": np.concatenate([corner, corner + size], -1),
            "pf_logits": np.round(rng.normal(size=(1, 3, m)) * scale * 2).astype(np.float32)
            / 2}


PADDED_ROWS = 20   # the padded detector's fixed output rows (ultralytics: max_det, 300)


def padded_detector(conf: float = 0.75, iou: float = 0.5) -> onnx.ModelProto:
    """The post-processing ultralytics puts in a YOLO exported with ``nms=True`` (read from
    retuve-yolo-plugin 1.1.0's hip-yolo-us.onnx, node for node in its order and form) over a
    seeded 1x1 conv head: x [1, 3, GRID, GRID] -> per cell [cx, cy, w, h] and CLASSES sigmoid
    scores; best class by ReduceMax/ArgMax; cells over ``conf`` by NonZero (three NonZero of one
    mask, one per gathered column: one count); xywh -> xyxy by two ScatterND whose indices are
    a counted Range Expanded with a constant [0, 1] (an Expand of a constant to a counted
    shape); class offsets for class-aware NMS; NonMaxSuppression (no box limit); at most
    PADDED_ROWS kept (Slice of the counted rows); [box, score, class] rows padded to
    PADDED_ROWS by a Pad whose pads are computed from the count (PADDED_ROWS - count, reversed
    and transposed as torch's F.pad writes them); written into a zero [1, PADDED_ROWS, 6]
    by ScatterND. Output ``dets`` is always [1, PADDED_ROWS, 6], zero rows after the kept."""
    rng = np.random.default_rng(39)
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    c = 4 + CLASSES
    big = np.iinfo(np.int64).max

    def const(name: str, value, dtype=np.int64):
        return numpy_helper.from_array(np.array(value, dtype), name)

    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (c, 3, 1, 1)).astype(np.float32), "w"),
        const("flat", [1, c, GRID * GRID]), const("at0", [0]), const("at2", [2]),
        const("at4", [4]), const("at_big", [big]), const("ax0", [0]), const("ax1", [1]),
        const("ax_last", [-1]), const("i0", 0), const("i1", 1), const("one_col", [-1, 1]),
        const("cols_lo", [0, 1]), const("cols_hi", [2, 3]), const("thr", conf, np.float32),
        const("two", 2.0, np.float32), const("scale", [GRID, GRID, 4, 4], np.float32),
        const("offset", 2.0 * GRID, np.float32), const("max_out", [big]),
        const("iou", [iou], np.float32), const("rows", [PADDED_ROWS]),
        const("rows_i", PADDED_ROWS), const("zeros3", [0, 0, 0]), const("pair", [-1, 2]),
        const("back", [-1]), const("front", [-big]), const("flat1", [-1]),
        const("table", [PADDED_ROWS, c]), const("table3", [1, PADDED_ROWS, c]),
        numpy_helper.from_array(np.zeros((1, PADDED_ROWS, c), np.float32), "empty"),
        const("at_batch", [[0]]),
    ]
    nodes = [helper.make_node(op, ins, outs, **attrs) for op, ins, outs, attrs in (
        ("Conv", ["x", "w"], ["head"], {}),
        ("Reshape", ["head", "flat"], ["cells"], {}),                     # [1, c, N]
        ("Transpose", ["cells"], ["pred"], {"perm": [0, 2, 1]}),          # [1, N, c]
        ("Squeeze", ["pred", "ax0"], ["p"], {}),                          # [N, c]
        ("Slice", ["p", "at0", "at4", "ax1"], ["raw_box"], {}),
        ("Sigmoid", ["raw_box"], ["unit_box"], {}),
        ("Mul", ["unit_box", "scale"], ["xywh"], {}),                     # [N, 4]
        ("Slice", ["p", "at4", "at_big", "ax1"], ["raw_scores"], {}),
        ("Sigmoid", ["raw_scores"], ["scores"], {}),                      # [N, C]
        ("ReduceMax", ["scores", "ax_last"], ["best"], {"keepdims": 0}),  # [N]
        ("ArgMax", ["scores"], ["label"], {"axis": -1, "keepdims": 0}),
        ("Greater", ["best", "thr"], ["mask"], {}),
        ("NonZero", ["mask"], ["nz_a"], {}),
        ("Transpose", ["nz_a"], ["ta"], {"perm": [1, 0]}),
        ("GatherND", ["xywh", "ta"], ["kbox"], {}),                       # [k, 4]
        ("NonZero", ["mask"], ["nz_b"], {}),
        ("Transpose", ["nz_b"], ["tb"], {"perm": [1, 0]}),
        ("GatherND", ["best", "tb"], ["kscore"], {}),                     # [k]
        ("NonZero", ["mask"], ["nz_c"], {}),
        ("Transpose", ["nz_c"], ["tc"], {"perm": [1, 0]}),
        ("GatherND", ["label", "tc"], ["klabel"], {}),                    # [k]
        # xyxy: out[:, 0:2] = xy - wh / 2, out[:, 2:4] = xy + wh / 2, as torch exports it
        ("Shape", ["kbox"], ["kshape"], {}),
        ("ConstantOfShape", ["kshape"], ["zeros"],
         {"value": helper.make_tensor("z", f, [1], [0.0])}),
        ("Slice", ["kbox", "at0", "at2", "ax1"], ["xy"], {}),
        ("Slice", ["kbox", "at2", "at_big", "ax1"], ["wh"], {}),
        ("Div", ["wh", "two"], ["half"], {}),
        ("Sub", ["xy", "half"], ["lo"], {}),
        ("Add", ["xy", "half"], ["hi"], {}),
        ("Shape", ["zeros"], ["zshape"], {}),
        ("Gather", ["zshape", "i0"], ["zrows"], {"axis": 0}),
        ("Cast", ["zrows"], ["zrows64"], {"to": i64}),
        ("Range", ["i0", "zrows64", "i1"], ["row_ids"], {}),
        ("Reshape", ["row_ids", "one_col"], ["row_col"], {}),             # [k, 1]
        ("Add", ["row_col", "cols_lo"], ["grid_lo"], {}),
        ("Shape", ["grid_lo"], ["gshape"], {}),                           # [k, 2]
        ("Expand", ["row_col", "gshape"], ["er"], {}),
        ("Unsqueeze", ["er", "ax_last"], ["er3"], {}),
        ("Expand", ["cols_lo", "gshape"], ["ec_lo"], {}),                 # constant -> [k, 2]
        ("Unsqueeze", ["ec_lo", "ax_last"], ["ec_lo3"], {}),
        ("Concat", ["er3", "ec_lo3"], ["idx_lo"], {"axis": -1}),          # [k, 2, 2]
        ("ScatterND", ["zeros", "idx_lo", "lo"], ["xyxy_lo"], {}),
        ("Expand", ["cols_hi", "gshape"], ["ec_hi"], {}),
        ("Unsqueeze", ["ec_hi", "ax_last"], ["ec_hi3"], {}),
        ("Concat", ["er3", "ec_hi3"], ["idx_hi"], {"axis": -1}),
        ("ScatterND", ["xyxy_lo", "idx_hi", "hi"], ["xyxy"], {}),         # [k, 4]
        # class-aware NMS: boxes moved apart by class
        ("Reshape", ["klabel", "one_col"], ["label_col"], {}),
        ("Cast", ["label_col"], ["label_f"], {"to": f}),
        ("Mul", ["label_f", "offset"], ["shift"], {}),
        ("Add", ["xyxy", "shift"], ["nms_box"], {}),
        ("Unsqueeze", ["nms_box", "ax0"], ["nms_boxes"], {}),             # [1, k, 4]
        ("Unsqueeze", ["kscore", "ax0"], ["s1"], {}),
        ("Unsqueeze", ["s1", "ax0"], ["nms_scores"], {}),                 # [1, 1, k]
        ("NonMaxSuppression", ["nms_boxes", "nms_scores", "max_out", "iou"], ["selected"], {}),
        ("Gather", ["selected", "at2"], ["sel_box"], {"axis": 1}),
        ("Squeeze", ["sel_box", "ax1"], ["sel"], {}),
        ("Slice", ["sel", "at0", "rows", "ax0"], ["keep"], {}),           # at most PADDED_ROWS
        ("Gather", ["xyxy", "keep"], ["dbox"], {"axis": 0}),
        ("Gather", ["kscore", "keep"], ["dscore"], {"axis": 0}),
        ("Reshape", ["dscore", "one_col"], ["dscore_col"], {}),
        ("Gather", ["klabel", "keep"], ["dlabel"], {"axis": 0}),
        ("Reshape", ["dlabel", "one_col"], ["dlabel_col"], {}),
        ("Cast", ["dlabel_col"], ["dlabel_f"], {"to": f}),
        ("Concat", ["dbox", "dscore_col", "dlabel_f"], ["kept"], {"axis": -1}),   # [s, 6]
        # F.pad(kept, (0, 0, 0, rows - s)) as torch exports it
        ("Shape", ["kept"], ["kept_shape"], {}),
        ("Gather", ["kept_shape", "i0"], ["s"], {"axis": 0}),
        ("Sub", ["rows_i", "s"], ["missing"], {}),
        ("Unsqueeze", ["missing", "ax0"], ["missing1"], {}),
        ("Concat", ["zeros3", "missing1"], ["pads4"], {"axis": 0}),
        ("Reshape", ["pads4", "pair"], ["pads22"], {}),
        ("Slice", ["pads22", "back", "front", "ax0", "back"], ["pads_rev"], {}),
        ("Transpose", ["pads_rev"], ["pads_t"], {"perm": [1, 0]}),
        ("Reshape", ["pads_t", "flat1"], ["pads"], {}),
        ("Pad", ["kept", "pads"], ["padded"], {"mode": "constant"}),
        ("Expand", ["padded", "table"], ["full"], {}),
        ("Reshape", ["full", "table3"], ["full3"], {}),
        ("ScatterND", ["empty", "at_batch", "full3"], ["dets"], {}))]
    g = helper.make_graph(
        nodes, "padded_detector", [helper.make_tensor_value_info("x", f, [1, 3, GRID, GRID])],
        [helper.make_tensor_value_info("dets", f, [1, PADDED_ROWS, c])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def padded_detector_feeds(seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(200 + seed)
    return {"x": (rng.normal(size=(1, 3, GRID, GRID)) * scale).astype(np.float32)}
