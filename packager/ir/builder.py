"""A scoped builder for graph functions, in the manner of TVM's BlockBuilder::

    bb = BlockBuilder()
    x = bb.input("x", (1, 784))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit_op("matmul", x, bb.constant(w0, "w0"), transpose_b=True)
            h = bb.emit_op("relu", h)
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    mod = bb.get()

Leaving a scope in the wrong state raises at once (``BuilderError``), not passes later.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import numpy as np

from . import te
from .te import _dim
from .graph import (Binding, Call, CallLibrary, CallTIR, Constant, DataflowBlock, Expr, Function,
                    IRModule, PrimFunc, Source, TensorType, Value, Var)
from .sym import Dim, Relation, assume, nondecreasing_in, shape_vars, size_var


class BuilderError(Exception):
    """The builder was used out of order (emit outside a dataflow block, no output...)."""


class BlockBuilder:
    def __init__(self, mod: IRModule | None = None) -> None:
        self.mod = mod or IRModule()
        self._func: Function | None = None
        self.params: list[Var] = []   # every input() made, for error messages
        self._block: DataflowBlock | None = None
        self._names: dict[str, int] = {}
        self._source: tuple[Source, ...] = ()

    # ---- scopes -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def function(self, name: str, params: Sequence[Var]) -> Iterator[Function]:
        if self._func is not None:
            raise BuilderError(f"function {name!r} opened inside function {self._func.name!r}")
        if name in self.mod.functions:
            raise BuilderError(f"module already has a function {name!r}")
        fn = Function(name, list(params), [], [])
        self._func = fn
        try:
            yield fn
            if not fn.outputs:
                raise BuilderError(f"function {name!r} closed without emit_func_output()")
            if self._block is not None:
                raise BuilderError(f"function {name!r} closed inside an open dataflow block")
        finally:
            self._func = None
        self.mod.functions[name] = fn

    @contextlib.contextmanager
    def dataflow(self) -> Iterator[DataflowBlock]:
        if self._func is None:
            raise BuilderError("dataflow() must be inside function()")
        if self._block is not None:
            raise BuilderError("dataflow blocks do not nest")
        block = DataflowBlock()
        self._block = block
        try:
            yield block
        finally:
            self._block = None
        self._func.blocks.append(block)

    @contextlib.contextmanager
    def source(self, *nodes: Source) -> Iterator[None]:
        """Every binding emitted inside comes from ``nodes`` of the source model (a frontend
        wraps each node's conversion in this); nested scopes replace the outer one."""
        outer, self._source = self._source, tuple(nodes)
        try:
            yield
        finally:
            self._source = outer

    # ---- values -------------------------------------------------------------------------------

    def fresh_name(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "v"
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 else f"{base}{n}"

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> Var:
        """A new parameter variable (pass it to ``function``)."""
        var = Var(self.fresh_name(name), TensorType(tuple(_dim(s) for s in shape), dtype))
        self.params.append(var)
        return var

    def constant(self, data: np.ndarray, name: str = "const") -> Constant:
        return Constant(self.fresh_name(name), np.asarray(data, order="C"))

    def _require_block(self) -> DataflowBlock:
        if self._block is None:
            raise BuilderError("emit() must be inside a dataflow() block")
        return self._block

    def emit(self, value: Expr, name: str = "lv") -> Var:
        """Bind ``value`` to a new variable in the current dataflow block."""
        block = self._require_block()
        var = Var(self.fresh_name(name), value.type)
        block.bindings.append(Binding(var, value, self._source))
        return var

    def emit_op(self, op: str, *args: Value, name: str | None = None, **attrs: object) -> Var:
        """Emit a high-level operator call; its output type is inferred now."""
        from ..ops import get_op  # the op table imports the IR, so import it late

        opdef = get_op(op)
        try:
            out_type, relations = opdef.infer_type(*(a.type for a in args), **attrs)
        except (ValueError, TypeError) as exc:
            raise BuilderError(f"{op}: {exc}") from None
        self.assume(relations)
        return self.emit(Call(op, list(args), dict(attrs), out_type), name or op.split(".")[-1])

    def assume(self, relations: Sequence[Relation]) -> None:
        """Keep ``relations`` between symbolic dims (what an inference returned, or a
        frontend's own) in the module: the bundle records them, the runtime checks them."""
        for rel in relations:
            assume(self.mod.relations, *rel)

    def bind_size(self, count: Value, bound: Dim, label: str) -> tuple[Var, Dim]:
        """A size variable bound at run time from ``count`` (an int64 tensor of shape (1,)
        that a kernel wrote), at most ``bound`` (a dim over the inputs' size variables and
        earlier bound ones): the VM checks the count against the bound and stores it in the
        sizes array. Returns the binding (the count; kernels that write tensors of the new
        size take it as an input, which orders them after the binding) and the variable."""
        taken = set(self.mod.dynamic_sizes)
        for p in self.params:
            taken |= shape_vars(p.type.shape)
        k = 1
        while f"{label}{k}" in taken:
            k += 1
        name = f"{label}{k}"
        if not nondecreasing_in(bound, self.mod.dynamic_sizes) or \
                (not isinstance(bound, int) and bound.lower_bound() is None):
            raise BuilderError(f"bind_size: the bound {bound} of {name} must not decrease as "
                               "the sizes grow")
        self.mod.dynamic_sizes[name] = bound
        var = self.emit(Call("bind_size", [count], {"var": name}, count.type), name)
        return var, size_var(name)

    def call_tir(self, func: PrimFunc, args: Sequence[Value], name: str = "lv") -> Var:
        """Add ``func`` to the module and emit a destination-passing call of it."""
        if len(func.outputs) != 1:
            raise BuilderError("call_tir supports primitive functions with one output")
        if len(args) != len(func.inputs):
            raise BuilderError(f"{func.name} takes {len(func.inputs)} inputs, got {len(args)}")
        for a, p in zip(args, func.inputs):
            if a.type != TensorType(p.shape, p.dtype):
                raise BuilderError(f"{func.name}: argument {p.name} expects {p.shape} {p.dtype}, "
                                   f"got {a.type}")
        fname = self.mod.add_prim_func(func)
        out = func.outputs[0]
        return self.emit(CallTIR(fname, list(args), TensorType(out.shape, out.dtype)), name)

    def call_library(self, func: str, args: Sequence[Value], out_type: TensorType,
                     name: str = "lv", **attrs: object) -> Var:
        """Emit a call of the library function ``func`` (e.g. ``"env.linear"``)."""
        return self.emit(CallLibrary(func, list(args), dict(attrs), out_type), name)

    def emit_output(self, value: Value) -> Value:
        """Mark ``value`` as leaving the dataflow block (kept for symmetry with Relax)."""
        self._require_block()
        return value

    def emit_func_output(self, outputs: Value | Sequence[Value],
                         names: Sequence[str] | None = None) -> None:
        if self._func is None:
            raise BuilderError("emit_func_output() must be inside function()")
        if self._block is not None:
            raise BuilderError("emit_func_output() must follow the dataflow block, not be in it")
        outs = [outputs] if isinstance(outputs, Value) else list(outputs)
        if not outs:
            raise BuilderError("a function needs at least one output")
        self._func.outputs = outs
        self._func.output_names = list(names) if names else [
            o.name if isinstance(o, Var) else f"output{i}" for i, o in enumerate(outs)]

    def get(self) -> IRModule:
        if self._func is not None:
            raise BuilderError(f"function {self._func.name!r} is still open")
        return self.mod


def prim_func(name: str, inputs: Sequence[te.Tensor], output: te.Tensor, **attrs: object
              ) -> PrimFunc:
    """A primitive function from tensor expressions (``te.placeholder`` inputs, one output)."""
    return PrimFunc(name, list(inputs), [output], dict(attrs))
