"""Turning a file into a model input: raw ``.npy`` tensors, or images decoded with Pillow and
prepared as the bundle's recorded preprocessing says (size, colour, scale, mean/std, layout)."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from .errors import InputError, install_hint
from .model import TensorSpec

Fit = Callable[[int, int], tuple[int, int, str]]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
COLORS = {"L": 1, "RGB": 3}           # recorded colour -> channels the model input has
LAYOUTS = ("NCHW", "NHWC", "flat")

# Pillow modes by the colour they carry: a note is due only when the class changes.
_GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})


class PreprocessError(ValueError):
    """A recorded preprocessing or label option does not fit the model (one line naming the
    option and what it allows)."""


def normalize_preprocess(pre: dict[str, Any]) -> dict[str, Any]:
    """``pre`` with colour and layout spelled canonically (``rgb`` -> ``RGB``, ``nhwc`` ->
    ``NHWC``); raises ``PreprocessError`` for a value no image input can have, before the model
    is even read."""
    out = dict(pre)
    color = str(out.get("color", "RGB"))
    if color.upper() not in COLORS:
        raise PreprocessError(f"--color {color!r} is not a colour mlcpack records; allowed: "
                              f"{', '.join(COLORS)}")
    out["color"] = color.upper()
    layout = str(out.get("layout", "NCHW"))
    canonical = {v.lower(): v for v in LAYOUTS}.get(layout.lower())
    if canonical is None:
        raise PreprocessError(f"--layout {layout!r} is not a layout; allowed: "
                              f"{', '.join(LAYOUTS)}")
    out["layout"] = canonical
    size = out.get("size")
    if size is not None and (len(size) != 2 or min(size) < 1):
        raise PreprocessError(f"--input-size {'x'.join(map(str, size))} should be two positive "
                              "numbers, HxW, e.g. 224x224")
    scale = out.get("scale", 1.0)
    if not np.isfinite(scale) or scale == 0:
        raise PreprocessError(f"--scale {scale!r} should be a finite, non-zero number "
                              "(e.g. 0.00392157 for 1/255)")
    for key in ("mean", "std"):
        values = list(out.get(key, [0.0 if key == "mean" else 1.0]))
        if not values or not all(np.isfinite(values)):
            raise PreprocessError(f"--{key} {values} should be finite numbers")
        if key == "std" and any(v == 0 for v in values):
            raise PreprocessError(f"--std {','.join(map(str, values))} has a 0 (pixels are "
                                  "divided by it)")
    return out


def _image_geometry(spec: TensorSpec, layout: str) -> tuple[tuple[int, int] | None, int | None]:
    """(HxW, channels) the input takes in ``layout``; ``None`` where the layout leaves it open
    (a flat input fixes only the product)."""
    shape = spec.shape
    if layout == "NCHW" and len(shape) == 4:
        return (shape[2], shape[3]), shape[1]
    if layout == "NHWC" and len(shape) == 4:
        return (shape[1], shape[2]), shape[3]
    return None, None


def check_preprocess(pre: dict[str, Any], spec: TensorSpec) -> None:
    """Raise ``PreprocessError`` unless an image prepared as ``pre`` says (already
    normalized) fills input ``spec`` exactly: its layout fits the input's rank, its colour the
    channels, its size the other dims, and ``--mean``/``--std`` have 1 or channels values."""
    shape, layout = spec.shape, pre["layout"]
    channels = COLORS[pre["color"]]
    if layout == "flat":
        if len(shape) != 2:
            raise PreprocessError(f"--layout flat needs a rank-2 input (N, values); input "
                                  f"{spec.name!r} has shape {shape}: allowed layouts for it: "
                                  f"{'NCHW, NHWC' if len(shape) == 4 else 'none (pass .npy)'}")
        h, w = pre["size"]
        if h * w * channels != shape[1]:
            raise PreprocessError(
                f"--input-size {h}x{w} with --color {pre['color']} gives {h * w * channels} "
                f"values; input {spec.name!r} takes {shape[1]} per row: allowed sizes are HxW "
                f"with H*W*channels = {shape[1]}")
    else:
        if len(shape) != 4:
            raise PreprocessError(f"--layout {layout} needs a rank-4 input; input {spec.name!r} "
                                  f"has shape {shape}: allowed layout for it: "
                                  f"{'flat' if len(shape) == 2 else 'none (pass .npy)'}")
        (h, w), want = _image_geometry(spec, layout)
        if want not in COLORS.values():
            other = "NHWC" if layout == "NCHW" else "NCHW"
            hint = f" (is it {other}? then --layout {other})" \
                if _image_geometry(spec, other)[1] in COLORS.values() else ""
            raise PreprocessError(f"--layout {layout}: input {spec.name!r} {shape} has {want} "
                                  f"channels, which no image colour gives (L: 1, RGB: 3){hint}")
        if want != channels:
            allowed = next(c for c, n in COLORS.items() if n == want)
            raise PreprocessError(f"--color {pre['color']} gives {channels} channel(s); input "
                                  f"{spec.name!r} {shape} ({layout}) has {want}: allowed "
                                  f"--color {allowed}")
        fixed = [isinstance(d, (int, np.integer)) for d in (h, w)]
        if any(f and int(v) != d for f, v, d in zip(fixed, pre["size"], (h, w))):
            size = "x".join(map(str, pre["size"]))
            if all(fixed):
                allowed = f"allowed --input-size {h}x{w}"
            else:   # an open size takes any value: say which one is fixed
                allowed = (f"its height is {h}: --input-size {h}xW for any width W"
                           if fixed[0] else f"its width is {w}: --input-size Hx{w} for any "
                           "height H")
            shown = "(" + ", ".join(map(str, shape)) + ")"
            raise PreprocessError(f"--input-size {size} does not fit input {spec.name!r} "
                                  f"{shown} ({layout}): {allowed}")
    for key in ("mean", "std"):
        n = len(pre.get(key, [0.0]))
        if n not in (1, channels):
            raise PreprocessError(f"--{key} has {n} values; --color {pre['color']} has "
                                  f"{channels} channel(s): give "
                                  f"{'1' if channels == 1 else f'1 or {channels}'}")


def check_labels(labels: list[str], spec: TensorSpec) -> None:
    """Raise ``PreprocessError`` unless there is one label per class of output ``spec`` (its
    values per row: the first dim is the batch when the output has two or more)."""
    classes = int(np.prod(spec.shape[1:] if len(spec.shape) >= 2 else spec.shape))
    if len(labels) != classes:
        raise PreprocessError(f"--labels has {len(labels)} label(s); output {spec.name!r} "
                              f"{spec.shape} has {classes} classes per row: give exactly "
                              f"{classes} (a file with one a line, or a,b,c)")


def default_preprocess(spec: TensorSpec) -> dict[str, Any] | None:
    """What an image input most likely means for an input of this shape (or None)."""
    shape = spec.shape
    if len(shape) == 4 and shape[1] in (1, 3):
        return {"size": [shape[2], shape[3]], "color": "L" if shape[1] == 1 else "RGB",
                "scale": 1 / 255, "mean": [0.0], "std": [1.0], "layout": "NCHW"}
    if len(shape) == 4 and shape[3] in (1, 3):
        return {"size": [shape[1], shape[2]], "color": "L" if shape[3] == 1 else "RGB",
                "scale": 1 / 255, "mean": [0.0], "std": [1.0], "layout": "NHWC"}
    if len(shape) == 2 and isinstance(shape[1], (int, np.integer)):
        side = int(round(np.sqrt(shape[1])))
        if side * side == shape[1]:
            return {"size": [side, side], "color": "L", "scale": 1 / 255, "mean": [0.0],
                    "std": [1.0], "layout": "flat"}
    return None


def _target_size(img: Any, pre: dict[str, Any], fit: Fit | None = None
                 ) -> tuple[int, int, str]:
    """(H, W) to prepare ``img`` at, and why it differs from the image's own size where the
    model chose it: the recorded size; where an axis's size is known only at run time (a
    bundle with symbolic shapes: a name such as ``H``) the image's own (scaled as the fixed
    side is, when only one side is open), or with ``fit`` (``sizes.image_size_fitter``) the
    nearest size the model's relations allow."""
    h, w = pre["size"]
    fixed_h, fixed_w = isinstance(h, (int, np.integer)), isinstance(w, (int, np.integer))
    # one side fixed, the other open (an OCR recognizer's 48 x W): the open side is scaled by
    # the same factor, keeping the aspect ratio (taking the image's own width squashed a
    # 448x172 text line to 448x48)
    if fixed_h and not fixed_w:
        w = max(1, round(img.size[0] * int(h) / max(1, img.size[1])))
    elif fixed_w and not fixed_h:
        h = max(1, round(img.size[1] * int(w) / max(1, img.size[0])))
    h = int(h) if isinstance(h, (int, np.integer)) else img.size[1]
    w = int(w) if isinstance(w, (int, np.integer)) else img.size[0]
    return fit(h, w) if fit is not None else (h, w, "")


