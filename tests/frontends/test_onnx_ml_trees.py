"""``ai.onnx.ml`` tree ensembles (issue 37 item 4): TreeEnsembleRegressor and
TreeEnsembleClassifier as sklearn-onnx writes them (opset 3 attributes, the binary and
multiclass cases, every aggregate and post-transform, NaN following ``missing_value_tracks_true``),
and opset 5's TreeEnsemble (leaves apart, BRANCH_MEMBER sets, float64), built with onnx's
helper; each bundle run against ONNX Runtime at two batch sizes from one export (the batch is a
size variable), the C runtime bit-identical to the Python one. String labels are refused in one
line. With ``MLCPACK_SLOW=1`` and scikit-learn + skl2onnx installed, real sklearn exports too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from conftest import SLOW
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.errors import ExportError
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load
from test_c_runtime import CC, assert_bit_identical

ort = pytest.importorskip("onnxruntime")

FEATURES = 5
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def random_trees(seed: int, n_trees: int, depth: int, targets: int, all_modes: bool = False,
                 positive: bool = False, one_target: int | None = None) -> dict:
    """Full binary trees in sklearn-onnx's attribute layout (node ids per tree, leaves listed
    with their weights per target)."""
    rng = np.random.default_rng(seed)
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                         "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                         "nodes_missing_value_tracks_true", "w_tree", "w_node", "w_id", "w")}
    for tree in range(n_trees):
        inner = 2 ** depth - 1
        for node in range(2 * inner + 1):
            a["nodes_treeids"].append(tree)
            a["nodes_nodeids"].append(node)
            a["nodes_missing_value_tracks_true"].append(int(rng.integers(2)))
            if node < inner:
                a["nodes_featureids"].append(int(rng.integers(FEATURES)))
                mode = MODES[int(rng.integers(6))] if all_modes else "BRANCH_LEQ"
                a["nodes_modes"].append(mode)
                # EQ/NEQ thresholds on the grid the inputs are drawn from
                value = float(rng.integers(-2, 3)) if "EQ" in mode else float(rng.normal())
                a["nodes_values"].append(value)
                a["nodes_truenodeids"].append(2 * node + 1)
                a["nodes_falsenodeids"].append(2 * node + 2)
                continue
            a["nodes_featureids"].append(0)
            a["nodes_modes"].append("LEAF")
            a["nodes_values"].append(0.0)
            a["nodes_truenodeids"].append(0)
            a["nodes_falsenodeids"].append(0)
            ids = [one_target] if one_target is not None else range(targets)
            for t in ids:
                if rng.random() < 0.2 and one_target is None:
                    continue   # a leaf that weighs some targets only
                a["w_tree"].append(tree)
                a["w_node"].append(node)
                a["w_id"].append(t)
                w = float(rng.random() if positive else rng.normal())
                a["w"].append(w)
    return a


def regressor(name: str, seed: int, aggregate: str, targets: int, transform: str = "NONE",
              base: list | None = None, all_modes: bool = False) -> onnx.NodeProto:
    a = random_trees(seed, 4, 3, targets, all_modes)
    extra = {"base_values": base} if base else {}
    return helper.make_node(
        "TreeEnsembleRegressor", ["x"], [name], domain="ai.onnx.ml",
        aggregate_function=aggregate, n_targets=targets, post_transform=transform,
        target_treeids=a.pop("w_tree"), target_nodeids=a.pop("w_node"),
        target_ids=a.pop("w_id"), target_weights=a.pop("w"), **a, **extra)


def classifier(names: list[str], seed: int, classes: int, transform: str, base=None,
               positive: bool = False, one_target: int | None = None) -> onnx.NodeProto:
    a = random_trees(seed, 3, 3, classes, positive=positive, one_target=one_target)
    extra = {"base_values": base} if base else {}
    return helper.make_node(
        "TreeEnsembleClassifier", ["x"], names, domain="ai.onnx.ml", post_transform=transform,
        classlabels_int64s=[10 * (k + 1) for k in range(classes)],
        class_treeids=a.pop("w_tree"), class_nodeids=a.pop("w_node"),
        class_ids=a.pop("w_id"), class_weights=a.pop("w"), **a, **extra)


# (node, outputs): every aggregate, several targets with and without base values, all six
# comparison modes; classifiers as sklearn-onnx writes them: a decision tree's binary
# probabilities (one class weighed, weights in [0, 1]), gradient boosting's binary logit (one
# class, mixed signs, one base value, LOGISTIC), multiclass forests and boosting
LEGACY = [
    (regressor("sum", 1, "SUM", 1, base=[0.25]), ["sum"]),
    (regressor("avg", 2, "AVERAGE", 3, base=[1.0, -2.0, 0.5]), ["avg"]),
    (regressor("min", 3, "MIN", 2, transform="SOFTMAX"), ["min"]),
    (regressor("max", 4, "MAX", 2, transform="LOGISTIC", all_modes=True), ["max"]),
    (regressor("zero", 5, "SUM", 3, transform="SOFTMAX_ZERO"), ["zero"]),
    (classifier(["dt_label", "dt_prob"], 6, 2, "NONE", positive=True, one_target=0),
     ["dt_label", "dt_prob"]),
    (classifier(["gb_label", "gb_prob"], 7, 2, "LOGISTIC", base=[-0.3], one_target=0),
     ["gb_label", "gb_prob"]),
    (classifier(["gbn_label", "gbn_score"], 8, 2, "NONE", one_target=0),
     ["gbn_label", "gbn_score"]),
    (classifier(["rf_label", "rf_prob"], 9, 4, "NONE", positive=True), ["rf_label", "rf_prob"]),
    (classifier(["mc_label", "mc_prob"], 10, 3, "SOFTMAX", base=[0.1, -0.2, 0.3]),
     ["mc_label", "mc_prob"]),
]


def legacy_model(dtype: int = T.FLOAT) -> onnx.ModelProto:
    nodes = [n for n, _ in LEGACY]
    outs = []
    for _, names in LEGACY:
        for name in names:
            kind = T.INT64 if name.endswith("label") else T.FLOAT
            outs.append(helper.make_tensor_value_info(name, kind, None))
    g = helper.make_graph(nodes, "trees", [helper.make_tensor_value_info(
        "x", dtype, ["n", FEATURES])], outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                               helper.make_opsetid("ai.onnx.ml", 3)])


def v5_model() -> onnx.ModelProto:
    """TreeEnsemble (opset 5), float64: two trees, leaves in their own lists, a BRANCH_MEMBER
    node (each set ended by NaN), AVERAGE over two targets. Checked against onnx's reference
    evaluator, not ONNX Runtime: 1.32 sends values outside a BRANCH_MEMBER set down the true
    branch, and reads opset 5's post_transform 1 and 2 as its older enum's LOGISTIC and SOFTMAX
    (swapped); mlcpack follows the spec (1 SOFTMAX, 2 LOGISTIC) and the reference."""
    tensor = helper.make_tensor
    node = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", aggregate_function=0, n_targets=2, tree_roots=[0, 3],
        nodes_featureids=[0, 2, 1, 4, 3], nodes_modes=tensor("m", T.UINT8, [5], [0, 6, 3, 6, 1]),
        nodes_splits=tensor("s", T.DOUBLE, [5], [0.1, 0.0, -0.4, 0.0, 0.7]),
        nodes_truenodeids=[1, 0, 2, 3, 4], nodes_trueleafs=[0, 1, 1, 1, 1],
        nodes_falsenodeids=[2, 1, 3, 4, 5], nodes_falseleafs=[0, 1, 1, 0, 1],
        nodes_missing_value_tracks_true=[1, 0, 0, 1, 0],
        membership_values=tensor("mv", T.DOUBLE, [7], [1.0, -1.0, np.nan, 0.5, 2.0, 2.5,
                                                            np.nan]),
        leaf_targetids=[0, 1, 0, 1, 0, 1],
        leaf_weights=tensor("w", T.DOUBLE, [6], [1.5, -0.5, 0.25, 2.0, -1.0, 0.75]))
    g = helper.make_graph([node], "tree5",
                          [helper.make_tensor_value_info("x", T.DOUBLE, ["n", FEATURES])],
                          [helper.make_tensor_value_info("y", T.DOUBLE, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                               helper.make_opsetid("ai.onnx.ml", 5)])


def feeds(n: int, dtype=np.float32, seed: int = 0) -> dict:
    """Values on a grid of halves (so EQ/NEQ and the member sets hit) plus noise, a few NaN."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 5, (n, FEATURES)) / 2.0
    x = np.where(rng.random((n, FEATURES)) < 0.5, x, rng.normal(size=(n, FEATURES)))
    x[rng.random((n, FEATURES)) < 0.05] = np.nan
    return {"x": x.astype(dtype)}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, tuple[onnx.ModelProto, Path, type]]:
    folder = tmp_path_factory.mktemp("trees")
    out = {}
    for name, model, dtype in (("legacy", legacy_model(), np.float32),
                               ("v5", v5_model(), np.float64)):
        mod, _ = import_onnx(model)
        export_module(mod, folder / f"{name}.mlc", ExportOptions(target="host"))
        out[name] = (model, folder / f"{name}.mlc", dtype)
    return out


