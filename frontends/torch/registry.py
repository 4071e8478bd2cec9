"""The ATen converter table: one converter per ATen operator overload (``aten.convolution.default``,
``aten.add.Tensor``...), as the ONNX frontend has one per ONNX operator. Registering the same
overload twice raises.

A converter takes a ``NodeContext`` and returns the node's value: one IR value, a tuple of them
for an operator with several outputs (``None`` where an output is not computed; using it is an
error), or a Python number / list of numbers for the symbolic-size operators (``sym_size``).

This module imports no torch: the importer hands converters the node's arguments already
resolved (IR values in place of tensors, plain Python numbers, lists and strings elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ...packager.errors import ExportError
from ...packager.ir.builder import BlockBuilder
from ...packager.ir.graph import Constant, Source, Value
from ...packager.ir.sym import dim
from ...packager.ops import get_op

Result = Any   # Value | tuple[Value | None, ...] | int | float | list


@dataclass(frozen=True)
class ConverterDef:
    target: str                    # "aten.convolution.default"
    convert: Callable[[NodeContext], Result]


_TABLE: dict[str, ConverterDef] = {}


def converter(*targets: str) -> Callable:
    """Decorator: register ``fn(ctx)`` as the converter of each ATen overload in ``targets``."""

    def wrap(fn: Callable[[NodeContext], Result]) -> Callable:
        for target in targets:
            if target in _TABLE:
                raise ValueError(f"ATen converter {target} is registered twice")
            _TABLE[target] = ConverterDef(target, fn)
        return fn

    return wrap


def lookup(target: str) -> ConverterDef | None:
    return _TABLE.get(target)


def registered_ops() -> list[str]:
    """Every ATen overload registered so far, sorted (``converters.supported_ops`` registers
    every family first)."""
    return sorted(_TABLE)


def make_constant(bb: BlockBuilder, data: np.ndarray, name: str) -> Constant:
    """A constant that keeps a 0-d array 0-d (see the ONNX registry's twin)."""
    return Constant(bb.fresh_name(name), np.asarray(data, order="C"))


class NodeContext:
    """What a converter sees of one FX node: its arguments by schema name (``ctx.arg("stride")``,
    defaults filled in), the builder, and helpers for constants, folding and errors.

    ``users`` lists, per user node, ``(target, first argument is this node)``: enough for a
    converter to skip work nobody reads (max-pool indices) or to absorb a follower
    (a BatchNorm folded into the convolution before it, see ``absorb``)."""

    def __init__(self, bb: BlockBuilder, target: str, name: str, args: dict[str, Any],
                 where: str, source: Source, importer: Any, node: Any,
                 out_dtype: str | None = None) -> None:
        self.bb = bb
        self.target = target
        self.name = name
        self.args = args
        self.where = where            # "model.py:12" or "" when unknown
        self.source = source
        self.importer = importer      # the _Importer: absorb / users / source_of
        self.node = node              # the torch.fx.Node (opaque here)
        self.out_dtype = out_dtype    # the dtype torch computed for (the first) output

    # ---- arguments ----------------------------------------------------------------------------

    def arg(self, name: str) -> Any:
        return self.args[name]

    def tensor(self, name: str) -> Value:
        value = self.args[name]
        if not isinstance(value, Value):
            raise self.error(f"argument {name} is {type(value).__name__}, not a tensor")
        return value

    def maybe(self, name: str) -> Value | None:
        value = self.args.get(name)
        return value if isinstance(value, Value) else None

    def const(self, name: str) -> np.ndarray | None:
        value = self.args.get(name)
        return value.data if isinstance(value, Constant) else None

    def wants(self, index: int) -> bool:
        """Whether output ``index`` of a multi-output node is read."""
        return self.importer.output_read(self.node, index)

    def error(self, message: str) -> ExportError:
        where = f" at {self.where}" if self.where else ""
        return ExportError(f"{self.importer.source}: {self.target} ({self.name}{where}): "
                           f"{message}")

    # ---- emitting -----------------------------------------------------------------------------

    def constant(self, data: np.ndarray, name: str = "const") -> Constant:
        return make_constant(self.bb, data, name)

    def scalar(self, value: float, like: Value, name: str = "scalar") -> Constant:
        """A one-element constant of ``like``'s dtype that broadcasts against it."""
        return self.constant(np.full((1,) * len(like.type.shape), value,
                                     dtype=like.type.dtype), name)

    def emit(self, op: str, *args: Value, name: str | None = None, **attrs: Any) -> Value:
        """Emit a high-level operator; when every argument is a constant, compute it now with
        the operator's numpy reference (weights permuted, reshaped, cast at import)."""
        if args and all(isinstance(a, Constant) for a in args):
            opdef = get_op(op)
            try:
                out_type, relations = opdef.infer_type(*(a.type for a in args), **attrs)
            except (ValueError, TypeError) as exc:
                raise self.error(f"{op}: {exc}") from None
            self.bb.assume(relations)
            data = opdef.reference(*(a.data for a in args), **attrs)
            data = np.asarray(data, dtype=out_type.dtype).reshape(out_type.shape)
            base = args[0].name if op in ("transpose", "reshape", "cast") else op.split(".")[-1]
            return self.constant(data, base)
        return self.bb.emit_op(op, *args, name=name, **attrs)

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        shape = tuple(dim(d) for d in shape)
        if shape == x.type.shape:
            return x
        if isinstance(x, Constant):  # keep the weight's name in the IR
            return self.constant(x.data.reshape(shape), x.name)
        return self.emit("reshape", x, shape=shape)

    def absorb(self, node: Any, result: Result) -> None:
        """Give the later FX ``node`` (a user of this one) ``result`` as its value: it is not
        converted itself (a BatchNorm folded into its convolution's weights)."""
        self.importer.absorb(node, result)
