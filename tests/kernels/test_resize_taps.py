"""``resize_taps`` (Resize's tables built at run time) against its numpy reference, the tables
the export builds for known sizes (``packager/ops/resize_tables.py``): every mode, several
coordinate transforms, exclude_outside, tf_crop_and_resize's extrapolation, scales fed as an
input or taken from the sizes; one bundle, its scale and roi fed at run time."""

from __future__ import annotations

import numpy as np

from helpers import compile_and_run
from mlcpack.packager.ir import BlockBuilder
from mlcpack.packager.ops import get_op

# (in, out, mode, coord, nearest_mode, exclude_outside, from_sizes)
CASES = [(5, 9, "cubic", "align_corners", "round_prefer_floor", True, True),
         (7, 3, "cubic", "half_pixel", "round_prefer_floor", False, False),
         (4, 10, "nearest", "half_pixel_symmetric", "round_prefer_ceil", False, True),
         (6, 4, "nearest", "asymmetric", "floor", False, False),
         (3, 8, "linear", "pytorch_half_pixel", "round_prefer_floor", False, False),
         (4, 7, "linear", "tf_crop_and_resize", "round_prefer_floor", False, True)]
PARTS = ("index", "weight", "fill")


def test_run_time_tables_match_the_export_time_ones(tmp_path) -> None:
    bb = BlockBuilder()
    scale = bb.input("scale", (1,), "float64")
    roi = bb.input("roi", (2,), "float64")
    names, attrs = [], []
    with bb.function("main", [scale, roi]):
        with bb.dataflow():
            outs = []
            for k, (n_in, n_out, mode, coord, nearest, exclude, from_sizes) in enumerate(CASES):
                a = dict(in_size=n_in, out_size=n_out, mode=mode, coord=coord, dtype="float32",
                         nearest_mode=nearest, cubic_a=-0.5, exclude_outside=exclude,
                         extrapolation=7.0, from_sizes=from_sizes)
                for part in PARTS:
                    outs.append(bb.emit_output(bb.emit_op("resize_taps", scale, roi, part=part,
                                                          **a)))
                    names.append(f"t{k}_{part}")
                    attrs.append(dict(a, part=part))
        bb.emit_func_output(outs, names=names)
    feeds = {"scale": np.array([1.7]), "roi": np.array([-0.1, 0.8])}
    got = compile_and_run(bb.get(), feeds, tmp_path)
    reference = get_op("resize_taps").reference
    for name, a in zip(names, attrs):
        want = reference(feeds["scale"], feeds["roi"], **a)
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        if a["part"] == "index":
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-7, err_msg=name)


# (in, out, mode, coord, exclude_outside, from_sizes): antialiased filters, whose width
# follows the scale (padded to the widest the axis can need)
ANTIALIAS = [(4, 3, "linear", "half_pixel", False, True),
             (7, 2, "cubic", "pytorch_half_pixel", True, True),
             (5, 8, "linear", "align_corners", False, True),
             (9, 4, "cubic", "half_pixel", False, False)]


def test_antialias_tables_normalised_are_the_export_time_ones(tmp_path) -> None:
    """The kernel's antialias taps (indices, weights before normalisation) equal their numpy
    mirror; normalised per row they resample as ``resize_tables`` with antialias does."""
    from mlcpack.packager.ops.resize_tables import resize_tables
    from mlcpack.packager.ops.resize_taps import antialias_width
    bb = BlockBuilder()
    scale = bb.input("scale", (1,), "float64")
    roi = bb.input("roi", (2,), "float64")
    names, attrs = [], []
    with bb.function("main", [scale, roi]):
        with bb.dataflow():
            outs = []
            for k, (n_in, n_out, mode, coord, exclude, from_sizes) in enumerate(ANTIALIAS):
                a = dict(in_size=n_in, out_size=n_out, mode=mode, coord=coord, dtype="float32",
                         cubic_a=-0.5, exclude_outside=exclude, from_sizes=from_sizes,
                         antialias=True, taps=antialias_width(mode, n_in))
                for part in ("index", "raw"):
                    outs.append(bb.emit_output(bb.emit_op("resize_taps", scale, roi, part=part,
                                                          **a)))
                    names.append(f"a{k}_{part}")
                    attrs.append(dict(a, part=part))
        bb.emit_func_output(outs, names=names)
    feeds = {"scale": np.array([0.45]), "roi": np.array([0.0, 1.0])}
    got = compile_and_run(bb.get(), feeds, tmp_path)
    reference = get_op("resize_taps").reference
    for name, a in zip(names, attrs):
        want = reference(feeds["scale"], feeds["roi"], **a)
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name], want, rtol=1e-12, atol=1e-15, err_msg=name)
    for k, (n_in, n_out, mode, coord, exclude, from_sizes) in enumerate(ANTIALIAS):
        factor = n_out / n_in if from_sizes else 0.45
        idx, w, _ = resize_tables(n_in, n_out, factor, mode, coord, None, cubic_a=-0.5,
                                  exclude_outside=exclude, antialias=True)
        raw = got[f"a{k}_raw"]
        norm = raw / raw.sum(axis=1, keepdims=True)
        dense, want = np.zeros((n_out, n_in)), np.zeros((n_out, n_in))
        for o in range(n_out):
            np.add.at(dense[o], got[f"a{k}_index"][o], norm[o])
            np.add.at(want[o], idx[o], w[o])
        np.testing.assert_allclose(dense, want, atol=1e-12, err_msg=str(ANTIALIAS[k]))
