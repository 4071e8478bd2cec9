"""The graph-level IR: an IRModule of graph functions and primitive tensor functions.

A graph ``Function`` holds dataflow blocks of bindings ``var = value``; a value is a call of a
high-level operator (``Call``, e.g. ``nn.conv2d``), a destination-passing call of a primitive
function in the same module (``CallTIR``), a call of a named library function that the runtime
resolves at load (``CallLibrary``, e.g. ``env.linear``), or a ``Constant``. Primitive functions
(``PrimFunc``) are written with the tensor-expression DSL in ``te``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence, Union

import numpy as np

from . import te


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        te.use_dtype(self.dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"Tensor({self.shape!r}, \"{self.dtype}\")"


class Value:
    """Anything that can stand as an argument in the graph IR."""

    type: TensorType


@dataclass(eq=False)
class Var(Value):
    name: str
    type: TensorType

    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False)
class StoredInt:
    """How a float32 constant is stored in the bundle when its values are small integers times
    a scale (a dequantized weight): ``data == (float32(q) - zero_point) * scale`` bit for bit,
    ``q`` int8 or uint8 of the constant's shape, ``scale`` and ``zero_point`` float32 arrays of
    its rank that broadcast to it (a dim is 1 or the constant's). The runtime expands it at load
    (docs/format.md, a constant's ``stored`` record); kernels read float32 as before."""

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray


@dataclass(eq=False)
class Constant(Value):
    """A tensor bound into the module (a weight); ``name`` is what the printer and bundle show.
    ``stored``: a float32 constant the bundle stores as integers (``StoredInt``), or None."""

    name: str
    data: np.ndarray
    stored: StoredInt | None = None

    @property
    def type(self) -> TensorType:  # type: ignore[override]
        return TensorType(tuple(self.data.shape), str(self.data.dtype))

    __hash__ = object.__hash__


@dataclass(eq=False)
class Call:
    """A high-level operator, before legalization (``op`` names an entry of ``ops.OPS``)."""

    op: str
    args: list[Value]
    attrs: dict
    type: TensorType


@dataclass(eq=False)
class CallTIR:
    """Destination-passing call: the caller allocates an output of ``type``, ``func`` fills it."""

    func: str
    args: list[Value]
    type: TensorType


@dataclass(eq=False)
class CallLibrary:
    """Destination-passing call of a library function the runtime resolves by name."""

    func: str
    args: list[Value]
    attrs: dict
    type: TensorType


Expr = Union[Call, CallTIR, CallLibrary, Var, Constant]


@dataclass(frozen=True)
class Source:
    """A node of the source model a binding came from (ONNX node name and op type), so a
    kernel can be traced back to the model: passes carry it, fusion merges it, the bundle
    records it per kernel and the profiler shows it."""

    name: str
    op: str


@dataclass(eq=False)
class Binding:
    var: Var
    value: Expr
    source: tuple[Source, ...] = ()   # empty when the builder knew no source node


def merge_sources(*groups: Sequence[Source]) -> tuple[Source, ...]:
    """The union of ``groups`` in order, each source once (a fused binding's provenance)."""
    seen: dict[Source, None] = {}
    for group in groups:
        for s in group:
            seen.setdefault(s, None)
    return tuple(seen)


@dataclass(eq=False)
class DataflowBlock:
    bindings: list[Binding] = field(default_factory=list)


@dataclass(eq=False)
class Function:
    """A graph-level function: pure inside its dataflow blocks, returns ``outputs``."""

    name: str
    params: list[Var]
    blocks: list[DataflowBlock]
    outputs: list[Value]
    output_names: list[str] = field(default_factory=list)

    def bindings(self) -> Iterator[Binding]:
        for block in self.blocks:
            yield from block.bindings


@dataclass(eq=False)
class PrimFunc:
    """A primitive tensor function in destination-passing style: ``inputs`` -> ``outputs``."""

    name: str
    inputs: list[te.Tensor]
    outputs: list[te.Tensor]
    attrs: dict = field(default_factory=dict)

    @property
    def is_elementwise(self) -> bool:
        """True when every stage reads each tensor either at the stage's own indices or broadcast."""
        for stage in te.stages(self.outputs):
            if stage.body is None:
                continue
            if any(isinstance(n, te.Reduce) for n in te.walk(stage.body)):
                return False
            for r in te.reads(stage.body):
                if not is_broadcast_read(stage, r):
                    return False
        return True


def is_broadcast_read(stage: te.Tensor, r: te.Read) -> bool:
    """``r`` reads its tensor as ``t[i_k, ..., 0, i_m]``, aligned to ``stage``'s trailing axes
    (numpy broadcast)."""
    offset = len(stage.axes) - len(r.indices)
    if offset < 0:
        return False
    for d, idx in enumerate(r.indices):
        axis = stage.axes[offset + d]
        if idx is axis:
            continue
        if isinstance(idx, te.Const) and idx.value == 0 and r.tensor.shape[d] == 1:
            continue
        return False
    return True


@dataclass(eq=False)
class IRModule:
    """Named graph functions and primitive functions; ``main`` is the entry point."""

    functions: dict[str, Union[Function, PrimFunc]] = field(default_factory=dict)
    # Relations between symbolic dims that shape inference assumed (``sym.assume``): checked
    # at run time when the sizes are bound, as (op, a, b, where).
    relations: list = field(default_factory=list)
    # Upper bounds of main's inputs' sizes (``--max-shape``), by parameter name.
    max_shapes: dict = field(default_factory=dict)
    # Size variables bound at run time by a kernel (data-dependent output sizes: NonZero's
    # count, NMS's boxes kept): name -> its upper bound, a dim over main's input size
    # variables and earlier such variables, in the order they are bound (``ops.dynamic``).
    dynamic_sizes: dict = field(default_factory=dict)
    # Size variables bound from the *values* of small integer inputs (a Reshape's shape, an
    # Expand's target fed at run time): rows ``(param name, rule, vars, *rule args)`` as the
    # bundle's ``symbolic.values`` (runtime/values.py ``bind_values``, docs/format.md 10.8).
    value_vars: list = field(default_factory=list)

    @property
    def main(self) -> Function:
        fn = self.functions.get("main")
        if not isinstance(fn, Function):
            raise KeyError("module has no graph function 'main'")
        return fn

    def prim_funcs(self) -> dict[str, PrimFunc]:
        return {k: f for k, f in self.functions.items() if isinstance(f, PrimFunc)}

    def unique_name(self, base: str) -> str:
        name, n = base, 1
        while name in self.functions:
            name = f"{base}{n}"
            n += 1
        return name

    def add_prim_func(self, func: PrimFunc) -> str:
        """Add ``func`` under a fresh name derived from its own; return the name used."""
        func.name = self.unique_name(func.name)
        self.functions[func.name] = func
        return func.name

    def copy(self) -> IRModule:
        return IRModule(dict(self.functions), list(self.relations), dict(self.max_shapes),
                        dict(self.dynamic_sizes), list(self.value_vars))


def used_values(value: Expr) -> Sequence[Value]:
    """The arguments a binding's value reads."""
    if isinstance(value, (Call, CallTIR, CallLibrary)):
        return value.args
    if isinstance(value, Var):
        return [value]
    return []
