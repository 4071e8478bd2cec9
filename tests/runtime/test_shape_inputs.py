"""Shape-carrying inputs fed at run time (issue 37 item 2, format 1.6): a Reshape's shape, an
Expand's, a Tile's repeats, a ConstantOfShape's shape, a reduction's axes, an Unsqueeze's and
Squeeze's axes and CumSum's axis arrive as graph inputs; their values bind size variables at run
start (the symbolic record's ``values``). Each bundle is exported once with nothing bound, run at
several values against ONNX Runtime, and the C runtime gives bit-identical outputs; bad values
are one-line input errors in both runtimes; older readers refuse the bundle by its version.
Item 4's operators (a window of a run-time size, BitCast, Det, Binarizer) the same way."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from bundle_parts import read_parts, write_parts
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import bundle as bundle_format
from mlcpack.runtime import load
from mlcpack.runtime.errors import BundleError, FormatVersionError, InputError
from test_c_runtime import CC, assert_bit_identical, mlcrun, one_line_error

ort = pytest.importorskip("onnxruntime")

F = np.float32
I64 = np.int64


def _model(nodes, inputs, outputs, opset=18) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "shape_inputs",
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, T.FLOAT, None) for n in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def sizes_model() -> onnx.ModelProto:
    """Reshape (0 and -1 allowed), Expand, Tile and ConstantOfShape with their shapes fed."""
    fill = helper.make_tensor("v", T.FLOAT, [1], [0.5])
    return _model([helper.make_node("Reshape", ["x", "shape"], ["reshaped"]),
                   helper.make_node("Expand", ["c", "target"], ["expanded"]),
                   helper.make_node("Tile", ["x2", "repeats"], ["tiled"]),
                   helper.make_node("ConstantOfShape", ["fill_shape"], ["filled"], value=fill),
                   helper.make_node("Split", ["x3", "split"], ["part0", "part1"])],
                  [("x", T.FLOAT, [2, 3, 4]), ("shape", T.INT64, [3]), ("c", T.FLOAT, [3, 1]),
                   ("target", T.INT64, [3]), ("x2", T.FLOAT, [2, 3]), ("repeats", T.INT64, [2]),
                   ("fill_shape", T.INT64, [2]), ("x3", T.FLOAT, [5, 2]), ("split", T.INT64, [2])],
                  ["reshaped", "expanded", "tiled", "filled", "part0", "part1"])


def axes_model() -> onnx.ModelProto:
    """Axes fed: ReduceSum keeping dims, ReduceMax dropping them, CumSum's axis, Unsqueeze,
    Squeeze (over a symbolic batch n, so the axes rows read a size variable too)."""
    return _model([helper.make_node("ReduceSum", ["x", "axes"], ["summed"], keepdims=1),
                   helper.make_node("ReduceMax", ["x", "axes2"], ["maxed"], keepdims=0),
                   helper.make_node("CumSum", ["x", "axis"], ["scanned"]),
                   helper.make_node("Unsqueeze", ["x", "uaxes"], ["unsqueezed"]),
                   helper.make_node("Squeeze", ["s", "saxes"], ["squeezed"]),
                   helper.make_node("Slice", ["x", "starts", "ends", "sl_axes", "steps"],
                                    ["sliced"]),
                   helper.make_node("Pad", ["x", "pads", "fill", "pad_axes"], ["padded"]),
                   helper.make_node("Pad", ["x", "rpads"], ["reflected"], mode="reflect")],
                  [("x", T.FLOAT, ["n", 3, 4]), ("axes", T.INT64, [1]), ("axes2", T.INT64, [2]),
                   ("axis", T.INT64, []), ("uaxes", T.INT64, [2]), ("s", T.FLOAT, [2, 1, 3, 1]),
                   ("saxes", T.INT64, [1]), ("starts", T.INT64, [2]), ("ends", T.INT64, [2]),
                   ("sl_axes", T.INT64, [2]), ("steps", T.INT64, [2]), ("pads", T.INT64, [2]),
                   ("fill", T.FLOAT, []), ("pad_axes", T.INT64, [1]), ("rpads", T.INT64, [6])],
                  ["summed", "maxed", "scanned", "unsqueezed", "squeezed", "sliced", "padded",
                   "reflected"])


def ops_model() -> onnx.ModelProto:
    """Issue 37 item 4's operators: a Hann window of a run-time size, BitCast, Det, Binarizer."""
    g = helper.make_graph(
        [helper.make_node("HannWindow", ["size"], ["window"], periodic=0),
         helper.make_node("BitCast", ["x"], ["bits"], to=T.INT32),
         helper.make_node("Det", ["m"], ["det"]),
         helper.make_node("Binarizer", ["x"], ["binary"], domain="ai.onnx.ml", threshold=0.5)],
        "ops", [helper.make_tensor_value_info("size", T.INT64, []),
                helper.make_tensor_value_info("x", T.FLOAT, [2, 3]),
                helper.make_tensor_value_info("m", T.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info(n, t, None) for n, t in
         (("window", T.FLOAT), ("bits", T.INT32), ("det", T.FLOAT), ("binary", T.FLOAT))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 26),
                                               helper.make_opsetid("ai.onnx.ml", 1)])


