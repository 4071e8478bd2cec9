"""Frames of a signal and their overlap sum: a 1-D convolution whose stride divides its window
(an STFT written as a Conv1d: silero VAD's 256 taps at stride 128) as a matmul with the output
channels on the vector lanes (``passes/strided_frames.py``).

``nn.frames`` cuts ``x`` [N, C, 1, W] into ``count`` hops of ``hop`` samples, [N, count,
C * hop] (channel-major within a row); ``nn.frame_sum`` adds the ``parts`` slices of a matmul's
[N, count, parts * O] result that belong to each output position, giving the convolution's
[N, O, 1, length] (``length`` = ``count`` - ``parts`` + 1): output t is the sum over i of
part i of frame t + i."""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.sym import Dim
from .registry import INJECTIVE, register_op


def _infer_frames(x: TensorType, hop: int = 1, count: Dim = 1) -> TensorType:
    if len(x.shape) != 4 or x.shape[2] != 1:
        raise ValueError(f"frames: input {x.shape} is not [N, C, 1, W]")
    return TensorType((x.shape[0], count, x.shape[1] * hop), x.dtype)


def _legalize_frames(x: te.Tensor, out_type: TensorType, name: str, hop: int = 1,
                     count: Dim = 1) -> te.Tensor:
    if x.shape[1] == 1:
        return te.compute(out_type.shape, lambda n, r, k: x[(n, 0, 0, r * hop + k)], name=name)
    return te.compute(out_type.shape,
                      lambda n, r, k: x[(n, k // hop, 0, r * hop + k % hop)], name=name)


@register_op("nn.frames", INJECTIVE, _infer_frames, _legalize_frames)
def frames(x: np.ndarray, hop: int = 1, count: Dim = 1) -> np.ndarray:
    n, c, _, _ = x.shape
    count = int(count)
    rows = x[:, :, 0, :count * hop].reshape(n, c, count, hop)
    return np.ascontiguousarray(rows.transpose(0, 2, 1, 3).reshape(n, count, c * hop))


def _infer_frame_sum(y: TensorType, parts: int = 1, length: Dim = 1) -> TensorType:
    if len(y.shape) != 3 or not isinstance(y.shape[2], int) or y.shape[2] % parts:
        raise ValueError(f"frame_sum: input {y.shape} is not [N, count, {parts} * O]")
    return TensorType((y.shape[0], y.shape[2] // parts, 1, length), y.dtype)


def _legalize_frame_sum(y: te.Tensor, out_type: TensorType, name: str, parts: int = 1,
                        length: Dim = 1) -> te.Tensor:
    channels = out_type.shape[1]

    def body(n, o, z, t):
        total = y[(n, t, o)]
        for i in range(1, parts):
            total = total + y[(n, t + i, o + i * channels)]
        return total

    return te.compute(out_type.shape, body, name=name)


@register_op("nn.frame_sum", INJECTIVE, _infer_frame_sum, _legalize_frame_sum)
def frame_sum(y: np.ndarray, parts: int = 1, length: Dim = 1) -> np.ndarray:
    n, _, width = y.shape
    o, t = width // parts, int(length)
    out = sum(y[:, i:i + t, i * o:(i + 1) * o] for i in range(parts))
    return np.ascontiguousarray(np.asarray(out).transpose(0, 2, 1)[:, :, None, :])
