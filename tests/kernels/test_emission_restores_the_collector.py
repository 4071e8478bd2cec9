"""``build.emit_module`` turns Python's cycle collector off while it builds a module (llvmlite's
values form cycles, and the collector kept walking them: a fifth of YOLOv8n's emission time)
and leaves it as it found it, on or off, also when emission fails."""

from __future__ import annotations

import gc

import pytest

from mlcpack.packager.codegen.build import emit_module
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.ir import te
from mlcpack.packager.ir.graph import PrimFunc


def _double() -> PrimFunc:
    a = te.placeholder((8,), "float32", "a")
    return PrimFunc("double", [a], [te.compute((8,), lambda i: a[i] * 2.0, "out")],
                    {"op_kind": "elemwise"})


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_state_is_restored(enabled) -> None:
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        text = emit_module([_double()], resolve_target("x86-64-v2"), thread_pool=False).text
        assert '@"mlc_double"' in text or "@mlc_double" in text
        assert gc.isenabled() == enabled
        with pytest.raises(AttributeError):   # no options: the emitters read their fields
            emit_module([_double()], resolve_target("x86-64-v2"), thread_pool=False,
                        options=None)
        assert gc.isenabled() == enabled
    finally:
        gc.enable() if was else gc.disable()
