"""Output sizes that depend on the data (issue 37 item 1, format 1.6): a size variable a kernel
counts at run time (NonZero, NonMaxSuppression, TopK with a run-time k, Compress with a run-time
condition, Unique), memory planned at its bound, later ops (GatherND, ScatterND, arithmetic,
reductions) reading it as any size, outputs returned at their run-time size.

The detector-like head (conv heads, NMS inside, GatherND of the kept boxes), the counting graph,
the open-N graph and an If whose branches give different shapes are one model
(``dynamic_models.combined``), exported once per test run as ``mlcpack export`` does with its
defaults (``packager.api.export``: portable, golden check on) and checked against ONNX Runtime;
the C runtime gives bit-identical outputs on the same bundle
(``tests/runtime/test_c_runtime.py::test_counted_sizes_bit_identical``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from mlcpack.runtime import InputError, commands, load
from mlcpack.runtime.bundle import BundleReader, reader_minor

import dynamic_models as dm
from conftest import SLOW
from helpers import ort_outputs


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> tuple[Path, Path]:
    return dm.exported(tmp_path_factory)


def _compare(src: Path, model, feeds: dict, prefix: str, rtol: float = 1e-6,
             atol: float = 0.0) -> dict[str, np.ndarray]:
    """Every output named ``prefix...``: its shape, dtype and values as ONNX Runtime's."""
    want, got = ort_outputs(src, feeds), model.run(feeds)
    for name, ref in want.items():
        if name.startswith(prefix):
            assert got[name].shape == ref.shape and got[name].dtype == ref.dtype, name
            np.testing.assert_allclose(got[name], ref, rtol=rtol, atol=atol, err_msg=name)
    return want


def test_detector_with_nms_inside_matches_onnx_runtime_box_for_box(counted) -> None:
    src, bundle = counted
    counts = set()
    with load(bundle) as model:
        for seed in range(4):
            want = _compare(src, model, dm.combined_feeds(seed), "d_", rtol=1e-5, atol=1e-5)
            assert want["d_selected"].dtype == np.int64
            counts.add(len(want["d_selected"]))
    assert len(counts) > 1, counts   # the count really changes with the image


def test_counted_sizes_feed_later_ops_as_onnx_runtime_does(counted) -> None:
    """NonZero -> GatherND -> Mul -> ReduceSum, TopK with k fed, Compress with its condition
    fed, Unique -> ScatterND: every output, its shape and dtype, at counts from 0 up."""
    src, bundle = counted
    with load(bundle) as model:
        for feeds in [dm.combined_feeds(s) for s in range(5)] + [dm.combined_feeds(9, True)]:
            _compare(src, model, feeds, "c_")
        assert model.run(dm.combined_feeds(9, True))["c_nz"].shape == (2, 0)


def test_counted_size_bounded_by_an_open_input_size(counted) -> None:
    """x [N, 3]: NonZero's count is at most 3 N, TopK's data-computed k at most 3; one bundle
    at every N, each N's memory planned at those bounds."""
    src, bundle = counted
    with load(bundle) as model:
        for n in (1, 5, 17):
            _compare(src, model, dm.combined_feeds(n, n=n), "o_")


def test_if_branches_of_different_shapes_bind_the_output_extents(counted) -> None:
    """If on a run-time condition, branches [1, 4, 2 L] and [1, 3, L]: the output takes the
    taken branch's shape, at several L, and the ops after it read those sizes."""
    src, bundle = counted
    shapes = set()
    with load(bundle) as model:
        for seed, n in ((1, 2), (2, 2), (3, 9), (4, 9)):
            want = _compare(src, model, dm.combined_feeds(seed, n=n), "i_", rtol=1e-5)
            shapes.add(want["i_z"].shape)
    assert shapes == {(1, 4, 6), (1, 3, 3), (1, 4, 20), (1, 3, 10)}


