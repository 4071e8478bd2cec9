"""More nn operators (N-D pools and convolutions, transposed convolution, LRN, resize): each
compiled kernel against its operator's numpy reference, on odd shapes."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpack.packager.ops import get_op

from helpers import run_op

RNG = np.random.default_rng(7)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def check(op, inputs, tmp_path, rtol=1e-4, atol=1e-5, const_mask=None, **attrs):
    got = run_op(op, inputs, tmp_path, const_mask=const_mask, **attrs)
    want = get_op(op).reference(*inputs, **attrs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return got


@pytest.mark.parametrize("mode,extra", [("max", {}), ("avg", {"count_include_pad": False}),
                                        ("avg", {"count_include_pad": True}),
                                        ("lp", {"p": 3})])
def test_pool_3d(mode, extra, tmp_path):
    x = rand(2, 3, 5, 6, 7)
    check("nn.pool", [x], tmp_path, mode=mode, kernel=(2, 3, 2), strides=(2, 1, 3),
          padding=(1, 0, 1, 0, 1, 1), dilation=(1, 2, 1), ceil_mode=True, **extra)


def test_pool_1d_lp2_and_dilated_avg(tmp_path):
    x = rand(1, 2, 11)
    check("nn.pool", [x], tmp_path, mode="lp", kernel=(3,), strides=(2,), padding=(1, 1),
          dilation=(1,), p=2)
    x2 = rand(1, 2, 9, 7)
    check("nn.pool", [x2], tmp_path, mode="avg", kernel=(2, 2), strides=(1, 1),
          padding=(0, 0, 0, 0), dilation=(2, 2))


def test_pool_reference_matches_2d_ops():
    x = rand(2, 3, 9, 8)
    attrs = dict(kernel=(3, 2), strides=(2, 2), padding=(1, 0, 1, 1), ceil_mode=True)
    np.testing.assert_allclose(get_op("nn.pool").reference(x, "max", dilation=(1, 1), **attrs),
                               get_op("nn.max_pool2d").reference(x, **attrs))
    np.testing.assert_allclose(
        get_op("nn.pool").reference(x, "avg", dilation=(1, 1), count_include_pad=True, **attrs),
        get_op("nn.avg_pool2d").reference(x, count_include_pad=True, **attrs), rtol=1e-6)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(storage_order, tmp_path):
    x = rand(2, 3, 7, 6)
    got = check("nn.max_pool_indices", [x], tmp_path, kernel=(3, 2), strides=(2, 2),
                padding=(1, 0, 1, 1), dilation=(1, 1), storage_order=storage_order)
    values = get_op("nn.pool").reference(x, "max", kernel=(3, 2), strides=(2, 2),
                                         padding=(1, 0, 1, 1), dilation=(1, 1))
    flat = x.reshape(-1) if storage_order == 0 else x.transpose(0, 1, 3, 2).reshape(-1)
    np.testing.assert_array_equal(flat[got], values)


@pytest.mark.parametrize("groups,padding", [(1, (1, 0, 2, 1, 0, 1)), (2, (0, 0, 0, 0, 0, 0))])
def test_conv_3d(groups, padding, tmp_path):
    x, w = rand(2, 4, 5, 6, 6), rand(6, 4 // groups, 3, 2, 3)
    check("nn.conv", [x, w], tmp_path, const_mask=[False, True], strides=(1, 2, 1),
          padding=padding, dilation=(1, 1, 2), groups=groups)


def test_conv_nd_reference_matches_conv2d():
    x, w = rand(2, 4, 9, 8), rand(6, 2, 3, 2)
    attrs = dict(strides=(2, 1), padding=(1, 0, 0, 1), dilation=(1, 2), groups=2)
    np.testing.assert_allclose(get_op("nn.conv").reference(x, w, **attrs),
                               get_op("nn.conv2d").reference(x, w, **attrs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,w_shape,attrs", [
    ((1, 3, 5), (3, 2, 3), dict(strides=(2,), padding=(1, 0), dilation=(1,),
                                output_padding=(1,))),
    ((2, 4, 3, 4), (4, 3, 3, 2), dict(strides=(3, 2), padding=(1, 0, 0, -1), dilation=(1, 2),
                                      output_padding=(1, 0), groups=2)),
    ((1, 2, 2, 3, 2), (2, 2, 2, 3, 2), dict(strides=(1, 2, 2), padding=(0, 1, 0, 0, 0, 1),
                                            dilation=(1, 1, 1), output_padding=(0, 0, 0))),
])
def test_conv_transpose(shape, w_shape, attrs, tmp_path):
    x, w = rand(*shape), rand(*w_shape)
    check("nn.conv_transpose", [x, w], tmp_path, const_mask=[False, True], **attrs)


def test_conv_transpose_reference_is_adjoint_of_conv():
    # <conv(x), y> == <x, conv_transpose(y)> with the same weight, strides, pads, dilation.
    x, w = rand(1, 3, 7, 8), rand(4, 3, 3, 2)
    attrs = dict(strides=(2, 3), padding=(1, 0, 1, 1), dilation=(1, 2))
    y = get_op("nn.conv").reference(x, w, **attrs)
    g = rand(*y.shape)
    back = get_op("nn.conv_transpose").reference(g, w, output_padding=(0, 0), **attrs)
    back = back[:, :, :7, :8]
    assert back.shape == x.shape
    np.testing.assert_allclose((y * g).sum(), (x * back).sum(), rtol=1e-4)


def test_lrn(tmp_path):
    x = rand(2, 7, 3, 5)
    check("nn.lrn", [x], tmp_path, size=4, alpha=2e-3, beta=0.6, bias=1.5)
    check("nn.lrn", [rand(1, 5, 9)], tmp_path, size=3)


# ---- ONNX converters against ONNX Runtime -------------------------------------------------------

ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto  # noqa: E402

from test_onnx_frontend import check_against_ort, make_model, node  # noqa: E402


def test_onnx_3d_conv_pools(tmp_path):
    w = rand(4, 3, 2, 3, 2)
    model = make_model([
        node("Conv", ["x", "w", "b"], ["c"], pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 1]),
        node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2, 2], ceil_mode=1, strides=[2, 2, 2]),
        node("AveragePool", ["c"], ["v"], kernel_shape=[2, 1, 2], pads=[1, 0, 0, 1, 0, 1],
             count_include_pad=1),
        node("LpPool", ["c"], ["l"], kernel_shape=[2, 2, 2], p=3),
        node("GlobalLpPool", ["c"], ["g"]),
    ], {"x": [2, 3, 5, 6, 4]}, ["m", "v", "l", "g"], {"w": w, "b": rand(4)}, opset=18)
    check_against_ort(model, {"x": rand(2, 3, 5, 6, 4)}, tmp_path)


def test_onnx_lrn_maxpool_indices_and_dilated_avgpool(tmp_path):
    model = make_model([
        node("LRN", ["x"], ["n"], size=5, alpha=1e-3, beta=0.7, bias=2.0),
        node("MaxPool", ["n"], ["y", "i"], kernel_shape=[3, 2], pads=[1, 0, 1, 1],
             strides=[2, 1]),
        node("AveragePool", ["x"], ["a"], kernel_shape=[2, 2], dilations=[2, 1]),
    ], {"x": [2, 3, 7, 5]}, ["n", "y", "i", "a"], opset=19)
    model.graph.output[2].type.tensor_type.elem_type = TensorProto.INT64
    check_against_ort(model, {"x": rand(2, 3, 7, 5)}, tmp_path)


@pytest.mark.parametrize("attrs,x_shape,w_shape", [
    (dict(strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 2], dilations=[1, 2]),
     (1, 2, 4, 3), (2, 3, 3, 2)),
    (dict(strides=[2, 2], output_shape=[9, 8], group=2), (2, 4, 4, 3), (4, 1, 3, 3)),
    (dict(strides=[2], auto_pad="SAME_UPPER"), (1, 3, 5), (3, 2, 4)),
    (dict(strides=[1, 2, 1], pads=[0, 1, 0, 1, 0, 0]), (1, 2, 3, 3, 2), (2, 2, 2, 3, 2)),
])
def test_onnx_conv_transpose(attrs, x_shape, w_shape, tmp_path):
    model = make_model([node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)],
                       {"x": list(x_shape)}, ["y"],
                       {"w": rand(*w_shape), "b": rand(w_shape[1] * attrs.get("group", 1))})
    check_against_ort(model, {"x": rand(*x_shape)}, tmp_path)


def test_onnx_group_norm_batch_norm_training_dropout_mask(tmp_path):
    stats = {"s": rand(4), "b": rand(4), "mean": rand(4),
             "var": (np.abs(rand(4)) + 0.5).astype(np.float32)}
    model = make_model([
        node("GroupNormalization", ["x", "gs", "gb"], ["g"], num_groups=2, epsilon=1e-3),
        node("BatchNormalization", ["g", "s", "b", "mean", "var"], ["y", "rm", "rv"],
             training_mode=1, momentum=0.8),
        node("Dropout", ["y"], ["d", "mask"]),
    ], {"x": [3, 4, 5, 2]}, ["d", "rm", "rv", "mask"],
        {"gs": rand(4), "gb": rand(4), **stats}, opset=21)
    model.graph.output[3].type.tensor_type.elem_type = TensorProto.BOOL
    got = check_against_ort(model, {"x": rand(3, 4, 5, 2)}, tmp_path)
    assert got["mask"].dtype == np.bool_ and got["mask"].all()


def test_resize_axis_kernel(tmp_path):
    x = rand(2, 5, 7)
    idx = np.array([[0, 1, 2], [4, 6, 5], [-1, 3, 9], [2, 2, 2]], dtype=np.int64)
    w = rand(4, 3)
    fill = np.array([0, 0, 1.5, 0], dtype=np.float32)
    check("resize_axis", [x, idx, w, fill], tmp_path, axis=-1,
          const_mask=[False, True, True, True])
    (tmp_path / "b").mkdir()
    check("resize_axis", [rand(3, 6, 2), idx, w, fill], tmp_path / "b", axis=1,
          const_mask=[False, True, True, True])


def _resize_model(attrs, x_shape, scales=None, sizes=None, roi=None, opset=19):
    inits = {"roi": np.array(roi if roi is not None else [], np.float32),
             "scales": np.array(scales if scales is not None else [], np.float32)}
    inputs = ["x", "roi", "scales"]
    if sizes is not None:
        inits["sizes"] = np.array(sizes, np.int64)
        inputs.append("sizes")
    return make_model([node("Resize", inputs, ["y"], **attrs)], {"x": list(x_shape)}, ["y"],
                      inits, opset=opset)


@pytest.mark.parametrize("attrs,kw", [
    (dict(mode="nearest"), dict(scales=[1, 1, 2.5, 0.5])),
    (dict(mode="nearest", nearest_mode="ceil", coordinate_transformation_mode="align_corners",
          axes=[3, 2]), dict(sizes=[7, 3])),
    (dict(mode="linear"), dict(scales=[1, 1, 1.7, 0.6])),
    (dict(mode="linear", coordinate_transformation_mode="align_corners"), dict(sizes=[2, 3, 9, 4])),
    (dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), dict(scales=[1, 1, 2.0, 1.5])),
    (dict(mode="cubic", coordinate_transformation_mode="asymmetric"), dict(scales=[1, 1, 0.8, 3])),
    (dict(mode="linear", keep_aspect_ratio_policy="not_larger", axes=[2, 3]), dict(sizes=[8, 8])),
])
def test_onnx_resize(attrs, kw, tmp_path):
    check_against_ort(_resize_model(attrs, (2, 3, 5, 6), **kw), {"x": rand(2, 3, 5, 6)}, tmp_path)


def test_onnx_resize_tf_crop_and_resize_matches_onnx_reference(tmp_path):
    # ONNX Runtime does not extrapolate here (a known divergence); the specification's own
    # reference implementation, which generated the conformance data, is the oracle.
    from onnx.reference import ReferenceEvaluator

    from test_onnx_frontend import run_bundle
    model = _resize_model(dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                               extrapolation_value=-2.0), (2, 3, 5, 6), sizes=[2, 3, 4, 6],
                          roi=[0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2])
    x = rand(2, 3, 5, 6)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = run_bundle(model, {"x": x}, tmp_path)["y"]
    assert (got[..., 0] == -2.0).all() and (got[..., -1] == -2.0).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_onnx_upsample_and_resize_refusals(tmp_path):
    model = make_model([node("Upsample", ["x", "s"], ["y"], mode="linear")], {"x": [1, 2, 3, 4]},
                       ["y"], {"s": np.array([1, 1, 2, 1.5], np.float32)}, opset=9)
    check_against_ort(model, {"x": rand(1, 2, 3, 4)}, tmp_path)
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportError
    with pytest.raises(ExportError, match="mode='area'"):
        import_onnx(_resize_model(dict(mode="area"), (1, 1, 2, 2), scales=[1, 1, 2, 2]))
    with pytest.raises(ExportError, match="exactly one of scales and sizes"):
        import_onnx(_resize_model(dict(mode="linear"), (1, 1, 2, 2)))
    with pytest.raises(ExportError, match="antialias"):
        import_onnx(_resize_model(dict(antialias=1), (1, 1, 2, 2), scales=[1, 1, 2, 2]))


@pytest.mark.parametrize("mode,padding_mode,align", [
    ("linear", "zeros", False), ("nearest", "reflection", True), ("cubic", "border", False),
    ("cubic", "reflection", False), ("nearest", "zeros", False), ("linear", "reflection", True)])
def test_grid_sample_kernel(mode, padding_mode, align, tmp_path):
    x = rand(2, 3, 5, 7)
    grid = (RNG.uniform(-1.6, 1.6, (2, 4, 6, 2))).astype(np.float32)
    grid[0, 0, 0] = [0.5, -0.25]  # lands exactly on pixel centres and half-way points
    grid[0, 0, 1] = [-1.0, 1.0]
    check("grid_sample", [x, grid], tmp_path, mode=mode, padding_mode=padding_mode,
          align_corners=align)


def test_grid_sample_3d_and_onnx(tmp_path):
    x = rand(1, 2, 3, 4, 5)
    grid = RNG.uniform(-1.2, 1.2, (1, 2, 3, 2, 3)).astype(np.float32)
    check("grid_sample", [x, grid], tmp_path, mode="linear", padding_mode="border")
    model = make_model([node("GridSample", ["x", "g"], ["y"], mode="bicubic",
                             padding_mode="reflection")],
                       {"x": [2, 3, 5, 7], "g": [2, 4, 6, 2]}, ["y"], opset=16)
    g = RNG.uniform(-1.3, 1.3, (2, 4, 6, 2)).astype(np.float32)
    (tmp_path / "onnx").mkdir()
    check_against_ort(model, {"x": rand(2, 3, 5, 7), "g": g}, tmp_path / "onnx")


def test_col2im_kernel_and_adjoint(tmp_path):
    attrs = dict(image_shape=(5, 7), block_shape=(2, 3), strides=(2, 1), padding=(1, 0, 0, 1),
                 dilation=(1, 2))
    blocks = (3, 4)  # (5 + 1 + 0 - 1 - 1) // 2 + 1, (7 + 0 + 1 - 4 - 1) // 1 + 1
    cols = rand(2, 3 * 6, blocks[0] * blocks[1])
    got = check("nn.col2im", [cols], tmp_path, **attrs)
    # col2im is the adjoint of im2col: <col2im(cols), img> == <cols, im2col(img)>
    img = rand(2, 3, 5, 7)
    padded = np.pad(img, ((0, 0), (0, 0), (1, 0), (0, 1)))
    patches = np.stack([padded[:, :, ky:ky + 2 * blocks[0] - 1:2, 2 * kx:2 * kx + blocks[1]]
                        for ky in range(2) for kx in range(3)], axis=2)
    im2col = patches.reshape(2, 3 * 6, -1)
    np.testing.assert_allclose((got * img).sum(), (cols * im2col).sum(), rtol=1e-4)


def test_onnx_nn_refusals_are_one_line_errors():
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportError
    cases = [
        (node("LRN", ["x"], ["y"], size=0), "size=0 must be a positive integer"),
        (node("LpPool", ["x"], ["y"], kernel_shape=[2, 2], p=0), "p=0 must be positive"),
        (node("GroupNormalization", ["x", "s", "s"], ["y"], num_groups=3),
         "num_groups=3 does not divide the 4 channels"),
        (node("Dropout", ["x", "r", "t"], ["y"]), "nonzero ratio drops at random"),
    ]
    inits = {"s": np.ones(4, np.float32), "r": np.array(0.3, np.float32), "t": np.array(True)}
    for n, message in cases:
        used = {k: v for k, v in inits.items() if k in n.input}
        model = make_model([n], {"x": [1, 4, 5, 5]}, ["y"], used, opset=21)
        with pytest.raises(ExportError, match=message) as info:
            import_onnx(model)
        assert "\n" not in str(info.value)
