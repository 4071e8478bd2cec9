"""Calibration data for ``--quantize int8``: the samples for one model input read from a folder
of images and ``.npy`` files or one ``.npy`` file, each kept at its own size along the input's
symbolic dims or resized bilinearly to its fixed height and width (``read_calibration``); data
it cannot read that way is a ``CalibrationError`` (a usage error, exit 2). Split out of
calibrate.py, which computes the ranges and writes the quantized model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..runtime.errors import UsageError

class CalibrationError(UsageError):
    """The ``--calibration`` data cannot be read as samples of the model's input: one line, exit
    2 like the command's other bad option values (docs/quantization.md), nothing written."""


_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                   ".pgm")
# what read_calibration reads from a folder (the command line checks a folder has one first)
CALIBRATION_SUFFIXES = (".npy",) + _IMAGE_SUFFIXES


def _is_fixed(d) -> bool:
    return isinstance(d, (int, np.integer))


def _shown(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def fits(shape: Sequence[int], spec_shape: Sequence) -> bool:
    """Whether an array of ``shape`` is a value of an input of ``spec_shape`` (whose symbolic
    dims take any size)."""
    return len(shape) == len(spec_shape) and all(
        not _is_fixed(d) or int(d) == n for d, n in zip(spec_shape, shape))


def _resized(arr: np.ndarray, spec_shape: Sequence) -> np.ndarray | None:
    """An NCHW (or NHWC) sample whose only mismatch is its height and width, bilinearly
    resized to the input's fixed H and W; None when that is not what differs."""
    if arr.ndim != 4 or len(spec_shape) != 4 or arr.dtype.kind != "f":
        return None
    for h_axis, c_axis in ((2, 1), (1, 3)):
        hw = (spec_shape[h_axis], spec_shape[h_axis + 1])
        keep = [a for a in range(4) if a not in (h_axis, h_axis + 1)]
        if not all(_is_fixed(d) for d in hw) or not all(
                not _is_fixed(spec_shape[a]) or int(spec_shape[a]) == arr.shape[a] for a in keep):
            continue
        if spec_shape[c_axis] not in (1, 3) and _is_fixed(spec_shape[c_axis]):
            continue
        return _bilinear(arr, h_axis, int(hw[0]), int(hw[1]))
    return None


def _bilinear(arr: np.ndarray, h_axis: int, out_h: int, out_w: int) -> np.ndarray:
    """Resize axes ``h_axis`` and ``h_axis + 1`` of ``arr`` to (out_h, out_w), half-pixel
    centres (as PIL's and ONNX Resize's bilinear)."""
    out = arr.astype(np.float32)
    for axis, size in ((h_axis, out_h), (h_axis + 1, out_w)):
        n = out.shape[axis]
        pos = np.clip((np.arange(size) + 0.5) * n / size - 0.5, 0, n - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)
        frac = (pos - lo).astype(np.float32)
        shape = [1] * out.ndim
        shape[axis] = size
        frac = frac.reshape(shape)
        out = np.take(out, lo, axis) * (1 - frac) + np.take(out, hi, axis) * frac
    return out.astype(arr.dtype)


def _as_samples(arr: np.ndarray, spec, where: str,
                resized_from: list[tuple[int, ...]] | None = None) -> list[np.ndarray]:
    """The samples one calibration array gives for input ``spec``: itself at its own shape, a
    stack of them, or itself resized to the input's fixed height and width."""
    shape = tuple(spec.shape)
    if fits(arr.shape, shape):
        return [arr.astype(spec.dtype, copy=False)]
    if arr.ndim == len(shape) and _is_fixed(shape[0]) and int(shape[0]) == 1 and \
            fits((1, *arr.shape[1:]), shape):
        return [a[None].astype(spec.dtype, copy=False) for a in arr]   # a stack on the batch
    if arr.ndim == len(shape) + 1 and all(fits(a.shape, shape) for a in arr[:1]):
        return [a.astype(spec.dtype, copy=False) for a in arr]
    if all(_is_fixed(d) for d in shape) and arr.size == int(np.prod(shape)):
        return [arr.reshape(shape).astype(spec.dtype, copy=False)]   # e.g. no batch axis
    if fits((1, *arr.shape), shape):
        return [arr[None].astype(spec.dtype, copy=False)]
    resized = _resized(arr, shape)
    if resized is not None:
        if resized_from is not None:
            resized_from.append(tuple(arr.shape))
        return [resized.astype(spec.dtype, copy=False)]
    raise CalibrationError(f"--calibration: {where} has shape {_shown(arr.shape)}; input "
                           f"{spec.name!r} takes {_shown(shape)} (or a stack of them), and no "
                           "resize maps one to the other")


def read_calibration(data: str | os.PathLike, spec, preprocess: dict | None,
                     note: Callable[[str], None] | None = None) -> list[np.ndarray]:
    """The calibration samples for input ``spec`` (a runtime ``TensorSpec``, its dims ints or,
    where the model's are known only at run time, names): every image (read with
    ``preprocess``, the bundle's recorded preprocessing) and ``.npy`` file of folder ``data``,
    in name order; or one ``.npy`` file holding one sample or a stack of them. A sample keeps
    its own size along the input's symbolic dims; an NCHW/NHWC one whose height and width differ
    from the input's fixed ones is resized bilinearly (``note`` gets one line saying how many
    and from which shapes); anything else is a one-line error."""
    from ..runtime.errors import InputError
    from ..runtime.preprocess import load_input

    path = Path(data)
    if not path.exists():
        raise CalibrationError(f"--calibration {data}: no such file or folder")
    if path.is_file():
        if path.suffix.lower() != ".npy":
            raise CalibrationError(f"--calibration {data}: give a folder of images or .npy "
                                   "files, or one .npy file")
        resized: list[tuple[int, ...]] = []
        samples = _as_samples(_load_npy(path), spec, path.name, resized)
        _note_resized(resized, len(samples), spec, note)
        return samples
    files = sorted(p for p in path.iterdir()
                   if p.is_file() and p.suffix.lower() in (".npy",) + _IMAGE_SUFFIXES)
    if not files:
        raise CalibrationError(f"--calibration {data}: the folder has no images or .npy files")
    samples: list[np.ndarray] = []
    resized = []
    for f in files:
        if f.suffix.lower() == ".npy":
            samples += _as_samples(_load_npy(f), spec, f.name, resized)
            continue
        try:
            arr = np.asarray(load_input(f, spec, preprocess))
        except InputError as exc:
            raise CalibrationError(f"--calibration: {exc}") from None
        samples += _as_samples(arr, spec, f.name, resized)
    _note_resized(resized, len(samples), spec, note)
    return samples


def _note_resized(resized: list[tuple[int, ...]], total: int, spec,
                  note: Callable[[str], None] | None) -> None:
    """One line on the samples resized to the input's fixed size (as ``infer`` notes an image
    it resizes): calibrating on resized data is the user's call to make knowingly."""
    if not resized or note is None:
        return
    shapes = sorted(set(resized))
    shown = ", ".join(_shown(s) for s in shapes[:3]) + (" ..." if len(shapes) > 3 else "")
    note(f"--calibration: {len(resized)} of {total} samples resized bilinearly from {shown} to "
         f"{_shown(spec.shape)}, the size of input {spec.name!r}")


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CalibrationError(f"--calibration {path} is not a readable .npy file "
                               f"({exc})") from None