@pytest.mark.parametrize("name", ["legacy", "v5"])
def test_trees_match_onnxruntime(bundles, name) -> None:
    model, path, dtype = bundles[name]
    if name == "v5":
        from onnx.reference import ReferenceEvaluator
        session = ReferenceEvaluator(model)
    else:
        session = ort.InferenceSession(model.SerializeToString())
    with load(path) as bundle:
        for n in (1, 37):
            feed = feeds(n, dtype, seed=n)
            got = bundle.run(feed)
            for out, want in zip(model.graph.output, session.run(None, feed)):
                g = got[out.name]
                assert g.dtype == want.dtype and g.shape == want.shape, out.name
                np.testing.assert_allclose(g, want, rtol=2e-6, atol=1e-6, err_msg=out.name)


def test_integer_features(tmp_path) -> None:
    """int64 features compare as float32 (ONNX Runtime has no int64 kernel: the reference is
    the same trees on the features cast to float32)."""
    def model(dtype: int) -> onnx.ModelProto:
        g = helper.make_graph([regressor("y", 11, "SUM", 2)], "t",
                              [helper.make_tensor_value_info("x", dtype, [2, FEATURES])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("ai.onnx.ml", 3)])

    mod, _ = import_onnx(model(T.INT64))
    export_module(mod, tmp_path / "int.mlc", ExportOptions(target="host"))
    x = np.array([[1, -2, 0, 3, -1], [0, 2, -1, -3, 1]], np.int64)
    want = ort.InferenceSession(model(T.FLOAT).SerializeToString()).run(
        None, {"x": x.astype(np.float32)})[0]
    with load(tmp_path / "int.mlc") as bundle:
        np.testing.assert_allclose(bundle.run({"x": x})["y"], want, rtol=1e-6, atol=1e-6)


