"""The ONNX converter table: one converter per (domain, op_type, since_version).

A converter registered ``since=v`` serves every opset from ``v`` up to the next registered
version of the same operator; the last one serves every later opset (as in TVM's relax ONNX
frontend, where the highest ``_impl_vN`` with N <= the model's opset wins). Registering the same
(domain, op_type, since) twice raises, as in onnx2torch.

A converter takes a ``NodeContext`` and returns the node's output value, or a list of them (one
per ONNX output it provides; outputs it leaves out must be unused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from ...packager.errors import ExportError
from ...packager.ir.builder import BlockBuilder
from ...packager.ir.graph import Constant, Value
from ...packager.ir.sym import dim, is_static
from ...packager.ops import get_op
from ...packager.passes.stored_int import derive

if TYPE_CHECKING:   # annotations only: the frontend reads models without `import onnx` (proto.py)
    import onnx

# Attributes old opsets declare that change nothing at inference (in-place hints).
IGNORED_ATTRIBUTES = frozenset({"consumed_inputs"})


class NeedsConstantError(ExportError):
    """A node input must be known at export (a shape, axes, pads...) but is computed at run time
    or fed as a graph input; ``value_name`` is its ONNX name, so a caller that knows the value
    (a test harness, ``--input-shape``-like flags) can bind it as a constant and try again."""

    def __init__(self, message: str, value_name: str) -> None:
        super().__init__(message)
        self.value_name = value_name


@dataclass(frozen=True)
class ConverterDef:
    domain: str
    op_type: str
    since: int
    convert: Callable[[NodeContext], Value | Sequence[Value]]
    attrs: Mapping[str, Any]      # the attributes it handles, with their defaults


_TABLE: dict[tuple[str, str], dict[int, ConverterDef]] = {}


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def op_label(domain: str, op_type: str) -> str:
    """How errors name an operator: ``Conv``, or ``com.microsoft.FusedConv`` off the ONNX domain."""
    domain = normalize_domain(domain)
    return f"{domain}.{op_type}" if domain else op_type


def converter(op_type: str, since: int, attrs: Mapping[str, Any] | None = None,
              domain: str = "") -> Callable:
    """Decorator: register ``fn(ctx)`` as the converter of ``op_type`` from opset ``since`` on.
    ``attrs`` lists every attribute it handles, with defaults; a node setting any other one is
    refused rather than silently misread."""

    def wrap(fn: Callable[[NodeContext], Value | Sequence[Value]]) -> Callable:
        key = (normalize_domain(domain), op_type)
        versions = _TABLE.setdefault(key, {})
        if since in versions:
            raise ValueError(f"ONNX converter {op_label(*key)} (since opset {since}) is "
                             "registered twice")
        versions[since] = ConverterDef(key[0], op_type, since, fn, dict(attrs or {}))
        return fn

    return wrap


def lookup(domain: str, op_type: str, opset: int | None) -> ConverterDef | None:
    """The converter for ``op_type`` at ``opset`` of its domain, or None if there is none."""
    versions = _TABLE.get((normalize_domain(domain), op_type))
    if not versions or opset is None:
        return None
    usable = [v for v in versions if v <= opset]
    return versions[max(usable)] if usable else None


@dataclass(frozen=True)
class SupportedOp:
    domain: str
    op_type: str
    since: tuple[int, ...]    # the opsets where a new converter version starts

    def __str__(self) -> str:
        return f"{op_label(self.domain, self.op_type)} (opset {self.since[0]}+)"


def registered_ops() -> list[SupportedOp]:
    """Every operator registered so far, sorted by domain and name (``converters.supported_ops``
    registers every family first)."""
    return [SupportedOp(d, op, tuple(sorted(_TABLE[(d, op)]))) for d, op in sorted(_TABLE)]


class SubgraphScope(Protocol):
    """What converts a node's subgraphs (If branches, Loop/Scan bodies, function bodies): the
    importer's graph converter, handed to each ``NodeContext``."""

    def inline(self, ctx: NodeContext, graph: onnx.GraphProto, bound: Sequence[Value],
               isolated: dict[str, Value] | None = None,
               opsets: Mapping[str, int] | None = None) -> list[Value]: ...


def make_constant(bb: BlockBuilder, data: np.ndarray, name: str) -> Constant:
    """A constant that keeps a 0-d array 0-d (``bb.constant``'s ``np.ascontiguousarray`` makes
    scalars shape (1,), which breaks ONNX shape arithmetic such as Gather -> Unsqueeze)."""
    return Constant(bb.fresh_name(name), np.asarray(data, order="C"))


