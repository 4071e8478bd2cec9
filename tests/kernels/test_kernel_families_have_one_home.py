"""Kernel families have one home each (docs/architecture.md "Where kernels live"): the rule
table's rows and order, the contraction geometry importable without LLVM (a graph pass reads
it), and no module outside a family setting that family's emitter state."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from mlcpack.packager.codegen import rules

CODEGEN = Path(__file__).resolve().parents[2] / "packager" / "codegen"


def test_rule_table_rows_in_order() -> None:
    ops = [r.op for r in rules.KERNEL_RULES]
    assert ops == ["recurrence", "non-maximum suppression", "tree ensemble", "nonzero index",
                   "unique by sorting", "integer GEMM", "integer depthwise",
                   "integer elementwise",
                   "channel-lane convolution",
                   "depthwise convolution", "dot-product convolution", "bf16 pair matmul",
                   "bf16 pair convolution",
                   "contraction", "max pool", "softmax", "normalization", "transpose",
                   "resize", "pad"]
    symbolic = [r.op for r in rules.KERNEL_RULES if r.symbolic is not None]
    assert symbolic == ["recurrence", "non-maximum suppression", "tree ensemble", "nonzero index",
                        "unique by sorting", "integer GEMM",   # qconv2d quads, open sizes
                        "integer depthwise",   # qdwconv2d, open sizes
                        "integer elementwise", "channel-lane convolution",
                        "depthwise convolution",
                        "bf16 pair matmul", "contraction", "max pool", "softmax", "normalization",
                        "transpose",   # a KV cache's T
                        "resize"]   # resize_taps' tables, run-time extents
    assert all(r.static is not None for r in rules.KERNEL_RULES)


def test_layout_pass_and_geometry_import_no_llvm() -> None:
    code = ("import sys\n"
            "import mlcpack.packager.passes.layout\n"
            "from mlcpack.packager.codegen.contraction.geometry import conv_geometry\n"
            "assert 'llvmlite' not in sys.modules, sorted(m for m in sys.modules if 'llvm' in m)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_emitter_state_is_set_only_at_home() -> None:
    """``_tile_value`` / ``_opaque`` (the contraction epilogue's state) are set only in
    ``codegen/contraction/``; other kernels go through ``epilogue_vector``."""
    pattern = re.compile(r"\b\w+\._(tile_value|opaque|opaque_scalar)\s*=")
    offenders = [str(p.relative_to(CODEGEN)) for p in CODEGEN.rglob("*.py")
                 if p.parent.name != "contraction" and pattern.search(p.read_text())]
    assert offenders == []