def _mismatch(path: str, img: Any, pre: dict[str, Any], fit: Fit | None = None
              ) -> tuple[str, str] | None:
    """(note, strict error) when preparing ``img`` as ``pre`` records changes its size or
    colour; None when it fits."""
    h, w, why = _target_size(img, pre, fit)
    color = pre.get("color", "RGB")
    changes, differs = [], []
    if img.size != (w, h) and why:   # open sizes: the model's relations chose the size
        changes.append(f"resized from {img.size[0]}x{img.size[1]} to {w}x{h} (WxH), the "
                       f"nearest size the model takes ({why})")
        differs.append(f"is {img.size[0]}x{img.size[1]} (WxH), a size the model does not take "
                       f"({why}; the nearest is {w}x{h})")
    elif img.size != (w, h):
        changes.append(f"resized from {img.size[0]}x{img.size[1]} to {w}x{h} (WxH)")
        differs.append(f"is {img.size[0]}x{img.size[1]} (WxH), not {w}x{h}")
    grey = img.mode in _GREY_MODES
    if grey != (color == "L"):
        want = "greyscale (L)" if color == "L" else "colour (RGB)"
        changes.append(f"converted from {'greyscale' if grey else 'colour'} ({img.mode}) to "
                       f"{want}")
        differs.append(f"is {'greyscale' if grey else 'colour'} ({img.mode}), not {want}")
    if not changes:
        return None
    name = os.path.basename(path)
    source = "" if why and len(changes) == 1 and img.size != (w, h) else \
        ", as the bundle's recorded preprocessing says"
    takes = " as the bundle's recorded preprocessing takes" if source else ""
    return (f"{name} was {' and '.join(changes)}{source}",
            f"{name} {' and '.join(differs)}{takes}; --strict refuses to resize or convert it "
            "(drop --strict to accept that)")


