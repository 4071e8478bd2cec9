"""A dot-product kernel for 1x1 convolutions on a 1x1 image (squeeze-and-excitation blocks,
classifier heads after global pooling): ``out[n, o] = sum_k w[o, k] * x[n, k]``.

The register-blocked kernel (``kernel.py``) puts output columns, here the single pixel, in vector
lanes: one useful lane in vl, a 512 -> 1280 head measured 161 us against ORT's 52. Here the
lanes run along the reduction instead, where both operands are contiguous: ``ROWS`` output
channels at a time, each with ``UNROLL`` vector accumulators over k, summed across lanes at the
end; the weights stream through once. The fused epilogue runs per output, as the scalar
epilogue does.
"""

from __future__ import annotations

from llvmlite import ir

from ...ir.graph import PrimFunc
from ..helpers import F32, I1, I32, alloca_once, const_i64, for_range
from ..lower import KernelInfo
from .kernel import ContractionEmitter
from .match import Contraction, is_row_matmul  # noqa: F401
from ..threads import DEFAULTS, SplitThresholds

ROWS = 4      # output channels per block
UNROLL = 2    # vectors of k per step and row: 8 independent accumulators


def is_dot_product(match: Contraction | None) -> bool:
    """``match`` is a convolution with one input and one output pixel per image and a 1x1,
    ungrouped window, or a row matmul (is_row_matmul): each output is one dot product of
    contiguous rows."""
    if is_row_matmul(match):
        return True
    if match is None or match.tag.kind != "conv2d":
        return False
    x, w = match.tag.operands
    out = match.out
    attrs = match.tag.attrs
    return (len(x.shape) == 4 and x.shape[2:] == (1, 1) and tuple(w.shape[2:]) == (1, 1)
            and tuple(out.shape[2:]) == (1, 1) and attrs["groups"] == 1
            and not any(attrs["padding"]))


