"""Per-run overhead of the Python runtime on tiny bundles: this tree's runtime beside another's.

    python bench/run_overhead.py BEFORE_RUNTIME_DIR [runs]

``BEFORE_RUNTIME_DIR`` is another copy of the ``runtime/`` folder (e.g.
``git archive main runtime | tar -x -C /tmp/before``, then ``/tmp/before/runtime``): it is
imported as a package of its own, so both runtimes load the same bundles in one process. Four
tiny bundles are exported once (the demo MLP with fixed shapes, the same with batch plans 1
and 8, a small pool/upsample model with H and W open, and that model bounded with
``--max-shape``); each is timed through ``model.run``
and through a ``model.session()``'s ``run``, before and after alternating, 1 thread: median
and min in microseconds, and the ratio of medians (after / before).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mlcpack.runtime.model import load as load_after

ROOT = Path(__file__).resolve().parent.parent


def _import_runtime(folder: Path, name: str):
    """The runtime package in ``folder`` imported as ``name`` (its imports are relative)."""
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _dense() -> onnx.ModelProto:
    """x [1, 3, H, W] -> 2x2 max pool -> nearest upsampling x2 -> + x -> sigmoid: H and W open
    (tests/runtime/test_sessions_every_kind.py's model)."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Resize", ["p", "", "s"], ["u"], mode="nearest"),
             helper.make_node("Add", ["x", "u"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [scales])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _export(folder: Path) -> dict[str, tuple[Path, dict]]:
    """Each kind's bundle and the feeds it is timed on (the command line exports them)."""
    onnx.save(_dense(), folder / "dense.onnx")
    mlp = ROOT / "artifacts" / "mlp_params.pkl"
    rng = np.random.default_rng(1)
    row = rng.standard_normal((1, 784)).astype(np.float32)
    image = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    cases = {"static": ([mlp], row), "batch": ([mlp, "--batch-sizes", "1,8"], row),
             "symbolic": ([folder / "dense.onnx"], image),
             "bounded": ([folder / "dense.onnx", "--max-shape", "x=1,3,64,64"], image)}
    out = {}
    for kind, (args, x) in cases.items():
        path = folder / f"{kind}.mlc"
        subprocess.run([str(Path(sys.executable).parent / "mlcpack"), "export", *map(str, args),
                        "-o", str(path), "--target", "host", "--no-check"], check=True,
                       capture_output=True)
        out[kind] = (path, {"x": x})
    return out


def _time(a, b, feeds: dict, runs: int) -> tuple[float, float, float, float]:
    ta, tb = [], []
    for _ in range(50):
        a(feeds)
        b(feeds)
    clock = time.perf_counter
    for _ in range(runs):
        t0 = clock()
        a(feeds)
        t1 = clock()
        b(feeds)
        t2 = clock()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return (float(np.median(ta)) * 1e6, min(ta) * 1e6, float(np.median(tb)) * 1e6,
            min(tb) * 1e6)


def main() -> None:
    before_dir = Path(sys.argv[1]).resolve()
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    before = _import_runtime(before_dir, "mlcpack_runtime_before")
    print(f"{'bundle':12} {'path':8} {'before med':>10} {'min':>7} {'after med':>10} "
          f"{'min':>7} {'after/before':>12}  (us, 1 thread)")
    with tempfile.TemporaryDirectory() as tmp:
        bundles = _export(Path(tmp))
        for kind, (path, feeds) in bundles.items():
            with before.load(path, threads=1) as mb, load_after(path, threads=1) as ma:
                r = _time(mb.run, ma.run, feeds, runs)
                print(f"{kind:12} {'model':8} {r[0]:10.2f} {r[1]:7.2f} {r[2]:10.2f} "
                      f"{r[3]:7.2f} {r[2] / r[0]:12.3f}")
                with mb.session(threads=1) as sb, ma.session(threads=1) as sa:
                    r = _time(sb.run, sa.run, feeds, runs)
                    print(f"{kind:12} {'session':8} {r[0]:10.2f} {r[1]:7.2f} {r[2]:10.2f} "
                          f"{r[3]:7.2f} {r[2] / r[0]:12.3f}")
                for name, value in mb.run(feeds).items():   # the same answers
                    np.testing.assert_array_equal(value, ma.run(feeds)[name])


if __name__ == "__main__":
    main()
