"""A detector that a PyPI package ships with NMS inside, box for box against ONNX Runtime
(issue 37 item 5).

retuve-yolo-plugin 1.1.0 ships ``hip-yolo-us.onnx``: a YOLO11n-seg exported by ultralytics
8.3.70 with ``nms=True`` (corpus model ``yolo11n_seg_nms``, bench/corpus.py; the only ONNX file
with a NonMaxSuppression node found in the packages searched, docs/symbolic-shapes.md). It is
exported by the default command line (no options) and run on photos that scikit-image 0.26.0's
wheel ships, letterboxed to 512 x 512 as ultralytics feeds it:

- as shipped (score threshold 0.25): a hip-ultrasound model finds nothing in photos (its best
  score on them is below 0.04), so ``output0`` is 300 zero rows, as ONNX Runtime gives, and the
  mask prototypes ``output1`` agree;
- the same file with its one score-threshold constant lowered to 1e-4 (the only edit): 250 to
  600 candidates per photo through the class-offset NMS, 173 to 300 rows kept (300: cut by the
  Slice, the rest padded by the Pad computed from the count): the same rows in the same order
  as ONNX Runtime, class ids equal, boxes within 1e-3 pixels, except that boxes whose scores
  (1e-4 to 1e-3 here) are equal to float rounding may trade places (``_matched``).

Export is ~70 CPU-s per model (YOLO11n-seg at 512 x 512), two models: ``MLCPACK_SLOW=1`` only;
``tests/export/test_data_dependent_shapes.py::test_ultralytics_style_nms_export_matches_onnx_
runtime`` runs the same post-processing graph on a small head in the default run."""

from __future__ import annotations

import io
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SLOW
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import corpus  # noqa: E402

pytestmark = pytest.mark.skipif(not SLOW, reason="MLCPACK_SLOW=1 only: two ~70 CPU-s exports "
                                "(test_ultralytics_style_nms_export_matches_onnx_runtime covers "
                                "the same path in the default run)")

NAME = "yolo11n_seg_nms"
PHOTOS = ("camera", "moon", "cell", "coins", "astronaut")
THRESHOLD_NODE = "/Constant_15_output_0"   # Greater(best class score, 0.25)


