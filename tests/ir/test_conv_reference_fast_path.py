"""The numpy references of nn.conv2d and nn.conv (the golden check's IR reference runs them on
whole real models) go through BLAS a tap at a time, reading stride-1 windows in place: checked
here against the plain definition, a sum over every tap in float64, for the shapes each path
takes (stride 1 with dilation and padding, strides, groups, depthwise, a batch)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mlcpack.packager.ops.nn import conv, conv2d


def _definition(x, w, strides, padding, dilation, groups):
    """out[n, o, y, x] = sum over c, ky, kx of w[o, c, ky, kx] * xpad[n, g(o) c, y s + ky d, ...]."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding[0], padding[2]),
                                       (padding[1], padding[3])))
    oh = (xp.shape[2] - dilation[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilation[1] * (kw - 1) - 1) // strides[1] + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for oc, ky, kx in itertools.product(range(o), range(kh), range(kw)):
        g = oc // og
        rows = xp[:, g * cg:(g + 1) * cg, ky * dilation[0]::strides[0], kx * dilation[1]::strides[1]]
        out[:, oc] += np.einsum("nchw,c->nhw", rows[:, :, :oh, :ow], w[oc, :, ky, kx])
    return out.astype(x.dtype)


CASES = {   # (N, C, H, W), (O, C/groups, KH, KW), strides, padding, dilation, groups
    "3x3 same": ((1, 5, 9, 11), (4, 5, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "uneven pads, dilation 2": ((2, 3, 10, 7), (6, 3, 3, 2), (1, 1), (2, 0, 1, 1), (2, 1), 1),
    "stride 2": ((1, 4, 9, 10), (3, 4, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "stride (1, 3)": ((1, 2, 6, 13), (2, 2, 1, 4), (1, 3), (0, 0, 0, 0), (1, 1), 1),
    "groups 2": ((1, 6, 7, 7), (4, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
    "depthwise": ((2, 5, 8, 6), (5, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 5),
    "depthwise stride 2": ((1, 4, 9, 9), (4, 1, 5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 4),
    "1-D over frames": ((1, 16, 1, 40), (8, 16, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
}


@pytest.mark.parametrize("case", CASES)
def test_conv2d_reference_matches_its_definition(case: str) -> None:
    xs, ws, strides, padding, dilation, groups = CASES[case]
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    got = conv2d(x, w, strides, padding, dilation, groups)
    want = _definition(x, w, strides, padding, dilation, groups)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("groups", [1, 2])
def test_nd_conv_reference_matches_conv2d(groups: int) -> None:
    """nn.conv (any rank) on a 2-D case gives what nn.conv2d gives."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 7, 9)).astype(np.float32)
    w = rng.standard_normal((6, 4 // groups, 3, 2)).astype(np.float32)
    got = conv(x, w, strides=(2, 1), padding=(1, 0, 1, 1), dilation=(1, 2), groups=groups)
    want = conv2d(x, w, (2, 1), (1, 0, 1, 1), (1, 2), groups)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
