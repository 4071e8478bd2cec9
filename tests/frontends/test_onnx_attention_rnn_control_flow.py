"""Attention, Einsum, RotaryEmbedding, RNN/GRU/LSTM and control flow (If, Scan, Loop) from ONNX:
models built with onnx.helper on odd shapes, exported, run by the runtime and compared with
ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportError
from test_onnx_frontend import main_ops, run_bundle

ort = pytest.importorskip("onnxruntime")

F, B, I64, I32 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64, TensorProto.INT32
RNG = np.random.default_rng(11)
_NP = {F: np.float32, B: np.bool_, I64: np.int64, I32: np.int32}


def model(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, tuple[int, Sequence[int]]],
          outputs: Sequence[str], opset: int, inits: Mapping[str, np.ndarray] | None = None
          ) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes), "g",
        [helper.make_tensor_value_info(n, t, list(s)) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10 if opset >= 21 else 8)


def feeds_for(inputs: Mapping[str, tuple[int, Sequence[int]]]) -> dict[str, np.ndarray]:
    out = {}
    for name, (t, shape) in inputs.items():
        if t == B:
            out[name] = RNG.random(shape) > 0.3
        else:
            out[name] = RNG.standard_normal(shape).astype(_NP[t])
    return out


def check(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray], tmp_path: Path,
          rtol: float = 1e-4, atol: float = 1e-5) -> dict[str, np.ndarray]:
    got = run_bundle(m, feeds, tmp_path)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in m.graph.output]
    for name, ref in zip(names, session.run(names, dict(feeds))):
        assert got[name].shape == ref.shape, name
        assert got[name].dtype == ref.dtype, name
        # Masked attention scores are -inf here (as in the ONNX reference), float lowest there.
        lowest = np.finfo(ref.dtype).min
        np.testing.assert_allclose(np.maximum(got[name], lowest), np.maximum(ref, lowest),
                                   rtol=rtol, atol=atol, err_msg=name)
    return got


# ---- Attention ----------------------------------------------------------------------------------

def test_attention_gqa_bool_mask_causal_past_softcap_bias_output(tmp_path: Path) -> None:
    # 6 query heads over 2 key/value heads, a bool 4-D mask, causal with a past, softcap, and
    # the biased scores returned.
    inputs = {"Q": (F, [2, 6, 3, 8]), "K": (F, [2, 2, 3, 8]), "V": (F, [2, 2, 3, 5]),
              "mask": (B, [2, 1, 3, 7]), "pk": (F, [2, 2, 4, 8]), "pv": (F, [2, 2, 4, 5])}
    n = helper.make_node("Attention", list(inputs), ["Y", "present_k", "present_v", "qk"],
                         is_causal=1, softcap=2.0, qk_matmul_output_mode=2, scale=0.3)
    feeds = feeds_for(inputs)
    feeds["mask"][..., 0] = True            # every row keeps one key
    got = check(model([n], inputs, ["Y", "present_k", "present_v", "qk"], 23), feeds, tmp_path)
    assert got["present_k"].shape == (2, 2, 7, 8)


def test_attention_3d_float_mask_and_qk_outputs(tmp_path: Path) -> None:
    inputs = {"Q": (F, [2, 5, 12]), "K": (F, [2, 7, 12]), "V": (F, [2, 7, 9]),
              "mask": (F, [5, 7])}
    n = helper.make_node("Attention", list(inputs), ["Y", "", "", "qk"], q_num_heads=3,
                         kv_num_heads=3, qk_matmul_output_mode=3)
    got = check(model([n], inputs, ["Y", "qk"], 23), feeds_for(inputs), tmp_path)
    assert got["Y"].shape == (2, 5, 9) and got["qk"].shape == (2, 3, 5, 7)


def test_attention_short_mask_padded_like_the_onnx_reference(tmp_path: Path) -> None:
    # A mask shorter than the keys is padded with -inf (ONNX Runtime refuses it; the ONNX
    # reference implementation, which made the backend test data, pads).
    from onnx.reference import ReferenceEvaluator

    inputs = {"Q": (F, [2, 5, 12]), "K": (F, [2, 7, 12]), "V": (F, [2, 7, 6]),
              "mask": (F, [5, 4])}
    n = helper.make_node("Attention", list(inputs), ["Y"], q_num_heads=3, kv_num_heads=3,
                         scale=0.2)
    m = model([n], inputs, ["Y"], 23)
    feeds = feeds_for(inputs)
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    np.testing.assert_allclose(run_bundle(m, feeds, tmp_path)["Y"], want, rtol=1e-4, atol=1e-5)


def test_attention_padded_kv_opset24(tmp_path: Path) -> None:
    inputs = {"Q": (F, [3, 2, 4, 8]), "K": (F, [3, 2, 6, 8]), "V": (F, [3, 2, 6, 8]),
              "lens": (I64, [3])}
    n = helper.make_node("Attention", ["Q", "K", "V", "", "", "", "lens"], ["Y"])
    feeds = feeds_for({k: v for k, v in inputs.items() if k != "lens"})
    feeds["lens"] = np.array([6, 1, 4], np.int64)
    check(model([n], inputs, ["Y"], 24), feeds, tmp_path)


def test_attention_bad_heads_is_a_clear_error() -> None:
    inputs = {"Q": (F, [1, 4, 10]), "K": (F, [1, 4, 10]), "V": (F, [1, 4, 10])}
    n = helper.make_node("Attention", list(inputs), ["Y"], q_num_heads=3, kv_num_heads=3)
    with pytest.raises(ExportError, match="not a multiple of 3 heads"):
        import_onnx(model([n], inputs, ["Y"], 23))


# ---- Einsum -------------------------------------------------------------------------------------

@pytest.mark.parametrize("equation,shapes", [
    ("bij,bjk->bik", [(3, 2, 5), (3, 5, 4)]),
    ("...ii->...i", [(2, 3, 4, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("i,j", [(3,), (4,)]),
    ("ii", [(5, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (2, 5, 4, 2)]),
    ("abc,cd->ad", [(2, 3, 4), (4, 5)]),
])
def test_einsum(equation: str, shapes: list[tuple[int, ...]], tmp_path: Path) -> None:
    names = [f"x{i}" for i in range(len(shapes))]
    inputs = {n: (F, s) for n, s in zip(names, shapes)}
    m = model([helper.make_node("Einsum", names, ["y"], equation=equation)], inputs, ["y"], 12)
    feeds = feeds_for(inputs)
    got = check(m, feeds, tmp_path)
    np.testing.assert_allclose(got["y"], np.einsum(equation, *feeds.values()), rtol=1e-4,
                               atol=1e-5)


def test_einsum_bad_equation_is_a_clear_error() -> None:
    inputs = {"x": (F, [2, 3])}
    m = model([helper.make_node("Einsum", ["x"], ["y"], equation="ijk->i")], inputs, ["y"], 12)
    with pytest.raises(ExportError, match="does not match an operand of rank 2"):
        import_onnx(m)


# ---- RotaryEmbedding ----------------------------------------------------------------------------

@pytest.mark.parametrize("interleaved,rot", [(1, 6), (0, 0)])
def test_rotary_embedding_3d_with_positions(interleaved: int, rot: int, tmp_path: Path) -> None:
    inputs = {"x": (F, [2, 5, 30]), "cos": (F, [9, (rot or 10) // 2]),
              "sin": (F, [9, (rot or 10) // 2]), "pos": (I64, [2, 5])}
    n = helper.make_node("RotaryEmbedding", list(inputs), ["y"], num_heads=3,
                         interleaved=interleaved, rotary_embedding_dim=rot)
    feeds = feeds_for({k: v for k, v in inputs.items() if k != "pos"})
    feeds["pos"] = RNG.integers(0, 9, (2, 5)).astype(np.int64)
    check(model([n], inputs, ["y"], 23), feeds, tmp_path)


# ---- RNN, GRU, LSTM -----------------------------------------------------------------------------

def _rnn_inputs(gates: int, dirs: int, seq: int, batch: int, size: int, hidden: int,
                layout: int, states: int) -> dict:
    x = [batch, seq, size] if layout else [seq, batch, size]
    st = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    inputs = {"X": (F, x), "W": (F, [dirs, gates * hidden, size]),
              "R": (F, [dirs, gates * hidden, hidden]), "B": (F, [dirs, 2 * gates * hidden]),
              "lens": (I32, [batch])}
    for k in range(states):
        inputs[f"s{k}"] = (F, st)
    return inputs


def _rnn_feeds(inputs: dict, seq: int, batch: int) -> dict:
    feeds = feeds_for({k: v for k, v in inputs.items() if k != "lens"})
    feeds["lens"] = np.array([seq, 1] + [seq - 1] * (batch - 2), np.int32)[:batch]
    return feeds


def test_lstm_bidirectional_peepholes_lengths_and_batchwise_layout(tmp_path: Path) -> None:
    seq, batch, size, hidden = 2, 2, 5, 6
    outs = ["Y", "Y_h", "Y_c"]
    models = []
    for layout in (0, 1):
        inputs = _rnn_inputs(4, 2, seq, batch, size, hidden, layout, 2)
        inputs["P"] = (F, [2, 3 * hidden])
        n = helper.make_node("LSTM", ["X", "W", "R", "B", "lens", "s0", "s1", "P"], outs,
                             hidden_size=hidden, direction="bidirectional", layout=layout)
        models.append((model([n], inputs, outs, 22), inputs))
    feeds = _rnn_feeds(models[0][1], seq, batch)
    got = check(models[0][0], feeds, tmp_path)
    # ONNX Runtime has no batch-first (layout=1) LSTM: the same data, transposed, must agree.
    batchwise = dict(feeds, X=feeds["X"].transpose(1, 0, 2), s0=feeds["s0"].transpose(1, 0, 2),
                     s1=feeds["s1"].transpose(1, 0, 2))
    got1 = run_bundle(models[1][0], batchwise, tmp_path)
    np.testing.assert_allclose(got1["Y"], got["Y"].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
    for name in ("Y_h", "Y_c"):
        np.testing.assert_allclose(got1[name], got[name].transpose(1, 0, 2), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize("linear,direction", [(0, "reverse"), (1, "bidirectional")])
def test_gru_clip_lengths(linear: int, direction: str, tmp_path: Path) -> None:
    seq, batch, size, hidden = 3, 2, 3, 4
    dirs = 2 if direction == "bidirectional" else 1
    inputs = _rnn_inputs(3, dirs, seq, batch, size, hidden, 0, 1)
    n = helper.make_node("GRU", ["X", "W", "R", "B", "lens", "s0"], ["Y", "Y_h"],
                         hidden_size=hidden, direction=direction, clip=1.5,
                         linear_before_reset=linear)
    check(model([n], inputs, ["Y", "Y_h"], 22), _rnn_feeds(inputs, seq, batch), tmp_path)


def test_rnn_reverse_relu_and_lstm_reverse_activations(tmp_path: Path) -> None:
    seq, batch, size, hidden = 3, 2, 4, 5
    inputs = _rnn_inputs(1, 1, seq, batch, size, hidden, 0, 1)
    n = helper.make_node("RNN", ["X", "W", "R", "B", "", "s0"], ["Y", "Y_h"], hidden_size=hidden,
                         direction="reverse", activations=["Relu"])
    feeds = _rnn_feeds(inputs, seq, batch)
    del feeds["lens"]
    check(model([n], {k: v for k, v in inputs.items() if k != "lens"}, ["Y", "Y_h"], 22), feeds,
          tmp_path)
    inputs = _rnn_inputs(4, 1, seq, batch, size, hidden, 0, 0)
    n = helper.make_node("LSTM", ["X", "W", "R", "B"], ["", "Y_h"], hidden_size=hidden,
                         direction="reverse", activations=["HardSigmoid", "Tanh", "Softsign"],
                         activation_alpha=[0.3], activation_beta=[0.4])
    feeds = _rnn_feeds(inputs, seq, batch)
    del feeds["lens"]
    check(model([n], {k: v for k, v in inputs.items() if k != "lens"}, ["Y_h"], 22), feeds,
          tmp_path)


# ---- If, Scan, Loop -----------------------------------------------------------------------------

def _branch(name: str, op: str, out: str) -> onnx.GraphProto:
    # Reads the outer scope's x.
    return helper.make_graph([helper.make_node(op, ["x"], [out])], name, [],
                             [helper.make_tensor_value_info(out, F, None)])


def test_if_runtime_condition_selects_and_constant_condition_inlines(tmp_path: Path) -> None:
    n = helper.make_node("If", ["c"], ["y"], then_branch=_branch("t", "Sigmoid", "a"),
                         else_branch=_branch("e", "Tanh", "b"))
    inputs = {"c": (B, []), "x": (F, [3, 4])}
    m = model([n], inputs, ["y"], 17)
    for flag in (True, False):
        check(m, {"c": np.array(flag), "x": RNG.standard_normal((3, 4)).astype(np.float32)},
              tmp_path)
    folded = model([n], {"x": (F, [3, 4])}, ["y"], 17, inits={"c": np.array(False)})
    assert main_ops(folded) == ["tanh"]
    check(folded, {"x": RNG.standard_normal((3, 4)).astype(np.float32)}, tmp_path)


def test_if_runtime_condition_with_different_shapes_is_a_clear_error() -> None:
    # different ranks ([3, 4] and []): branches of one rank and different extents bind them at
    # run time instead (tests/export/test_data_dependent_shapes.py)
    else_b = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["b"], keepdims=0)], "e", [],
                               [helper.make_tensor_value_info("b", F, None)])
    n = helper.make_node("If", ["c"], ["y"], then_branch=_branch("t", "Relu", "a"),
                         else_branch=else_b)
    with pytest.raises(ExportError, match="both must match"):
        import_onnx(model([n], {"c": (B, []), "x": (F, [3, 4])}, ["y"], 17))


def test_scan_two_states_reverse_input_and_axis(tmp_path: Path) -> None:
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Mul", ["p_in", "x_t"], ["p_out"]),
         helper.make_node("Sub", ["s_out", "p_out"], ["scan_out"])],
        "body",
        [helper.make_tensor_value_info(n, F, [4]) for n in ("s_in", "p_in", "x_t")],
        [helper.make_tensor_value_info(n, F, [4]) for n in ("s_out", "p_out", "scan_out")])
    n = helper.make_node("Scan", ["s0", "p0", "x"], ["s", "p", "z"], body=body,
                         num_scan_inputs=1, scan_input_axes=[1], scan_input_directions=[1],
                         scan_output_axes=[1], scan_output_directions=[1])
    inputs = {"s0": (F, [4]), "p0": (F, [4]), "x": (F, [4, 5])}
    got = check(model([n], inputs, ["s", "p", "z"], 16), feeds_for(inputs), tmp_path)
    assert got["z"].shape == (4, 5)


def _loop_body() -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["f"], to=F),
         helper.make_node("Mul", ["y_in", "f"], ["m"]),
         helper.make_node("Add", ["m", "x"], ["y_out"]),        # x from the outer graph
         helper.make_node("Identity", ["y_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c_in", B, []),
         helper.make_tensor_value_info("y_in", F, [3])],
        [helper.make_tensor_value_info("c_out", B, []), helper.make_tensor_value_info("y_out", F, [3]),
         helper.make_tensor_value_info("scan", F, [3])])


def test_loop_constant_trip_count_unrolled(tmp_path: Path) -> None:
    n = helper.make_node("Loop", ["trip", "cond", "y0"], ["y", "ys"], body=_loop_body())
    m = model([n], {"y0": (F, [3]), "x": (F, [3])}, ["y", "ys"], 17,
              inits={"trip": np.array(4, np.int64), "cond": np.array(True)})
    got = check(m, feeds_for({"y0": (F, [3]), "x": (F, [3])}), tmp_path)
    assert got["ys"].shape == (4, 3)


def test_loop_runtime_trip_count_with_a_scan_output(tmp_path: Path) -> None:
    # a trip count fed at run time and a scan output: the rows have no bound at export, so the
    # VM appends them to a row store (format 1.9); this was refused ("needs a constant trip
    # count") before row stores
    n = helper.make_node("Loop", ["trip", "", "y0"], ["y", "ys"], body=_loop_body())
    m = model([n], {"trip": (I64, []), "y0": (F, [3]), "x": (F, [3])}, ["y", "ys"], 17)
    feeds = feeds_for({"y0": (F, [3]), "x": (F, [3])})
    for trip in (0, 5):
        got = check(m, {**feeds, "trip": np.array(trip, np.int64)}, tmp_path)
        assert got["ys"].shape == (trip, 3)


# ---- operators through their ONNX function body ------------------------------------------------

def _check_reference(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray], tmp_path: Path) -> None:
    # ONNX Runtime has neither opset-27 LinearAttention nor the preview FlexAttention.
    from onnx.reference import ReferenceEvaluator

    names = [o.name for o in m.graph.output]
    got = run_bundle(m, feeds, tmp_path)
    for name, want in zip(names, ReferenceEvaluator(m).run(names, dict(feeds))):
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_linear_attention_gated_delta_gqa_with_past(tmp_path: Path) -> None:
    inputs = {"q": (F, [2, 3, 12]), "k": (F, [2, 3, 6]), "v": (F, [2, 3, 6]),
              "past": (F, [2, 2, 3, 3]), "decay": (F, [2, 3, 6]), "beta": (F, [2, 3, 2])}
    n = helper.make_node("LinearAttention", list(inputs), ["y", "state"], q_num_heads=4,
                         kv_num_heads=2, update_rule="gated_delta")
    feeds = feeds_for(inputs)
    feeds["decay"] = -np.abs(feeds["decay"])                 # log-space decay
    feeds["beta"] = 1 / (1 + np.exp(-feeds["beta"]))
    _check_reference(model([n], inputs, ["y", "state"], 27), feeds, tmp_path)


def test_flex_attention_score_mod(tmp_path: Path) -> None:
    score_mod = helper.make_graph(
        [helper.make_node("Mul", ["s", "half"], ["s_out"])], "score_mod",
        [helper.make_tensor_value_info("s", F, ["B", "H", "L", "S"])],
        [helper.make_tensor_value_info("s_out", F, ["B", "H", "L", "S"])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    inputs = {"Q": (F, [1, 2, 3, 4]), "K": (F, [1, 2, 5, 4]), "V": (F, [1, 2, 5, 3])}
    n = helper.make_node("FlexAttention", list(inputs), ["Y"], domain="ai.onnx.preview",
                         score_mod=score_mod)
    m = model([n], inputs, ["Y"], 26)
    m.opset_import.append(helper.make_opsetid("ai.onnx.preview", 1))
    _check_reference(m, feeds_for(inputs), tmp_path)