def test_bundle_format_and_its_counted_sizes(counted) -> None:
    """Counted sizes are format 1.6; the model's If on a run-time condition makes the bundle
    1.7 (the VM's branch, tests/export/test_if_branches.py), so a 1.6 reader sees it too."""
    _, bundle = counted
    with BundleReader(bundle) as reader:
        header = reader.header
    assert header["format"] == [1, 7] and header["min_reader"] == [1, 7]
    assert reader_minor(header) == 7
    header = dict(header, vm={k: v for k, v in header["vm"].items() if k != "branches"})
    assert reader_minor(header) == 6
    assert [d[0] for d in header["symbolic"]["dynamic"]] == [
        "selected1", "nonzero1", "k1", "kept1", "unique1", "unique2", "nonzero2", "k2",
        "branch1", "branch2"]
    without = dict(header, symbolic={k: v for k, v in header["symbolic"].items()
                                     if k != "dynamic"})
    assert reader_minor(without) < 6   # what a 1.5 reader sees: it refuses the bundle
    lines: list[str] = []
    commands.inspect(bundle, echo=lines.append)   # what `mlcpack inspect` prints
    shown = "\n".join(lines)
    assert "sizes counted at run time by kernels" in shown
    assert "nonzero1 <= 12" in shown and "nonzero2 <= 3 * N" in shown
    assert "branch1 <= 4" in shown and "branch2 <= 2 * L" in shown


def test_topk_k_beyond_its_axis_is_refused_in_one_line(counted) -> None:
    _, bundle = counted
    feeds = dm.combined_feeds(1)
    feeds["c_k"] = np.array([5], np.int64)   # the axis has 4
    with load(bundle) as model:
        with pytest.raises(InputError, match=r"computes at run time is 5, outside \[0, 4\]"):
            model.run(feeds)
        feeds["c_k"] = np.array([2], np.int64)
        assert model.run(feeds)["c_top_values"].shape == (3, 2)   # and runs on afterwards


@pytest.fixture(scope="module")
def open_detector(tmp_path_factory) -> tuple[Path, Path]:
    return dm.exported(tmp_path_factory, "open_detector")


# (batch, height, width, input scale): counts from 0 (scores all near 0.5) to 120
OPEN_SIZES = ((1, 16, 12, 1.5), (3, 16, 12, 1.5), (1, 24, 32, 1.5), (3, 10, 20, 0.3),
              (1, 8, 8, 0.01), (1, 4, 2, 1.5))


