"""Integer Div/Mod never trap: x86's div/idiv raise SIGFPE on a zero divisor (and idiv on
MIN / -1), which used to kill the interpreter running the bundle. A zero divisor now gives 0 (as
numpy does), MIN / -1 wraps, and every other element is unchanged."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mlcpack.packager.export import export_module
from mlcpack.frontends.onnx import import_onnx
from mlcpack.runtime import load

CASES = [(TensorProto.INT32, np.int32), (TensorProto.INT64, np.int64), (TensorProto.UINT8, np.uint8),
         (TensorProto.UINT32, np.uint32)]


def _model(op: str, dt: int) -> onnx.ModelProto:
    vi = [helper.make_tensor_value_info(n, dt, [6]) for n in ("a", "b")]
    g = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"])], "g", vi,
                          [helper.make_tensor_value_info("y", dt, [6])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("dt,npdt", CASES, ids=[c[1].__name__ for c in CASES])
@pytest.mark.parametrize("op", ["Div", "Mod"])
def test_zero_and_minus_one_divisors_do_not_trap(tmp_path, op, dt, npdt):
    import onnxruntime as ort

    path = tmp_path / "m.onnx"
    onnx.save(_model(op, dt), path)
    mod, _ = import_onnx(str(path))
    export_module(mod, str(tmp_path / "m.mlc"))
    info = np.iinfo(npdt)
    signed = info.min < 0
    a = np.array([7, 100, info.min if signed else info.max, 5, 0, 9], dtype=npdt)
    b = np.array([0, 3, -1 if signed else 1, -1 if signed else 7, 0, 4], dtype=npdt)
    # The bundle runs in a child process: a trap there is a signal, not a dead test session.
    code = ("import sys, numpy as np\nfrom mlcpack.runtime import load\n"
            f"a = np.array({a.tolist()}, dtype='{npdt.__name__}')\n"
            f"b = np.array({b.tolist()}, dtype='{npdt.__name__}')\n"
            f"print(load(r'{tmp_path / 'm.mlc'}').run({{'a': a, 'b': b}})['y'].tolist())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = np.array(eval(proc.stdout), dtype=npdt)
    assert got[0] == 0 and got[4] == 0  # divisor zero gives 0
    # Elements with a nonzero divisor match ONNX Runtime; ORT is given a harmless divisor where
    # ours is 0 or where it would compute MIN / -1 (ORT itself dies of SIGFPE there).
    safe = np.array([1, 3, 1, 7, 1, 4], dtype=npdt)
    ort_b = np.where((b == 0) | (a == info.min), safe, b)
    expected = ort.InferenceSession(str(path)).run(None, {"a": a, "b": ort_b})[0]
    keep = [1, 5] + ([3] if not signed else [])
    np.testing.assert_array_equal(got[keep], expected[keep])
    if signed:
        assert got[3] == (-5 if op == "Div" else 0)
        assert got[2] == (info.min if op == "Div" else 0)
    with load(tmp_path / "m.mlc") as model:  # and in this process too
        model.run({"a": a, "b": b})
