"""Architectures for pickled weights: inferred for plain MLP chains, or read from a spec file.

An MLP is inferred from keys ``w0, b0, w1, b1, ...`` (``w`` is [out, in], as the course stores
it): linear -> relu -> ... -> linear. Any other architecture is a small spec (JSON or TOML)::

    input = { name = "x", shape = [1, 1, 28, 28] }
    [[layers]]
    op = "conv2d"
    weight = "conv1.w"
    bias = "conv1.b"
    padding = 1
    [[layers]]
    op = "relu"

Layer ops: linear, conv2d, relu, sigmoid, tanh, gelu, flatten, softmax, maxpool2d, avgpool2d,
globalavgpool, and library (a function the application supplies at load, called by name).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from typing import Any, Callable, Mapping

import numpy as np

from ..packager.ir.builder import BlockBuilder, BuilderError
from ..packager.ir.graph import IRModule, TensorType, Var
from ..runtime.errors import MlcpackError


class ArchError(MlcpackError):
    """The architecture cannot be built from these weights (or the spec is malformed)."""

    exit_code = 10


def infer_mlp_spec(weights: Mapping[str, np.ndarray], batch: int = 1) -> dict:
    """The spec of the MLP that keys ``w0, b0, ..., wN, bN`` describe; checks that shapes chain."""
    layers, n = [], 0
    if "w0" not in weights:
        raise ArchError(f"cannot infer an architecture: no 'w0' among keys "
                        f"{sorted(weights)[:8]}; give one with --arch spec.toml")
    while f"w{n}" in weights:
        n += 1
    extra = sorted(set(weights) - {f"{p}{i}" for p in "wb" for i in range(n)})
    if extra:
        raise ArchError(f"cannot infer an MLP: unexpected keys {extra}; "
                        "give the architecture with --arch spec.toml")
    width = None
    for i in range(n):
        w = weights[f"w{i}"]
        if w.ndim != 2:
            raise ArchError(f"w{i} has shape {w.shape}; an MLP layer weight is [out, in]")
        if width is not None and w.shape[1] != width:
            raise ArchError(f"weights do not chain: w{i} takes {w.shape[1]} inputs but layer "
                            f"{i - 1} gives {width}")
        b = weights.get(f"b{i}")
        if b is not None and b.shape != (w.shape[0],):
            raise ArchError(f"b{i} has shape {b.shape}; expected ({w.shape[0]},) to match w{i}")
        width = w.shape[0]
        layers.append({"op": "linear", "weight": f"w{i}",
                       **({"bias": f"b{i}"} if b is not None else {})})
        if i < n - 1:
            layers.append({"op": "relu"})
    return {"input": {"name": "x", "shape": [batch, int(weights["w0"].shape[1])]},
            "output": "logits", "layers": layers}


def read_spec(path: str | os.PathLike) -> dict:
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
        spec = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except FileNotFoundError:
        raise ArchError(f"{path}: no such file") from None
    except (ValueError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ArchError(f"{path} is not a valid {'TOML' if path.endswith('.toml') else 'JSON'} "
                        f"spec: {exc}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("layers"), list):
        raise ArchError(f"{path}: a spec needs a 'layers' list")
    return spec


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, (int, float)) else (int(v[0]), int(v[1]))


def _pads(v: Any) -> tuple[int, int, int, int]:
    if isinstance(v, (int, float)):
        return (int(v),) * 4
    if len(v) == 2:
        return (int(v[0]), int(v[1]), int(v[0]), int(v[1]))
    return tuple(int(p) for p in v)  # type: ignore[return-value]


class _SpecBuilder:
    def __init__(self, bb: BlockBuilder, weights: Mapping[str, np.ndarray]) -> None:
        self.bb = bb
        self.weights = weights
        self.used: set[str] = set()

    def weight(self, layer: dict, key: str, required: bool = True):
        name = layer.get(key)
        if name is None:
            if required:
                raise ArchError(f"layer {layer['op']} needs '{key}' (the name of a weight)")
            return None
        if name not in self.weights:
            raise ArchError(f"layer {layer['op']}: weight {name!r} is not in the file "
                            f"(it has {sorted(self.weights)[:12]})")
        self.used.add(name)
        return self.bb.constant(self.weights[name], re.sub(r"\W", "_", name))

    def linear(self, x: Var, layer: dict) -> Var:
        w = self.weight(layer, "weight")
        y = self.bb.emit_op("matmul", x, w, transpose_b=True)
        b = self.weight(layer, "bias", required=False)
        return self.bb.emit_op("add", y, b) if b is not None else y

    def conv2d(self, x: Var, layer: dict) -> Var:
        w = self.weight(layer, "weight")
        y = self.bb.emit_op("nn.conv2d", x, w, strides=_pair(layer.get("stride", 1)),
                            padding=_pads(layer.get("padding", 0)),
                            dilation=_pair(layer.get("dilation", 1)),
                            groups=int(layer.get("groups", 1)))
        b = self.weight(layer, "bias", required=False)
        if b is None:
            return y
        shaped = self.bb.constant(self.weights[layer["bias"]].reshape(1, -1, 1, 1),
                                  re.sub(r"\W", "_", layer["bias"]))
        return self.bb.emit_op("add", y, shaped)

    def pool(self, op: str) -> Callable[[Var, dict], Var]:
        def build(x: Var, layer: dict) -> Var:
            kernel = _pair(layer.get("kernel", 2))
            return self.bb.emit_op(op, x, kernel=kernel,
                                   strides=_pair(layer.get("stride", kernel)),
                                   padding=_pads(layer.get("padding", 0)))
        return build

    def flatten(self, x: Var, layer: dict) -> Var:
        shape = x.type.shape
        return self.bb.emit_op("reshape", x, shape=(shape[0], int(np.prod(shape[1:]))))

    def library(self, x: Var, layer: dict) -> Var:
        func = layer.get("func")
        if not isinstance(func, str):
            raise ArchError("layer library needs 'func', the library function's name")
        shape = tuple(layer.get("shape", x.type.shape))
        attrs = {k: v for k, v in layer.items() if k not in ("op", "func", "shape")}
        return self.bb.call_library(func, [x], TensorType(shape, x.type.dtype), **attrs)


_SIMPLE_OPS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "gelu": "gelu"}


def build_from_spec(spec: dict, weights: Mapping[str, np.ndarray],
                    input_shape: tuple[int, ...] | None = None) -> IRModule:
    """Build the IRModule ``main(input) -> output`` that ``spec`` describes over ``weights``."""
    inp = spec.get("input", {})
    shape = input_shape or tuple(inp.get("shape", ()))
    if not shape:
        raise ArchError("the spec needs input.shape (or pass --input-shape)")
    bb = BlockBuilder()
    x = bb.input(inp.get("name", "x"), shape, "float32")
    sb = _SpecBuilder(bb, weights)
    handlers: dict[str, Callable[[Var, dict], Var]] = {
        "linear": sb.linear, "conv2d": sb.conv2d, "flatten": sb.flatten, "library": sb.library,
        "maxpool2d": sb.pool("nn.max_pool2d"), "avgpool2d": sb.pool("nn.avg_pool2d"),
        "globalavgpool": lambda v, layer: bb.emit_op("mean", v, axes=(2, 3), keepdims=True),
        "softmax": lambda v, layer: bb.emit_op("nn.softmax", v, axis=int(layer.get("axis", -1))),
        **{k: (lambda v, layer, _op=op: bb.emit_op(_op, v)) for k, op in _SIMPLE_OPS.items()},
    }
    with bb.function("main", [x]):
        with bb.dataflow():
            v = x
            for i, layer in enumerate(spec["layers"]):
                op = layer.get("op") if isinstance(layer, dict) else None
                if op not in handlers:
                    raise ArchError(f"layer {i}: unknown op {op!r}; known: {sorted(handlers)}")
                try:
                    v = handlers[op](v, layer)
                except BuilderError as exc:
                    raise ArchError(f"layer {i} ({op}): {exc}") from None
                except (TypeError, ValueError, KeyError, IndexError) as exc:
                    raise ArchError(f"layer {i} ({op}) is malformed: {exc}") from None
            out = bb.emit_output(v)
        bb.emit_func_output(out, names=[spec.get("output", "output")])
    unused = sorted(set(weights) - sb.used)
    if unused:
        raise ArchError(f"the architecture does not use weights {unused[:8]}: check the spec")
    return bb.get()
