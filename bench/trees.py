"""Tree ensembles (ai.onnx.ml TreeEnsembleRegressor): mlcpack's compiled walk against ONNX
Runtime, one thread each, on the same random forest and inputs.

Run: .venv/bin/python bench/trees.py [--trees 100] [--depth 8] [--features 20] [--rounds 15]
A forest of full trees (BRANCH_LEQ, random features and thresholds, one weight per leaf) is
built with onnx's helper, exported once (batch a size variable) and run at batch 1 and 1000;
the engines alternate run by run, and each prints its median and min latency.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def forest(trees: int, depth: int, features: int, seed: int = 0):
    from onnx import TensorProto as T
    from onnx import helper

    rng = np.random.default_rng(seed)
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                         "target_treeids", "target_nodeids", "target_ids", "target_weights")}
    inner = 2 ** depth - 1
    for t in range(trees):
        for n in range(2 * inner + 1):
            leaf = n >= inner
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(n)
            a["nodes_featureids"].append(0 if leaf else int(rng.integers(features)))
            a["nodes_modes"].append("LEAF" if leaf else "BRANCH_LEQ")
            a["nodes_values"].append(0.0 if leaf else float(rng.normal()))
            a["nodes_truenodeids"].append(0 if leaf else 2 * n + 1)
            a["nodes_falsenodeids"].append(0 if leaf else 2 * n + 2)
            if leaf:
                a["target_treeids"].append(t)
                a["target_nodeids"].append(n)
                a["target_ids"].append(0)
                a["target_weights"].append(float(rng.normal()))
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            n_targets=1, aggregate_function="AVERAGE", **a)
    g = helper.make_graph([node], "forest",
                          [helper.make_tensor_value_info("x", T.FLOAT, ["n", features])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                               helper.make_opsetid("ai.onnx.ml", 3)])


def main() -> None:
    import onnxruntime as ort

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trees", type=int, default=100)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    model = forest(args.trees, args.depth, args.features)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "forest.mlc"
        mod, _ = import_onnx(model)
        export_module(mod, path, ExportOptions(target="host"))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), opts)
        with load(path, threads=1) as bundle:
            print(f"{args.trees} trees of depth {args.depth}, {args.features} features, "
                  "1 thread; ms per run")
            for batch in (1, 1000):
                x = np.random.default_rng(batch).standard_normal(
                    (batch, args.features)).astype(np.float32)
                feed = {"x": x}
                want = session.run(None, feed)[0]
                got = bundle.run(feed)["y"]
                assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
                times: dict[str, list[float]] = {"onnxruntime": [], "mlcpack": []}
                for _ in range(args.rounds):   # alternate, so both see the same load
                    for name in times:
                        t0 = time.perf_counter()
                        if name == "onnxruntime":
                            session.run(None, feed)
                        else:
                            bundle.run(feed)
                        times[name].append((time.perf_counter() - t0) * 1e3)
                for name, ts in times.items():
                    print(f"batch {batch:5d}  {name:12s} median {np.median(ts):8.3f}  "
                          f"min {min(ts):8.3f}")


if __name__ == "__main__":
    main()