def test_detector_with_open_batch_and_image_size_matches_onnx_runtime(open_detector) -> None:
    """x [B, 3, H, W] with every dim open, exported by the default command: NMS over N = (H //
    2)(W // 2) boxes of B images, its selected count bounded by B * 2 * 60 (classes times
    max_output_boxes_per_class); then Gather of the columns, Gather of the kept boxes at batch
    * N + box, Cast, Slice of columns and Squeeze, Concat into a [count, 6] table and Slices
    along the counted axis (first 10 rows, all but two, reversed): the same triples as ONNX
    Runtime at three image sizes, batch 1 and 3, boxes within 1e-5. Beside it (``pf_``), NMS
    over the boxes a threshold kept (NonZero, Gather: a counted box count), then TopK with k =
    min(count, 8) from Shape and Min, and a ReduceMax along the counted axis."""
    src, bundle = open_detector
    counts, prefiltered = set(), set()
    with load(bundle) as model:
        for b, h, w, scale in OPEN_SIZES:
            feeds = dm.open_detector_feeds(b, h, w, 100 * b + h, scale)
            want = _compare(src, model, feeds, "", rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(model.run(feeds)["selected"], want["selected"])
            counts.add(len(want["selected"]))
            prefiltered.add(len(want["pf_selected"]))
            assert len(want["top_detections"]) == min(10, len(want["selected"]))
    assert min(counts) == 0 and 0 < sorted(counts)[1] < 10 and max(counts) > 100, counts
    assert min(prefiltered) == 0 and len(prefiltered) >= 4, prefiltered
    with BundleReader(bundle) as reader:
        dynamic = dict((d[0], d[1]) for d in reader.header["symbolic"]["dynamic"])
    # planned at 120 B rows (2 classes x 60), the first-10 slice at 10 rows; the prefiltered
    # NMS at 3 x 30 rows, its TopK at its count
    assert dynamic == {"selected1": ["*", 120, "B"], "sliced1": 10,
                       "sliced2": ["*", 120, "B"], "sliced3": ["*", 120, "B"],
                       "nonzero1": "M", "selected2": 90, "k1": 90}, dynamic



@pytest.fixture(scope="module")
def padded_detector(tmp_path_factory) -> tuple[Path, Path]:
    return dm.exported(tmp_path_factory, "padded_detector")


# (seed, input scale) -> kept rows 0, 1, 3, 4, 10, 15, 17 and 20 (20 or more candidates)
PADDED_FEEDS = ((4, 0.01), (2, 0.5), (4, 0.5), (0, 0.5), (0, 1.0), (2, 1.0), (1, 2.0),
                (0, 2.0))


def test_ultralytics_style_nms_export_matches_onnx_runtime(padded_detector) -> None:
    """The post-processing of a YOLO exported by ultralytics with ``nms=True`` (as in the
    corpus's retuve hip detector, ``tests/corpus/test_packaged_nms_detector.py``), exported by
    the default command: three NonZero of one mask (one count), xywh -> xyxy by ScatterND at a
    constant Expanded to the counted shape, NMS, a Slice of the kept rows, and a Pad to
    PADDED_ROWS rows whose pads are computed from the count: always [1, 20, 6], the same rows
    as ONNX Runtime (boxes within 1e-5) at 0 to 20 kept rows."""
    src, bundle = padded_detector
    kept = set()
    with load(bundle) as model:
        for seed, scale in PADDED_FEEDS:
            feeds = dm.padded_detector_feeds(seed, scale)
            want = _compare(src, model, feeds, "", rtol=1e-5, atol=1e-5)
            dets = want["dets"][0]
            np.testing.assert_array_equal(model.run(feeds)["dets"][0][:, 5], dets[:, 5])
            kept.add(int((dets[:, 4] > 0).sum()))
    assert kept == {0, 1, 3, 4, 10, 15, 17, dm.PADDED_ROWS}, kept
    with BundleReader(bundle) as reader:
        dynamic = dict((d[0], d[1]) for d in reader.header["symbolic"]["dynamic"])
    # one count for the three NonZero; the output is fixed: nothing else is counted
    assert dynamic == {"nonzero1": dm.GRID * dm.GRID, "selected1": dm.GRID * dm.GRID,
                       "sliced1": dm.PADDED_ROWS}, dynamic


def test_numpy_reference_binds_counted_sizes(tmp_path) -> None:
    """The golden check without onnxruntime (``MLCPACK_NO_ORT=1``, a plain ``pip install .``)
    runs the IR's numpy references (``packager/golden.py`` ``evaluate_ir``); a size a kernel
    counts binds there as in the VM, so the ops after it (the padded detector's Expand, Pad,
    ScatterND) get their sizes (before: ``KeyError: 'nonzero1'``, the check skipped): ONNX
    Runtime's table at 0, 4 and 17 kept rows. No compile: about a second."""
    from mlcpack.frontends.onnx.importer import import_onnx
    from mlcpack.packager.golden import evaluate_ir

    src = tmp_path / "padded.onnx"
    onnx.save(dm.padded_detector(), src)
    mod, _ = import_onnx(src)
    for seed, scale in PADDED_FEEDS[::3]:
        feeds = dm.padded_detector_feeds(seed, scale)
        want = ort_outputs(src, feeds)["dets"]
        np.testing.assert_allclose(evaluate_ir(mod, feeds)["dets"], want, rtol=1e-5, atol=1e-5)

# 20-40 s (torch's import and export, a compile): the detector above covers the same path
@pytest.mark.skipif(not SLOW, reason="MLCPACK_SLOW=1 only (the ONNX detector test covers NMS "
                    "inside a model in the default run)")
@pytest.mark.filterwarnings("ignore:Converting a tensor to a NumPy array",
                            "ignore:torch.from_numpy results are registered as constants",
                            "ignore:You are using the legacy TorchScript",
                            "ignore:The feature will be removed")
def test_torch_detector_with_nms_inside(tmp_path) -> None:
    """A tiny seeded torch detector whose forward ends with NMS (a torch.autograd.Function that
    exports as ONNX NonMaxSuppression, as torchvision's ``ops.nms`` does) and index_select of
    the kept boxes, through torch.onnx with the batch a dynamic axis: the same boxes as ONNX
    Runtime and as torch itself, at batch 1 and 3.
    (torchvision itself: its PyPI 0.28 wheel, the one for torch 2.13, is a CUDA build whose ops
    do not load beside torch's CPU build here.)"""
    torch = pytest.importorskip("torch", reason="torch is not installed (the 'torch' extra)")
    import io

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.dynamic import nms as nms_reference

    class Nms(torch.autograd.Function):
        @staticmethod
        def forward(ctx, boxes, scores, max_boxes, iou, score):
            table = nms_reference(boxes.numpy(), scores.numpy(), max_boxes.numpy(), iou.numpy(),
                                  score.numpy(), has_score_threshold=True,
                                  limit=boxes.shape[1])
            return torch.from_numpy(table[1:1 + table[0, 0]].copy())

        @staticmethod
        def symbolic(g, boxes, scores, max_boxes, iou, score):
            return g.op("NonMaxSuppression", boxes, scores, max_boxes, iou, score)

    class Detector(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.box = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.cls = torch.nn.Conv2d(3, 3, 3, padding=1)
            ys, xs = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
            self.register_buffer("anchors", torch.stack([ys, xs, ys + 2, xs + 2], -1)
                                 .reshape(1, 64, 4))
            self.limits = (torch.tensor([20]), torch.tensor([0.4]), torch.tensor([0.6]))

        def forward(self, x):
            boxes = torch.tanh(self.box(x)).flatten(2).transpose(1, 2) + self.anchors
            scores = torch.sigmoid(self.cls(x)).flatten(2)
            selected = Nms.apply(boxes, scores, *self.limits)
            return selected, boxes[0].index_select(0, selected[:, 2])

    net = Detector().eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(net, (x,), buf, input_names=["x"], output_names=["selected", "boxes"],
                          opset_version=17, dynamo=False, dynamic_axes={"x": {0: "B"}})
    src = tmp_path / "det.onnx"
    src.write_bytes(buf.getvalue())
    mod, _ = import_onnx(onnx.load(src))
    export_module(mod, tmp_path / "det.mlc", ExportOptions(target="host"))
    with load(tmp_path / "det.mlc") as model:
        for seed in range(3):
            batch = 1 + 2 * (seed % 2)   # the batch is open: 1 and 3 from one bundle
            x = torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(seed)) * 2
            feeds = {"x": x.numpy()}
            want, got = ort_outputs(src, feeds), model.run(feeds)
            np.testing.assert_array_equal(got["selected"], want["selected"])
            np.testing.assert_allclose(got["boxes"], want["boxes"], rtol=1e-5, atol=1e-5)
            with torch.no_grad():
                eager = net(x)
            np.testing.assert_array_equal(got["selected"], eager[0].numpy())


def _nms_model(center: int) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array([4], np.int64), "k"),
             numpy_helper.from_array(np.array([0.4], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.2], np.float32), "score")]
    g = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou", "score"], ["sel"],
                          center_point_box=center)], "nms",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["B", "N", 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", "C", "N"])],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("center", [0, 1])
def test_nms_heap_order_and_overlaps_match_onnx_runtime(center, tmp_path) -> None:
    """The NMS kernel (a heap popped while the class has room, each box against the kept boxes'
    stored spans) keeps ONNX Runtime's boxes in its order: scores in eighths (many ties, taken
    by lower index), crowded boxes (many overlaps), some of negative size, 4 per class at most,
    1 to 200 boxes, open batch and class counts."""
    from mlcpack.frontends.onnx.importer import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    src, bundle = tmp_path / "nms.onnx", tmp_path / "nms.mlc"
    onnx.save(_nms_model(center), src)
    export_module(import_onnx(onnx.load(src))[0], bundle, ExportOptions(check=False))
    rng = np.random.default_rng(center)
    with load(bundle) as model:
        for n in (1, 7, 60, 200):
            b, c = int(rng.integers(1, 3)), int(rng.integers(1, 4))
            corner = rng.uniform(0, 12, (b, n, 2))
            boxes = np.concatenate([corner, corner + rng.uniform(-2, 6, (b, n, 2))], -1)
            feeds = {"boxes": boxes.astype(np.float32),
                     "scores": (np.round(rng.random((b, c, n)) * 8) / 8).astype(np.float32)}
            want, got = ort_outputs(src, feeds)["sel"], model.run(feeds)["sel"]
            assert got.dtype == want.dtype and np.array_equal(got, want), (n, got, want)