def test_string_labels_are_refused_in_one_line() -> None:
    a = random_trees(0, 1, 1, 2)
    node = helper.make_node(
        "TreeEnsembleClassifier", ["x"], ["label", "prob"], domain="ai.onnx.ml",
        classlabels_strings=["cat", "dog"], class_treeids=a.pop("w_tree"),
        class_nodeids=a.pop("w_node"), class_ids=a.pop("w_id"), class_weights=a.pop("w"), **a)
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", T.FLOAT, [2, 5])],
                          [helper.make_tensor_value_info("label", T.STRING, None),
                           helper.make_tensor_value_info("prob", T.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                                helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(ExportError) as err:
        import_onnx(model)
    assert "\n" not in str(err.value) and "string class labels" in str(err.value)


@pytest.mark.parametrize("name", ["legacy", "v5"])
def test_c_runtime_bit_identical(bundles, tmp_path, name) -> None:
    if CC is None:
        pytest.skip("no C compiler (cc or gcc) on this machine: the C runtime cannot be built")
    from test_c_runtime import CDIR, _make
    _make("all")
    _, path, dtype = bundles[name]
    assert_bit_identical(CDIR / "build", path, feeds(9, dtype, seed=3), tmp_path, threads=(1, 2))


@pytest.mark.skipif(not SLOW, reason="sklearn models through skl2onnx: MLCPACK_SLOW=1")
def test_sklearn_exports_match_onnxruntime(tmp_path) -> None:
    ensemble = pytest.importorskip("sklearn.ensemble")
    tree = pytest.importorskip("sklearn.tree")
    skl2onnx = pytest.importorskip("skl2onnx")
    rng = np.random.RandomState(0)
    x = rng.randn(200, 6).astype(np.float32)
    y2 = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    y3 = (x[:, 0] > 0).astype(np.int64) + (x[:, 2] > 0.5)
    yr = x[:, 0] * 2 + x[:, 1] ** 2
    models = [(tree.DecisionTreeClassifier(max_depth=6), y2),
              (ensemble.RandomForestClassifier(20, max_depth=8, random_state=0), y3),
              (ensemble.GradientBoostingClassifier(n_estimators=20), y2),
              (ensemble.GradientBoostingClassifier(n_estimators=10), y3),
              (ensemble.RandomForestRegressor(20, random_state=0), yr),
              (ensemble.GradientBoostingRegressor(n_estimators=30), yr)]
    test = rng.randn(64, 6).astype(np.float32)
    for k, (m, y) in enumerate(models):
        m.fit(x, y)
        options = {id(m): {"zipmap": False}} if hasattr(m, "classes_") else None
        onx = skl2onnx.to_onnx(m, x[:1], options=options,
                               target_opset={"": 18, "ai.onnx.ml": 3})
        mod, _ = import_onnx(onx)
        export_module(mod, tmp_path / f"m{k}.mlc", ExportOptions(target="host"))
        want = ort.InferenceSession(onx.SerializeToString()).run(None, {"X": test})
        with load(tmp_path / f"m{k}.mlc") as bundle:
            got = bundle.run({"X": test})
        for out, w in zip(onx.graph.output, want):
            np.testing.assert_allclose(got[out.name], w, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{type(m).__name__} {out.name}")