class DotProductEmitter(ContractionEmitter):
    plans_conv = False

    def emit(self) -> KernelInfo:
        params = self.func.inputs + self.func.outputs
        body_fn, ptr_types = self._begin_body(params, False)
        n_ptrs = len(ptr_types)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        self._emit_dots(task, ntasks)
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), 0,
                          self._macs() >= self.options.parallel_min_macs or self._row_split())

    def _row_split(self) -> bool:
        """A row matmul (a Linear at batch 1) splits for its weights' bytes too; a 1x1
        convolution on a 1x1 image (squeeze-and-excitation blocks) only by its multiply-adds:
        inside a whole model, splitting those was not measured on a quiet host."""
        return self.match.tag.kind == "matmul" and self._weight_bytes_split(
            -(-self._outputs() // ROWS))

    def _batch(self) -> int:
        return 1 if self.match.tag.kind == "matmul" else self.match.tag.operands[0].shape[0]

    def _outputs(self) -> int:
        """Output channels: W's rows (N of a row matmul's W (N, K), O of a conv's)."""
        return self.match.tag.operands[1].shape[0]

    def _emit_dots(self, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        x_t, w_t = self.match.tag.operands
        out = self.match.out
        row = self.match.tag.kind == "matmul"
        # x (1, ..., 1, K), W (N, K), out (1, ..., 1, N); or a conv's x (B, C, 1, 1), W (O, C, ...)
        batch, k_len, o_len = self._batch(), x_t.shape[-1] if row else x_t.shape[1], self._outputs()
        oc_axis = out.axes[-1] if row else out.axes[1]
        x_ptr, w_ptr = self.buffers[x_t.uid], self.buffers[w_t.uid]
        blocks = -(-o_len // ROWS)
        sums = alloca_once(b, ir.ArrayType(F32, ROWS), name="dots")
        sums_f = b.bitcast(sums, F32.as_pointer())
        lo, hi = self._split(batch * blocks, task, ntasks)
        with for_range(b, lo, hi, "work") as work:
            n = b.sdiv(work, const_i64(blocks))
            o0 = b.mul(b.srem(work, const_i64(blocks)), const_i64(ROWS))
            x_row = b.gep(x_ptr, [b.mul(n, const_i64(k_len))], inbounds=True)
            # rows past the last channel recompute the last one; their results are not stored
            w_rows = [b.gep(w_ptr, [b.mul(self._clamp(b.add(o0, const_i64(r)), o_len - 1),
                                          const_i64(k_len))], inbounds=True)
                      for r in range(ROWS)]
            for r, total in enumerate(self._dot_rows(x_row, w_rows, k_len)):
                b.store(total, b.gep(sums_f, [const_i64(r)], inbounds=True))
            env = {id(a): const_i64(0) for a in out.axes}
            if not row:
                env[id(out.axes[0])] = n
            for r in range(ROWS):
                oc = b.add(o0, const_i64(r))
                with b.if_then(b.icmp_signed("<", oc, const_i64(o_len))):
                    env[id(oc_axis)] = oc
                    self._store_epilogue(env, sums_f, const_i64(r))

    def _clamp(self, v: ir.Value, top: int) -> ir.Value:
        b = self.builder
        return b.select(b.icmp_signed("<", v, const_i64(top)), v, const_i64(top))

    def _dot_rows(self, x_row, w_rows, k_len: int) -> list[ir.Value]:
        """The dot products of ``x_row`` with each of ``w_rows`` (k_len floats each)."""
        b = self.builder
        vl, step = self.vl, self.vl * UNROLL
        zero = ir.Constant(self.vty, [0.0] * vl)
        accs = [alloca_once(b, self.vty, name=f"dot{r}_{u}")
                for r in range(len(w_rows)) for u in range(UNROLL)]
        for a in accs:
            b.store(zero, a)
        if k_len // step:
            with for_range(b, const_i64(0), const_i64(k_len // step), "kc") as kc:
                k0 = b.mul(kc, const_i64(step))
                xs = [b.load(self._vec_ptr(x_row, b.add(k0, const_i64(u * vl))), align=4)
                      for u in range(UNROLL)]
                for r, w_row in enumerate(w_rows):
                    for u in range(UNROLL):
                        acc = accs[r * UNROLL + u]
                        wv = b.load(self._vec_ptr(w_row, b.add(k0, const_i64(u * vl))), align=4)
                        b.store(self._fma(wv, xs[u], b.load(acc)), acc)
        for t, k0 in enumerate(range(k_len - k_len % step, k_len, vl)):   # the tail, masked
            mask = ir.Constant(ir.VectorType(I1, vl), [k0 + i < k_len for i in range(vl)])
            xv = self._masked_load(self._vec_ptr(x_row, const_i64(k0)), mask)
            for r, w_row in enumerate(w_rows):
                acc = accs[r * UNROLL + t % UNROLL]
                wv = self._masked_load(self._vec_ptr(w_row, const_i64(k0)), mask)
                b.store(self._fma(wv, xv, b.load(acc)), acc)
        totals = []
        for r in range(len(w_rows)):
            v = b.load(accs[r * UNROLL])
            for u in range(1, UNROLL):
                v = b.fadd(v, b.load(accs[r * UNROLL + u]))
            totals.append(self._lane_sum(v))
        return totals

    def _lane_sum(self, v: ir.Value) -> ir.Value:
        """The sum of ``v``'s lanes, halving the vector each step."""
        b = self.builder
        width = self.vl
        while width > 1:
            half = width // 2
            lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half), list(range(half))))
            hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half),
                                                    list(range(half, width))))
            v = b.fadd(lo, hi)
            width = half
        return b.extract_element(v, ir.Constant(I32, 0))


def emit_dot_product(module: ir.Module, match: Contraction, func: PrimFunc, symbol: str,
                     vl: int, options: SplitThresholds = DEFAULTS) -> KernelInfo:
    return DotProductEmitter(module, func, symbol, match, vl, options=options).emit()