def _wide_range(img: Any, values: np.ndarray) -> float:
    """The value that means full white in a greyscale image wider than 8 bits: 65535 for the
    integer modes (16-bit PNG/TIFF; Pillow reads some as ``I``), 1.0 for a float image whose
    values all lie in [0, 1], else 255 (Pillow's own scale for ``F``)."""
    if img.mode != "F":
        return 65535.0
    finite = values[np.isfinite(values)]
    inside = finite.size and finite.min() >= 0 and finite.max() <= 1
    return 1.0 if inside else 255.0


def pixels(img: Any, color: str, size: tuple[int, int]) -> np.ndarray:
    """``img`` (any Pillow mode) as float32 (H, W, channels) on the 8-bit scale, 0..255, in
    ``color`` (``L``: 1 channel, ``RGB``: 3) at ``size`` (H, W), resized bilinearly.

    Modes of 8 bits per channel (1, L, LA, P, PA, RGB, RGBA, CMYK, YCbCr...) convert with
    Pillow (alpha dropped). Wider greyscale modes (I;16*, I, F) are scaled to 0..255 by their
    range (``_wide_range``), never clipped at 255 as Pillow's own conversion does, and the
    grey channel is repeated for a colour input."""
    from PIL import Image

    h, w = size
    if img.mode.startswith("I") or img.mode == "F":
        values = np.asarray(img, dtype=np.float64)
        grey = np.clip(values * (255.0 / _wide_range(img, values)), 0, 255).astype(np.float32)
        wide = Image.fromarray(grey) if grey.ndim == 2 else None
        if wide is None:
            raise ValueError(f"image mode {img.mode} with shape {grey.shape}")
        if wide.size != (w, h):
            wide = wide.resize((w, h), Image.BILINEAR)
        arr = np.asarray(wide, dtype=np.float32)[:, :, None]
        return np.repeat(arr, COLORS[color], axis=2)
    img = img.convert(color)
    if img.size != (w, h):
        img = img.resize((w, h), Image.BILINEAR)
    arr = np.asarray(img, dtype=np.float32)
    return arr[:, :, None] if arr.ndim == 2 else arr


