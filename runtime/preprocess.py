"""Turning a file into a model input: raw ``.npy`` tensors, or images decoded with Pillow and
prepared as the bundle's recorded preprocessing says (size, colour, scale, mean/std, layout)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .errors import InputError
from .model import TensorSpec

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def default_preprocess(spec: TensorSpec) -> dict[str, Any] | None:
    """What an image input most likely means for an input of this shape (or None)."""
    shape = spec.shape
    if len(shape) == 4 and shape[1] in (1, 3):
        return {"size": [shape[2], shape[3]], "color": "L" if shape[1] == 1 else "RGB",
                "scale": 1 / 255, "mean": [0.0], "std": [1.0], "layout": "NCHW"}
    if len(shape) == 4 and shape[3] in (1, 3):
        return {"size": [shape[1], shape[2]], "color": "L" if shape[3] == 1 else "RGB",
                "scale": 1 / 255, "mean": [0.0], "std": [1.0], "layout": "NHWC"}
    if len(shape) == 2:
        side = int(round(np.sqrt(shape[1])))
        if side * side == shape[1]:
            return {"size": [side, side], "color": "L", "scale": 1 / 255, "mean": [0.0],
                    "std": [1.0], "layout": "flat"}
    return None


def load_image(path: str, pre: dict[str, Any], spec: TensorSpec) -> np.ndarray:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise InputError("reading images needs Pillow (pip install 'mlcpack-runtime[images]', "
                         "or pip install Pillow); or pass a .npy tensor") from None
    try:
        with Image.open(path) as img:
            img.load()
            color = pre.get("color", "RGB")
            if img.mode in ("I;16", "I;16B", "I;16L", "I") and color == "L":
                # 16-bit grayscale: scale to 8 bits so the recorded scale (1/255) still applies.
                arr16 = np.asarray(img, dtype=np.float64)
                img = Image.fromarray((arr16 / max(arr16.max(), 1) * 255).astype(np.uint8))
            img = img.convert(color)
            h, w = (int(v) for v in pre["size"])
            if img.size != (w, h):
                img = img.resize((w, h), Image.BILINEAR)
            arr = np.asarray(img, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"{path} is not a readable image ({exc})") from None
    if arr.ndim == 2:
        arr = arr[:, :, None]
    arr = arr * np.float32(pre.get("scale", 1.0))
    mean = np.asarray(pre.get("mean", [0.0]), dtype=np.float32)
    std = np.asarray(pre.get("std", [1.0]), dtype=np.float32)
    arr = (arr - mean) / std
    layout = pre.get("layout", "NCHW")
    if layout == "NCHW":
        arr = arr.transpose(2, 0, 1)
    arr = np.ascontiguousarray(arr[None], dtype=np.float32)
    if arr.size != int(np.prod(spec.shape)):
        raise InputError(f"{path} gives {arr.size} values after preprocessing; input "
                         f"{spec.name!r} takes shape {spec.shape}")
    return arr.reshape(spec.shape).astype(spec.dtype, copy=False)


def load_input(path: str | os.PathLike, spec: TensorSpec, preprocess: dict | None) -> np.ndarray:
    """Read ``path`` as the value of input ``spec``: a .npy tensor or an image."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path} is a directory, not an input file")
    if path.endswith(".npy"):
        try:
            return np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"{path} is not a readable .npy file ({exc})") from None
    pre = preprocess or default_preprocess(spec)
    if pre is None:
        raise InputError(f"input {spec.name!r} has shape {spec.shape}, which no image maps to; "
                         "pass a .npy tensor, or export with --input-size to record "
                         "preprocessing")
    return load_image(path, pre, spec)
