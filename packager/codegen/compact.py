"""The NonZero index kernel (``ops/dynamic.py`` ``nonzero_index``): one pass over a flat
tensor that writes the flat index of each nonzero element, in order, after a count; a running
count no tensor expression can state (as a sum over the elements before each one, it was
quadratic), emitted directly.

The output is a ``[1 + n]`` int64 table: element 0 the count, then the indices. Each element's
index is stored at the slot after the count so far and the count advances by whether it is
nonzero, with no branch: the store lands inside the table (the count never passes the index).
The input may be any dtype; zero is +0 and -0 for the floats (a NaN is nonzero, as numpy and
ONNX Runtime count it), the narrow floats compared on their bits.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from .helpers import I64, alloca_once, const_i64, for_range
from .lower import KernelEmitter, KernelInfo, LoweringError

# the bits of a narrow float's magnitude (a zero with either sign has none of them set); the
# "fnuz" formats have one zero, the bit pattern 0 (0x80 is their NaN)
MAGNITUDE_BITS = {"float16": 0x7FFF, "bfloat16": 0x7FFF, "float8_e4m3fn": 0x7F,
                  "float8_e5m2": 0x7F, "float8_e4m3fnuz": 0xFF, "float8_e5m2fnuz": 0xFF}


def match_nonzero_index(func: PrimFunc):
    """The ``nonzero_index`` tag of ``func``'s output, or None."""
    if len(func.outputs) != 1 or func.outputs[0].body is None:
        return None
    body = func.outputs[0].body
    tag = reduction_tag(body) if hasattr(body, "axes") else None
    if tag is None or tag.kind != "nonzero_index":
        return None
    if [t.uid for t in tag.operands] != [t.uid for t in func.inputs]:
        raise LoweringError(f"{func.name}: something was fused into the NonZero kernel")
    return tag


class CompactEmitter(KernelEmitter):
    def emit(self) -> KernelInfo:
        func = self.func
        x = func.inputs[0]
        body_fn, ptr_types = self._begin_body(func.inputs + func.outputs, False)
        b = self.builder
        px, out = body_fn.args[:2]
        n = self._dim_value(x.shape[0])
        count = alloca_once(b, I64, "count")
        b.store(const_i64(0), count)
        with for_range(b, const_i64(0), n, "i") as i:
            v = b.load(b.gep(px, [i]))
            if x.dtype in ("float32", "float64"):
                nonzero = b.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))
            else:
                mask = MAGNITUDE_BITS.get(x.dtype)
                if mask is not None:
                    v = b.and_(v, ir.Constant(v.type, mask))
                nonzero = b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
            m = b.load(count)
            b.store(i, b.gep(out, [b.add(m, const_i64(1))]))
            b.store(b.add(m, b.zext(nonzero, I64)), count)
        b.store(b.load(count), out)
        b.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        return KernelInfo(self.symbol, 1, 1, 0, False, symbolic=self.symbolic)


def emit_nonzero_index(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                       size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The NonZero index kernel of ``func``, or None when ``func`` is not one."""
    if match_nonzero_index(func) is None:
        return None
    return CompactEmitter(module, func, symbol, size_vars).emit()