class NodeContext:
    """What a converter sees of one node: its inputs as IR values, its attributes (with the
    converter's defaults filled in), the builder, and helpers for constants and errors."""

    def __init__(self, bb: BlockBuilder, node: onnx.NodeProto, opset: int,
                 inputs: list[Value | None], attrs: dict[str, Any], source: str,
                 scope: SubgraphScope | None = None) -> None:
        self.bb = bb
        self.node = node
        self.opset = opset
        self.inputs = inputs
        self.attrs = attrs
        self.source = source
        self.scope = scope

    def inline(self, graph: onnx.GraphProto, bound: Sequence[Value],
               isolated: dict[str, Value] | None = None,
               opsets: Mapping[str, int] | None = None) -> list[Value]:
        """Convert subgraph ``graph`` in place: its inputs bound to ``bound`` (in order), the
        enclosing graphs' names visible (only ``isolated``'s instead, for a function body), its
        nodes emitted into the current function. Returns its outputs."""
        if self.scope is None:
            raise self.error("subgraphs can only be converted by the ONNX importer")
        return self.scope.inline(self, graph, bound, isolated, opsets)

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def input(self, i: int) -> Value:
        if not self.has_input(i):
            raise self.error(f"input {i} is required")
        value = self.inputs[i]
        assert value is not None
        return value

    def const(self, i: int) -> np.ndarray | None:
        """The value of input ``i`` when it is known at import (initializer or folded), else None."""
        value = self.inputs[i] if i < len(self.inputs) else None
        return value.data if isinstance(value, Constant) else None

    def require_const(self, i: int, what: str) -> np.ndarray:
        data = self.const(i)
        if data is None:
            message = str(self.error(f"{what} (input {i}) must be a constant known at export, "
                                     "not computed at run time"))
            raise NeedsConstantError(message, self.node.input[i])
        return data

    def dims(self, i: int, what: str) -> list:
        """Input ``i`` as a list of dims, known at import: a constant's ints, or a shape
        computation on symbolic dims (``symvalue.SymValue``) as ints and size expressions."""
        from .symvalue import dims_of
        value = self.inputs[i] if i < len(self.inputs) else None
        out = dims_of(value) if value is not None else None
        if out is None:
            data = self.require_const(i, what)
            return data.reshape(-1).tolist()
        return out

    def error(self, message: str) -> ExportError:
        """An ExportError naming this node; ``raise ctx.error(...)``."""
        node = self.node
        who = node.name or (node.output[0] if node.output else "?")
        return ExportError(f"{self.source}: {op_label(node.domain, node.op_type)} node {who!r} "
                           f"(opset {self.opset}): {message}")

    def constant(self, data: np.ndarray, name: str = "const") -> Constant:
        return make_constant(self.bb, data, name)

    def scalar(self, value: float, like: Value, name: str = "scalar") -> Constant:
        """A one-element constant of ``like``'s dtype that broadcasts against it."""
        return self.constant(np.full((1,) * len(like.type.shape), value,
                                     dtype=like.type.dtype), name)

    def emit(self, op: str, *args: Value, name: str | None = None, **attrs: Any) -> Value:
        """Emit a high-level operator; when every argument is a constant, compute it now with the
        operator's numpy reference instead (constant folding at import)."""
        if args and all(isinstance(a, Constant) for a in args):
            opdef = get_op(op)
            try:
                out_type, relations = opdef.infer_type(*(a.type for a in args), **attrs)
            except (ValueError, TypeError) as exc:
                raise self.error(f"{op}: {exc}") from None
            self.bb.assume(relations)
            if not is_static(out_type.shape):   # sizes known at run time: a kernel computes it
                return self.bb.emit_op(op, *args, name=name, **attrs)
            data = opdef.reference(*(a.data for a in args), **attrs)
            data = np.asarray(data, dtype=out_type.dtype).reshape(out_type.shape)
            stored = [k for k, a in enumerate(args) if a.stored is not None]
            if len(stored) == 1:   # a weight kept as its integers (DynamicQuantizeLSTM's W)
                k = stored[0]

                def again(x: np.ndarray) -> np.ndarray:
                    return np.asarray(opdef.reference(
                        *(x if i == k else a.data for i, a in enumerate(args)), **attrs),
                        dtype=out_type.dtype).reshape(out_type.shape)
                return derive(self.bb.fresh_name(name or op.split(".")[-1]), args[k], again,
                              data)
            return self.constant(data, name or op.split(".")[-1])
        return self.bb.emit_op(op, *args, name=name, **attrs)

    def assume(self, op: str, a: Any, b: Any, where: str = "") -> None:
        """Keep the relation ``a == b`` (op "eq") or ``a <= b`` ("le") between symbolic dims
        that a conversion holds under (the runtime checks it when it binds the sizes)."""
        self.bb.assume([(op, a, b, where)])

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        shape = tuple(dim(d) for d in shape)
        if shape == x.type.shape:
            return x
        if isinstance(x, Constant):  # keep the weight's name in the IR
            if x.stored is not None:
                return derive(self.bb.fresh_name(x.name), x, lambda d: d.reshape(shape))
            return self.constant(x.data.reshape(shape), x.name)
        return self.emit("reshape", x, shape=shape)