def _letterbox(png: bytes, size: int = 512) -> np.ndarray:
    """ultralytics' input: RGB, scaled to fit ``size`` keeping its aspect, centred on gray 114,
    [0, 1] float32 NCHW."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    w, h = img.size
    r = min(size / w, size / h)
    nw, nh = round(w * r), round(h * r)
    canvas = Image.new("RGB", (size, size), (114, 114, 114))
    canvas.paste(img.resize((nw, nh), Image.BILINEAR), ((size - nw) // 2, (size - nh) // 2))
    return np.ascontiguousarray((np.asarray(canvas, np.float32) / 255.0).transpose(2, 0, 1)[None])


@pytest.fixture(scope="module")
def photos() -> dict[str, np.ndarray]:
    pytest.importorskip("PIL", reason="Pillow reads the photos")
    with zipfile.ZipFile(corpus.fetch_wheel(corpus.SCIKIT_IMAGE)) as zf:
        return {p: _letterbox(zf.read(f"skimage/data/{p}.png")) for p in PHOTOS}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, run_cli) -> dict[str, tuple[Path, Path]]:
    """{"shipped" | "low": (onnx file, bundle)}, both exported by ``mlcpack export MODEL -o
    BUNDLE`` with no options, at once (2 workers)."""
    folder = tmp_path_factory.mktemp("nms_detector")
    shipped = corpus.model_path(NAME)
    model = onnx.load(shipped)
    node = next(n for n in model.graph.node if n.output[0] == THRESHOLD_NODE)
    assert numpy_helper.to_array(node.attribute[0].t) == np.float32(0.25)
    node.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(1e-4, np.float32)))
    low = folder / "hip-yolo-us-low.onnx"
    onnx.save(model, low)
    sources = {"shipped": shipped, "low": low}

    def export(key: str) -> tuple[Path, Path]:
        out = folder / f"{key}.mlc"
        proc = run_cli("export", sources[key], "-o", out, timeout=1800)
        assert proc.returncode == 0 and "golden check passed" in proc.stdout + proc.stderr, \
            proc.stdout + proc.stderr
        return sources[key], out

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(sources, pool.map(export, sources)))


def _runs(src: Path, bundle: Path, photos: dict) -> list[tuple[str, dict, dict]]:
    import onnxruntime as ort
    from mlcpack.runtime import load

    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    out = []
    with load(bundle) as model:
        for name, x in photos.items():
            want = dict(zip(["output0", "output1"], sess.run(None, {"images": x})))
            out.append((name, want, model.run({"images": x})))
    return out


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    scale = float(np.abs(want).max()) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale, err_msg=what)


def test_shipped_detector_gives_onnx_runtimes_empty_table_on_photos(bundles, photos) -> None:
    for name, want, got in _runs(*bundles["shipped"], photos):
        assert not want["output0"].any(), name    # nothing found: 300 zero rows
        np.testing.assert_array_equal(got["output0"], want["output0"], err_msg=name)
        _close(got["output1"], want["output1"], name)


def _matched(g: np.ndarray, w: np.ndarray, name: str) -> tuple[np.ndarray, int]:
    """For each of our kept rows ``g`` the row of ONNX Runtime's ``w`` it is: the row at its
    place, or one whose score equals that row's to float rounding (the scores here are 1e-4 to
    1e-3, sigmoids of logits near -8: float32 sums through the network move them by ~5e-8,
    1e-4 relative, and which of two such boxes NMS takes first follows; rtol 1e-3 + atol 1e-7,
    the golden check's tolerance); same class, box within 1e-3 pixels. Returns the rows and how
    many were not in place."""
    order, used, moved = [], np.zeros(len(w), bool), 0
    for i, row in enumerate(g):
        tied = np.flatnonzero(np.isclose(w[:, 4], w[i, 4], rtol=1e-3, atol=1e-7))
        same = [j for j in sorted(tied, key=lambda j: abs(j - i)) if not used[j]
                and row[5] == w[j, 5] and np.allclose(row[:4], w[j, :4], rtol=0, atol=1e-3)
                and np.isclose(row[4], w[j, 4], rtol=1e-3, atol=1e-7)]
        assert same, f"{name}: row {i} {row[:6]} is neither ONNX Runtime's {w[i, :6]} nor a " \
                     "box tied with it"
        used[same[0]] = True
        order.append(same[0])
        moved += same[0] != i
    return np.array(order, np.int64), moved


def test_detector_keeps_onnx_runtimes_boxes_row_for_row(bundles, photos) -> None:
    kept, moved = {}, {}
    for name, want, got in _runs(*bundles["low"], photos):
        w, g = want["output0"][0], got["output0"][0]
        assert g.shape == w.shape == (300, 38), name
        n = int((w[:, 4] > 0).sum())
        kept[name] = n
        assert int((g[:, 4] > 0).sum()) == n, name
        order, moved[name] = _matched(g[:n], w[:n], name)
        _close(g[:n, 6:], w[order, 6:], f"{name}: mask coefficients")
        assert not g[n:].any(), name             # the padding rows
        _close(got["output1"], want["output1"], name)
    print("kept rows", kept, "rows in a tie's other place", moved)
    assert min(kept.values()) > 100 and max(kept.values()) == 300, kept   # cut and padded
    assert len(set(kept.values())) >= 3, kept
    # measured: 76 of 1138 rows (camera 18, moon 6, cell 6, coins 22, astronaut 24) trade places
    # with a tied row; a gross reordering would move most
    assert sum(moved.values()) <= 0.25 * sum(kept.values()), moved
