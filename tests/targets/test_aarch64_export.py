"""Cross-compiling for AArch64 on any host: ``--target aarch64`` / ``aarch64+dotprod`` emit
AArch64 ELF with llvmlite alone, and the kernels import nothing but memcpy/memmove/memset (the
vector math is generated, never libm's)."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.packager.codegen.build import ALLOWED_EXTERNALS
from mlcpack.packager.codegen.objinfo import undefined_symbols
from mlcpack.packager.export import compile_module
from mlcpack.runtime import cpu, load
from mlcpack.runtime.bundle import BundleReader
from mlcpack.runtime.errors import CpuFeatureError

from helpers import build_op_module

# aarch64+bf16's fp32 code is aarch64+dotprod's (its own kernels are --precision bf16's:
# tests/kernels/test_bf16_aarch64.py)
AARCH64_LEVELS = [lv.name for lv in cpu.LEVELS
                  if lv.arch == "aarch64" and lv.name != "aarch64+bf16"]
_EM_AARCH64 = 183

rng = np.random.default_rng(6)
X = rng.standard_normal((4, 33)).astype(np.float32)
W = rng.standard_normal((33, 17)).astype(np.float32)
IMG = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
KER = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)

# Every op whose lowering could plausibly end in a libm call, plus the specialized kernels.
OP_CASES = {
    **{op: ([X], None, {}) for op in ("exp", "log", "sqrt", "tanh", "erf", "sigmoid", "gelu",
                                       "silu", "floor", "ceil", "round", "abs", "relu")},
    "nn.softmax": ([X], None, {}),
    "nn.log_softmax": ([X], None, {}),
    "mod": ([X, X + 3], None, {"fmod": True}),
    "power": ([np.abs(X), X], None, {}),
    "divide": ([X, X + 5], None, {}),
    "matmul": ([X, W], [False, True], {}),
    "nn.conv2d": ([IMG, KER], [False, True], {"padding": (1, 1, 1, 1)}),
    "nn.max_pool2d": ([IMG], None, {"kernel": (2, 2), "strides": (2, 2)}),
}


@pytest.mark.parametrize("op", sorted(OP_CASES))
def test_kernels_cross_compile_for_aarch64_without_libm(op: str) -> None:
    inputs, mask, attrs = OP_CASES[op]
    for level in AARCH64_LEVELS:
        mod = build_op_module(op, inputs, mask, **attrs)
        _, compiled, _ = compile_module(mod, target=level)
        obj = compiled.object_code
        assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[18:20], "little") == _EM_AARCH64
        assert undefined_symbols(obj) <= set(ALLOWED_EXTERNALS), (op, level)


def test_cli_exports_aarch64_and_this_host_refuses_to_map_it(tmp_path, run_cli, paths) -> None:
    out = tmp_path / "mlp-a64.mlc"
    result = run_cli("export", paths["mlp_pickle"], "-o", str(out), "--target", "aarch64+dotprod")
    assert result.returncode == 0, result.stderr
    with BundleReader(out) as reader:
        (variant,) = reader.header["code"]
    assert (variant["arch"], variant["level"]) == ("aarch64", "aarch64+dotprod")
    assert variant["triple"].startswith("aarch64-")
    if cpu.host_arch() != "aarch64":
        with pytest.raises(CpuFeatureError, match="aarch64"):
            load(out)
