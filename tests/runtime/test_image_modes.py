"""Every Pillow mode an image file can have, prepared for a colour (RGB) and a greyscale (L)
input: the pixels land on the 8-bit scale the recorded ``--scale`` (1/255) expects, 16-bit and
float images scaled by their range, never clipped at 255."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mlcpack.runtime.model import TensorSpec
from mlcpack.runtime.preprocess import load_input, pixels

H, W = 12, 16
_rng = np.random.default_rng(7)
RGB = _rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
GREY = _rng.integers(0, 256, (H, W), dtype=np.uint8)


def _luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma, as Pillow converts colour to L."""
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    return r * 0.299 + g * 0.587 + b * 0.114


def _palette() -> tuple[Image.Image, np.ndarray]:
    img = Image.fromarray(RGB).quantize(16)
    pal = np.asarray(img.getpalette()[:48], np.uint8).reshape(16, 3)
    return img, pal[np.asarray(img)]


def _case(mode: str) -> tuple[Image.Image, np.ndarray]:
    """An image in ``mode`` and the (H, W, 3) colour it shows on the 8-bit scale."""
    grey3 = np.repeat(GREY[:, :, None], 3, axis=2).astype(np.float64)
    if mode == "1":
        bits = GREY > 127
        return Image.fromarray(bits), np.repeat(bits[:, :, None] * 255.0, 3, axis=2)
    if mode == "L":
        return Image.fromarray(GREY), grey3
    if mode == "LA":
        return Image.fromarray(np.dstack([GREY, 255 - GREY]), "LA"), grey3
    if mode == "P":
        img, shown = _palette()
        return img, shown.astype(np.float64)
    if mode in ("RGB", "RGBA", "CMYK", "YCbCr"):
        return Image.fromarray(RGB).convert(mode), RGB.astype(np.float64)
    if mode == "I;16":
        return Image.fromarray(GREY.astype(np.uint16) * 257), grey3
    if mode == "I":
        return Image.fromarray(GREY.astype(np.int32) * 257), grey3
    if mode == "F":  # a float image in [0, 1]
        return Image.fromarray(GREY.astype(np.float32) / 255), grey3
    if mode == "F255":  # a float image on the 8-bit scale
        return Image.fromarray(GREY.astype(np.float32)), grey3
    raise AssertionError(mode)


MODES = ["1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "YCbCr", "I;16", "I", "F", "F255"]


@pytest.mark.parametrize("color", ["RGB", "L"])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_is_scaled_for_colour_and_grey_inputs(tmp_path, mode, color):
    img, shown = _case(mode)
    assert img.mode == ("F" if mode == "F255" else mode)
    channels = 3 if color == "RGB" else 1
    spec = TensorSpec("x", (1, H, W, channels), "float32", 0)
    pre = {"size": [H, W], "color": color, "scale": 1 / 255, "mean": [0.0], "std": [1.0],
           "layout": "NHWC"}
    if mode == "YCbCr":  # no file format reads back as YCbCr (JPEG opens as RGB)
        x = pixels(img, color, (H, W))[None] / 255
    else:
        path = tmp_path / ("img.tiff" if mode in ("I", "F", "F255", "CMYK") else "img.png")
        img.save(path)
        with Image.open(path) as back:  # read back in the mode under test
            assert back.mode == img.mode
        x = load_input(path, spec, pre)
    want = shown if color == "RGB" else _luma(shown)[:, :, None]
    lossy = mode in ("YCbCr", "P") or (color == "L" and mode not in ("1", "L", "LA", "I;16", "I",
                                                                     "F", "F255"))
    tol = 3.0 if mode == "YCbCr" else (1.0 if lossy else 1e-3)  # YCbCr: an 8-bit round trip
    np.testing.assert_allclose(x[0] * 255, want, atol=tol)
    assert float(x.max()) <= 1.0 + 1e-6


@pytest.mark.parametrize("color", ["RGB", "L"])
def test_sixteen_bit_png_equals_its_eight_bit_image(tmp_path, color):
    """The issue's case: a 16-bit greyscale PNG for a colour model was 99.5 % white."""
    Image.fromarray(GREY.astype(np.uint16) * 257).save(tmp_path / "g16.png")
    Image.fromarray(GREY).save(tmp_path / "g8.png")
    channels = 3 if color == "RGB" else 1
    spec = TensorSpec("x", (1, channels, 8, 8), "float32", 0)
    pre = {"size": [8, 8], "color": color, "scale": 1 / 255, "mean": [0.5], "std": [0.25],
           "layout": "NCHW"}
    x16 = load_input(tmp_path / "g16.png", spec, pre)
    x8 = load_input(tmp_path / "g8.png", spec, pre)
    np.testing.assert_allclose(x16, x8, atol=0.02)  # resized 12x16 -> 8x8: float vs 8-bit steps
    assert np.mean(x16 == x16.max()) < 0.1