def ops_feeds(size: int) -> dict:
    rng = np.random.default_rng(size)
    return {"size": np.array(size, I64), "x": rng.standard_normal((2, 3)).astype(F),
            "m": rng.standard_normal((2, 3, 3)).astype(F)}


OPS_CASES = [ops_feeds(n) for n in (10, 2, 33)]


def size_feeds(shape, target, repeats, fill_shape, split) -> dict:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((2, 3, 4)).astype(F), "shape": np.array(shape, I64),
            "c": np.arange(3, dtype=F).reshape(3, 1), "target": np.array(target, I64),
            "x2": rng.standard_normal((2, 3)).astype(F), "repeats": np.array(repeats, I64),
            "fill_shape": np.array(fill_shape, I64),
            "x3": np.arange(10, dtype=F).reshape(5, 2), "split": np.array(split, I64)}


def axes_feeds(n, axes, axes2, axis, uaxes, saxes, sl, pads, pad_axes, rpads) -> dict:
    rng = np.random.default_rng(2)
    return {"x": rng.standard_normal((n, 3, 4)).astype(F), "axes": np.array(axes, I64),
            "axes2": np.array(axes2, I64), "axis": np.array(axis, I64),
            "uaxes": np.array(uaxes, I64), "s": rng.standard_normal((2, 1, 3, 1)).astype(F),
            "saxes": np.array(saxes, I64),
            **{k: np.array(v, I64) for k, v in zip(("starts", "ends", "sl_axes", "steps"), sl)},
            "pads": np.array(pads, I64), "fill": np.array(1.5, F),
            "pad_axes": np.array(pad_axes, I64), "rpads": np.array(rpads, I64)}


SIZE_CASES = [size_feeds([4, 3, 2], [2, 1, 6], [1, 1], [2, 3], [2, 3]),
              size_feeds([0, -1, 2], [1, 3, 1], [2, 3], [1, 7], [4, 1]),
              size_feeds([-1], [4, 3, 5], [3, 1], [5, 1], [1, 4]),
              size_feeds([24, 1, 1], [1, 3, 2], [1, 2], [1, 1], [3, 2])]
