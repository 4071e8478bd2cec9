"""The register-blocked contraction kernel: ``ContractionEmitter`` composes the shared pieces
(``emitter.py``), the vectorized epilogue (``epilogue.py``), the matmul (``matmul.py``) and the
conv2d (``conv.py``), and ``emit`` picks the path by the contraction's tag."""

from __future__ import annotations

from llvmlite import ir

from ...ir.graph import PrimFunc
from ...ir.sym import product
from ..lower import KernelInfo
from .conv import ConvMixin
from .conv_packed import PackedConvMixin
from .emitter import ContractionBase
from .epilogue import EpilogueMixin
from .match import CONV_KINDS, Contraction, match_contraction
from .matmul import MatmulMixin
from ..threads import DEFAULTS, SplitThresholds


class ContractionEmitter(PackedConvMixin, ConvMixin, MatmulMixin, EpilogueMixin, ContractionBase):
    """Emits a matched contraction; the generic emitter evaluates the epilogue."""

    def emit(self) -> KernelInfo:
        m = self.match
        params = self.func.inputs + self.func.outputs
        workspace = self._workspace_bytes()
        body_fn, ptr_types = self._begin_body(params, bool(workspace))
        n_ptrs = len(ptr_types)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        ws = body_fn.args[len(params)] if workspace else None
        if m.tag.kind in CONV_KINDS:
            self._emit_conv(ws, task, ntasks)
        else:
            self._emit_matmul(task, ntasks, ws)
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        if self.symbolic:   # split when the static part alone is worth it (K x N x static dims)
            static = product(d for d in self.match.out.shape if isinstance(d, int))
            static *= product(a.extent for a in self.match.reduce.axes
                              if isinstance(a.extent, int))
            return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), 0,
                              static * 16 >= self.options.parallel_min_macs, symbolic=True)
        return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), workspace,
                          self._parallel(), choice=self._choice())

    def _parallel(self) -> bool:
        """Whether the static kernel splits over threads: by its multiply-adds, or (a matmul
        of few rows, ``_splits_by_weights``) by the bytes of weights it streams."""
        return self._macs() >= self.options.parallel_min_macs or (
            self.match.tag.kind not in CONV_KINDS and self._splits_by_weights())

    def _choice(self) -> str:
        """The design, in words (``KernelInfo.choice``, shown by ``mlcpack inspect``)."""
        if self.match.tag.kind not in CONV_KINDS:
            return f"register-blocked {self.match.tag.kind}"
        g = self._conv_geometry()
        if g.get("packed"):
            planes = (f"input packed in panels, block rows in chunks of {g['mc_blocks']} "
                      "(weights in L2)")
        else:
            planes = ("input read in place" if g["direct"] else
                      "shifted planes" if g["shifted"] else "planes by stride phase")
        tail = f", {len(g['tail'])} tail pixel(s) as dot products" if g["tail"] else ""
        ahead = ""
        if g.get("prefetch_panels"):
            ahead = (", next panel's outputs and input prefetched" if g.get("prefetch_input")
                     else ", next panel's outputs prefetched")
        return (f"register-blocked conv: {g['mr']} channels x {g['nv'] * g['vl']} pixels "
                f"register tile, {planes}{tail}{ahead}")


def emit_symbolic_matmul(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                         size_vars: tuple[str, ...],
                         options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    """Emit a symbolic ``func`` with the register-blocked matmul if it is a matmul; M, N, K
    and the batch dims may be run-time sizes. Other contractions with symbolic shapes (conv,
    depthwise) are not matched here."""
    match = match_contraction(func)
    if match is None or match.tag.kind not in ("matmul", "matmul_packed") \
            or match.tag.attrs.get("transpose_b"):
        return None
    return ContractionEmitter(module, func, symbol, match, vl, size_vars, options).emit()


def emit_contraction(module: ir.Module, match: Contraction, func: PrimFunc, symbol: str, vl: int,
                     options: SplitThresholds = DEFAULTS) -> KernelInfo:
    """Emit the contraction ``match`` of ``func`` with the register-blocked kernel."""
    return ContractionEmitter(module, func, symbol, match, vl, options=options).emit()