def load_image(path: str, pre: dict[str, Any], spec: TensorSpec,
               note: Callable[[str], None] | None = None, strict: bool = False,
               fit: Fit | None = None) -> np.ndarray:
    """Decode the image at ``path`` and prepare it as ``pre`` says. An image whose size or
    colour differs from the recorded ones is still resized/converted, with a one-line
    ``note`` (``strict``: an ``InputError`` instead). ``fit``: see ``_target_size``."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise InputError(f"reading images needs Pillow: {install_hint('images')}; or pass a "
                         ".npy tensor") from None
    try:
        with Image.open(path) as img:
            img.load()
            changed = _mismatch(path, img, pre, fit)
            if changed and strict:
                raise InputError(changed[1])
            if changed and note is not None:
                note(f"note: {changed[0]}")
            arr = pixels(img, pre.get("color", "RGB"), _target_size(img, pre, fit)[:2])
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"{path} is not a readable image ({exc})") from None
    arr = arr * np.float32(pre.get("scale", 1.0))
    mean = np.asarray(pre.get("mean", [0.0]), dtype=np.float32)
    std = np.asarray(pre.get("std", [1.0]), dtype=np.float32)
    arr = (arr - mean) / std
    layout = pre.get("layout", "NCHW")
    if layout == "NCHW":
        arr = arr.transpose(2, 0, 1)
    arr = np.ascontiguousarray(arr[None], dtype=np.float32)
    fixed = [d for d in spec.shape if isinstance(d, (int, np.integer))]
    if len(fixed) == len(spec.shape):
        if arr.size != int(np.prod(spec.shape)):
            raise InputError(f"{path} gives {arr.size} values after preprocessing; input "
                             f"{spec.name!r} takes shape {spec.shape}")
        return arr.reshape(spec.shape).astype(spec.dtype, copy=False)
    # sizes known at run time (names): the image's own, one image as the batch
    if layout == "flat":
        arr = arr.reshape(1, -1)
    if arr.ndim != len(spec.shape) or any(isinstance(d, (int, np.integer)) and d != n
                                          for d, n in zip(spec.shape, arr.shape)):
        shown = "(" + ", ".join(map(str, spec.shape)) + ")"
        raise InputError(f"{path} gives shape {tuple(arr.shape)} after preprocessing; input "
                         f"{spec.name!r} takes {shown}")
    return arr.astype(spec.dtype, copy=False)


def load_input(path: str | os.PathLike, spec: TensorSpec, preprocess: dict | None, *,
               note: Callable[[str], None] | None = None, strict: bool = False,
               model: Any = None) -> np.ndarray:
    """Read ``path`` as the value of input ``spec``: a .npy tensor or an image (``note`` and
    ``strict``: see ``load_image``). With ``model``, an image for open height and width is
    prepared at the nearest size the model's relations allow (``sizes.image_size_fitter``)."""
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
    fit = None
    if model is not None:
        from .sizes import image_size_fitter
        fit = image_size_fitter(model, spec, pre.get("layout", "NCHW"))
    return load_image(path, pre, spec, note, strict, fit)