# Slice: starts, ends, axes, steps (clamped ends, negative starts and steps)
# Pad: pads over axes (negative pads crop), a reflect pad over every axis
AXES_CASES = [axes_feeds(2, [1], [0, 2], 0, [0, 4], [1], ([0, 1], [1, 3], [0, 2], [1, 1]),
                         [1, 2], [1], [0, 1, 2, 1, 0, 3]),
              axes_feeds(1, [-1], [-1, -2], -1, [-1, 1], [-1],
                         ([2, -1], [0, -5], [1, 2], [-1, -2]), [-1, 3], [-1], [0, 0, 0, 0, 0, 0]),
              axes_feeds(3, [0], [2, 0], 2, [3, 0], [3], ([1, 0], [1000, 2], [0, -1], [1, 1]),
                         [0, 0], [0], [1, 0, -1, 2, 2, 0]),
              axes_feeds(2, [2], [1, 0], 1, [2, 1], [-3], ([0, 0], [-1, 3], [-3, 1], [1, 2]),
                         [3, -2], [2], [1, 2, 3, 0, 2, 1])]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, run_cli) -> dict[str, tuple[onnx.ModelProto, Path]]:
    """``sizes`` through ``export_module`` (this host's level); ``axes`` as a user exports it:
    ``mlcpack export model.onnx -o model.mlc``, default options (portable fat bundle, golden
    check against ONNX Runtime with the values the check feeds)."""
    folder = tmp_path_factory.mktemp("shape_inputs")
    model = sizes_model()
    mod, _ = import_onnx(model)
    export_module(mod, folder / "sizes.mlc", ExportOptions(target="host"))
    out = {"sizes": (model, folder / "sizes.mlc")}
    mod, _ = import_onnx(ops_model())
    export_module(mod, folder / "ops.mlc", ExportOptions(target="host"))
    out["ops"] = (ops_model(), folder / "ops.mlc")
    onnx.save(axes_model(), folder / "axes.onnx")
    proc = run_cli("export", folder / "axes.onnx", "-o", folder / "axes.mlc", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "golden check passed" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    out["axes"] = (axes_model(), folder / "axes.mlc")
    return out


def _fit(model: onnx.ModelProto, feeds: dict) -> dict:
    """The Reshape target has a static length 3 in the model: shorter ones are padded with 1."""
    if "shape" in feeds and feeds["shape"].size != 3:
        feeds = dict(feeds, shape=np.array(list(feeds["shape"]) + [1] * (3 - feeds["shape"].size),
                                           I64))
    return feeds


CASES = {"sizes": SIZE_CASES, "axes": AXES_CASES, "ops": OPS_CASES}


@pytest.mark.parametrize("name", ["sizes", "axes", "ops"])
def test_values_match_onnxruntime(bundles, name) -> None:
    model, path = bundles[name]
    session = ort.InferenceSession(model.SerializeToString())
    cases = CASES[name]
    with load(path) as bundle:
        for feeds in cases:
            feeds = _fit(model, feeds)
            got = bundle.run(feeds)
            want = session.run(None, feeds)
            for out, ref in zip(model.graph.output, want):
                g = got[out.name]
                assert g.shape == ref.shape, (out.name, g.shape, ref.shape)
                np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5, err_msg=out.name)


def test_bundle_records_values_as_format_1_6(bundles, monkeypatch) -> None:
    header, _ = read_parts(bundles["axes"][1])
    assert header["format"] == [1, 6] and header["min_reader"] == [1, 6]
    rows = header["symbolic"]["values"]
    assert [r[1] for r in rows] == ["axes"] * 5 + ["slice", "pad", "pad"]
    assert [r[4] for r in rows[:5]] == [0, 1, 4, 2, 3]   # in the order the model reads them
    assert rows[5][4:] == ["ends", "sl_axes", "steps"] and len(rows[5][2]) == 4 * 3
    sizes_rows = read_parts(bundles["sizes"][1])[0]["symbolic"]["values"]
    assert [r[1] for r in sizes_rows] == ["reshape", "expand", "dims", "dims", "dims"]
    assert sizes_rows[0][3:] == [[2, 3, 4], 0] and sizes_rows[1][3] == [3, 1]
    monkeypatch.setattr(bundle_format, "VALUES_MINOR", 5)   # a 1.5 reader
    with pytest.raises(FormatVersionError, match="needs a runtime that reads"):
        load(bundles["axes"][1])


