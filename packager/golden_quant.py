"""The golden check's knowledge of quantized models (``packager/golden.py``): the quantization
step each output carries and the range a quantized input's values take (the ONNX model ONNX
Runtime runs exactly is ``frontends/reference.py`` ``exact_integers``)."""

from __future__ import annotations

import numpy as np

from .ir.graph import Call, Constant, Function

# Quantization steps pass through these unchanged (data moves, activations with slope <= 1,
# pools); add/subtract add their operands' steps; any other operator makes the step unknown (0).
_STEP_KEEPING = frozenset({"relu", "clip", "sigmoid", "tanh", "leaky_relu", "cast", "maximum",
                           "minimum", "max", "min", "mean", "nn.max_pool2d", "nn.avg_pool2d",
                           "nn.pool"})


def quantization_step(op: str, kind: str, args: list[np.ndarray], arg_steps: list[float]
                      ) -> float:
    """The quantization step a call's output carries (see ``runtime/selftest.py``)."""
    if op == "dequantize":
        return float(np.abs(args[1]).max(initial=0.0))
    if op == "quantize":
        return 1.0   # in the integer's own units
    if op in ("add", "subtract"):
        return float(sum(arg_steps))
    if op in _STEP_KEEPING or kind in ("view", "injective"):
        return max(arg_steps, default=0.0)
    return 0.0


def quantized_input_ranges(fn: Function) -> dict[str, tuple[float, float]]:
    """Per float input that a ``quantize`` with constant scale and zero point reads directly
    (the input of a calibrated QDQ model): the range of values its integers represent, from
    the scale and zero point. Random check inputs drawn there stay in the range the model was
    calibrated for; normal noise beyond it only saturates at the first layer and drives every
    later activation to its extremes, where one rounding tie spreads into large errors."""
    from .ops.quant import saturation_range

    params = {id(p): p.name for p in fn.params if np.dtype(p.type.dtype).kind == "f"}
    out: dict[str, tuple[float, float]] = {}
    for b in fn.bindings():
        v = b.value
        if not (isinstance(v, Call) and v.op == "quantize" and id(v.args[0]) in params
                and all(isinstance(a, Constant) for a in v.args[1:3])):
            continue
        scale, zp = (np.asarray(a.data, np.float64) for a in v.args[1:3])
        if scale.size != 1 or zp.size != 1 or not float(scale.ravel()[0]) > 0:
            continue
        qmin, qmax = saturation_range(v.attrs.get("dtype", "uint8"))
        s, z = float(scale.ravel()[0]), float(zp.ravel()[0])
        lo, hi = (qmin - z) * s, (qmax - z) * s
        name = params[id(v.args[0])]
        old = out.get(name)
        out[name] = (lo, hi) if old is None else (max(old[0], lo), min(old[1], hi))
    return {k: r for k, r in out.items() if r[1] > r[0]}
