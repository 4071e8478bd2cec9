"""AArch64 bundles executed for real: qemu-user-static runs an arm64 python3.11 (Debian .debs)
with numpy and msgpack (aarch64 wheels) and a copy of ``runtime/``; the results must match the
same model built for and run on this x86-64 host.

The first run builds the arm64 root (tests/arm64_root.py; about a minute, needs the Debian
mirror and PyPI) and caches it in ~/.cache/mlcpack-test; later runs reuse it. An unreachable
registry fails this test with a message saying so: it is not skipped.
"""

from __future__ import annotations

import numpy as np
import pytest
from arm64_root import arm64_root_or_fail, run_bundles
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import elf, load

from conftest import ARTIFACTS, ROOT
from helpers import build_op_module, force_parallel_kernels

pytestmark = pytest.mark.skipif(elf._real_arch() != "x86_64",
                                reason="compares an emulated aarch64 run with an x86-64 one")


@pytest.fixture(scope="module")
def arm64_root():
    return arm64_root_or_fail()


def _onnx_module(name: str):
    from mlcpack.frontends.onnx import import_onnx

    mod, _ = import_onnx(str(ARTIFACTS / name))
    return mod


@pytest.fixture(scope="module")
def models(mlp_weights):
    """name -> (IR module, feeds): the demo MLP and CNN, and a pad kernel that calls memset."""
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec

    rng = np.random.default_rng(64)
    padded = rng.random((64, 300), dtype=np.float32)
    mlp = build_from_spec(infer_mlp_spec(mlp_weights), mlp_weights, None)
    return {
        "mlp": (mlp, {"x": rng.random((1, 784), dtype=np.float32)}),
        "cnn": (_onnx_module("cnn.onnx"), {"x": rng.random((1, 1, 28, 28), dtype=np.float32)}),
        # pad calls memset: a CALL26 through a jump stub and a GOT entry
        "pad": (build_op_module("pad", [padded], pads=(0, 3, 0, 5)), {"x0": padded}),
    }


def _x86_outputs(path, feeds):
    with load(path) as model:
        return model.run(feeds)


@pytest.mark.parametrize("level", ["aarch64", "aarch64+dotprod"])
def test_aarch64_bundles_match_x86_64_under_qemu(level, models, arm64_root, tmp_path,
                                                 monkeypatch) -> None:
    """Each model on one thread, and the MLP again with every kernel split over 2 threads (the
    spinning hand-off's atomics and the AArch64 spin hint, for real)."""
    bundles, expected = {}, {}
    force_parallel_kernels(monkeypatch)
    models = {**models, "mlp-threads": models["mlp"]}
    for name, (mod, feeds) in models.items():
        a64 = tmp_path / f"{name}-a64.mlc"
        x86 = tmp_path / f"{name}-x86.mlc"
        export_module(mod, a64, ExportOptions(target=level))
        export_module(mod, x86, ExportOptions())
        bundles[name] = (a64, feeds)
        expected[name] = _x86_outputs(x86, feeds)
    report, got = run_bundles(arm64_root, tmp_path, ROOT, bundles, threads={"mlp-threads": 2})
    assert report["machine"] == "aarch64"
    for name in models:
        assert report["chosen"][str(bundles[name][0])] == level
        assert report["pool"][str(bundles[name][0])] == ("_SpinPool" if name == "mlp-threads"
                                                         else "NoneType")
        assert report["native_steps"][str(bundles[name][0])]   # the AArch64 step loop ran
        for out, want in expected[name].items():
            np.testing.assert_allclose(got[name][out], want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} {out} on {level}")
