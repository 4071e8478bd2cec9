"""Exact integer Winograd F(2x2, 3x3) for quantized 3x3 stride-1 convolutions: a numpy model
of the arithmetic a kernel would do, checked bit for bit against direct integer convolution.

    .venv/bin/python bench/int8_winograd_study.py [--channels 64,512,1827] [--seed 0]

Not a kernel (none is built): the design check behind docs/performance.md's "what would reach
ONNX Runtime's int8 on AVX2". With d = x - x_zp (|d| <= 255) and int8 weights g:
- input transform V = B^T d B: 4 terms of +-d, |V| <= 1020: int16;
- weight transform at export U' = (2G) g (2G)^T = 4 G g G^T: integral, |U'| <= 9 * 128 = 1152:
  int16;
- products M = sum_c V * U' per tile and position: int16 pairs through ``vpmaddwd`` (|pair| <=
  2 * 1020 * 1152, int32), summed in int32 with wrap-around;
- output transform A^T M A = 4 Y in int32 with wrap-around, then Y = (4 Y) >> 2.
Wrap-around arithmetic is exact modulo 2**32, so the result equals the direct integer sum
whenever the true 4 Y fits int32: |4 Y| <= 4 * 9 * C * 255 * 128 < 2**31 for C <= 1827 input
channels (more: fall back to the direct kernel). Products per output: 16 C / 4 = 4 C against
the direct 9 C (2.25x fewer). Each row printed: channels, max |V|, max |U'|, whether every output
equals the direct convolution, and the worst |4 Y| against 2**31.
"""

from __future__ import annotations

import argparse

import numpy as np

BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.int64)
G2 = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]], np.int64)   # 2 G
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.int64)


def wrap32(a: np.ndarray) -> np.ndarray:
    """``a`` reduced to int32 with two's complement wrap-around (what the kernel's adds do)."""
    return ((a + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int64)


def direct(d: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Integer 3x3 convolution, padding 1: d [C, H, W], g [O, C, 3, 3] -> [O, H, W] (int64)."""
    c, h, w = d.shape
    p = np.pad(d, ((0, 0), (1, 1), (1, 1)))
    out = np.zeros((g.shape[0], h, w), np.int64)
    for ky in range(3):
        for kx in range(3):
            out += np.einsum("oc,chw->ohw", g[:, :, ky, kx], p[:, ky:ky + h, kx:kx + w])
    return out


def winograd(d: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, int, int, int]:
    """The kernel's arithmetic: (Y, max |V|, max |U'|, max |true 4 Y|); H and W even."""
    c, h, w = d.shape
    p = np.pad(d, ((0, 0), (1, 1), (1, 1)))
    th, tw = h // 2, w // 2
    tiles = np.stack([np.stack([p[:, 2 * i:2 * i + 4, 2 * j:2 * j + 4] for j in range(tw)], 1)
                      for i in range(th)], 1)                      # [C, th, tw, 4, 4]
    v = np.einsum("ab,cijbd,ed->cijae", BT, tiles, BT)             # B^T d B
    u = np.einsum("ab,ocbd,ed->ocae", G2, g, G2)                   # (2G) g (2G)^T
    m = wrap32(np.einsum("cijae,ocae->oijae", v, u))               # int32 sums (exact here)
    y4_true = np.einsum("ab,oijbd,ed->oijae", AT, np.einsum("cijae,ocae->oijae", v, u), AT)
    y4 = wrap32(np.einsum("ab,oijbd,ed->oijae", AT, m, AT))        # int32 wrap-around
    y = y4 >> 2
    out = y.transpose(0, 1, 3, 2, 4).reshape(g.shape[0], h, w)
    return out, int(np.abs(v).max()), int(np.abs(u).max()), int(np.abs(y4_true).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--channels", default="64,512,1827")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    for c in (int(s) for s in args.channels.split(",")):
        # the extremes: d at +-255 and weights at -128 / 127 with matching signs, then noise
        d = rng.choice([-255, 255], (c, 4, 4)).astype(np.int64)
        g = np.where(rng.random((2, c, 3, 3)) < 0.5, -128, 127).astype(np.int64)
        g[0] = np.where(d[:, :3, :3] > 0, 127, -128)               # output 0 at its bound
        d2 = rng.integers(-255, 256, (c, 6, 8))
        g2 = rng.integers(-128, 128, (3, c, 3, 3))
        ok, worst, vmax, umax = True, 0, 0, 0
        for dd, gg in ((d, g), (d2, g2)):
            y, vm, um, y4max = winograd(dd, gg)
            ok = ok and np.array_equal(y, direct(dd, gg))
            worst, vmax, umax = max(worst, y4max), max(vmax, vm), max(umax, um)
        print(f"C={c:5d}  max|V| {vmax:5d} (int16)  max|U'| {umax:5d} (int16)  "
              f"bit-exact: {ok}  max|4Y| {worst} ({worst / 2**31:.3f} of 2**31)")


if __name__ == "__main__":
    main()