def test_damaged_values_row_is_refused(bundles, tmp_path) -> None:
    header, payloads = read_parts(bundles["sizes"][1])
    for k, damage in enumerate((["shape", "reshape", ["nope"], [2, 3, 4], 0],
                                ["shape", "squash", ["shape_0"]],
                                ["x", "dims", ["shape_0"]])):
        header["symbolic"]["values"][0] = damage
        bad = write_parts(tmp_path / f"bad{k}.mlc", header, payloads)
        with pytest.raises(BundleError) as err:
            load(bad)
        assert "\n" not in str(err.value) and "values" in str(err.value)


BAD = [("sizes", {"shape": [5, 5, 1]}, "must hold"),
       ("sizes", {"shape": [4, -1, -1]}, "-1 at index 1 is not a size"),
       ("sizes", {"shape": [5, -1, 1]}, "cannot hold the 24 elements"),
       ("sizes", {"repeats": [0, 1]}, "0 at index 0 is not a size"),
       ("sizes", {"target": [2, 2, 6]}, "target_1 must be 3, got target_1 = 2"),
       ("axes", {"axes": [3]}, "axis 3 is out of range for rank 3"),
       ("axes", {"axes2": [1, -2]}, "an axis repeats"),
       ("axes", {"saxes": [2]}, "cannot be squeezed"),
       ("axes", {"steps": [0, 1]}, "a step of 0"),
       ("axes", {"starts": [5, 0]}, "the slice of axis 0 is empty"),
       ("sizes", {"split": [2, 2]}, "split_0 + split_1 == 5 must hold"),
       ("axes", {"pads": [-3, -1]}, "pads -3, -1 leave axis 1 of size 3 empty")]


@pytest.mark.parametrize("name,change,message", BAD)
def test_bad_values_are_one_line_input_errors(bundles, name, change, message) -> None:
    model, path = bundles[name]
    feeds = dict(_fit(model, (SIZE_CASES if name == "sizes" else AXES_CASES)[0]))
    feeds.update({k: np.array(v, I64) for k, v in change.items()})
    with load(path) as bundle:
        with pytest.raises(InputError) as err:
            bundle.run(feeds)
    assert "\n" not in str(err.value) and message in str(err.value), str(err.value)


# ---- the C runtime: the same bundles, bit-identical outputs, the same refusals ----------------

@pytest.fixture(scope="module")
def cbuild() -> Path:
    if CC is None:
        pytest.skip("no C compiler (cc or gcc) on this machine: the C runtime cannot be built")
    from test_c_runtime import CDIR, _make
    _make("all")
    return CDIR / "build"


@pytest.mark.parametrize("name", ["sizes", "axes", "ops"])
def test_c_runtime_bit_identical(cbuild, bundles, tmp_path, name) -> None:
    model, path = bundles[name]
    for k, feeds in enumerate(CASES[name]):
        assert_bit_identical(cbuild, path, _fit(model, feeds), tmp_path / str(k), threads=(1,))


@pytest.mark.parametrize("name,change,message", [BAD[0], BAD[2], BAD[5], BAD[7], BAD[9],
                                                 BAD[11]])
def test_c_runtime_refuses_bad_values(cbuild, bundles, tmp_path, name, change, message) -> None:
    model, path = bundles[name]
    feeds = dict(_fit(model, (SIZE_CASES if name == "sizes" else AXES_CASES)[0]))
    feeds.update({k: np.array(v, I64) for k, v in change.items()})
    files = []
    for i, x in enumerate(feeds.values()):
        np.save(tmp_path / f"in{i}.npy", x)
        files.append(tmp_path / f"in{i}.npy")
    proc: subprocess.CompletedProcess = mlcrun(cbuild, "run", path, *files, "-o", tmp_path / "o")
    assert proc.returncode == 7, proc.stderr
    line = one_line_error(proc)
    assert message.split(" at index")[0].split(" for rank")[0] in line, line
