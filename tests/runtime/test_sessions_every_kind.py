"""``model.session()`` and ``model.run(..., out=...)`` on every bundle kind: fixed shapes, batch
plans, symbolic shapes with batch plans beside them (the default for an ONNX file whose only
open dim is its batch), and symbolic shapes unbounded and bounded (``--max-shape``). Sessions
run at the same time from several threads and give the model's results bit for bit; ``out=``
arrays are written and returned, and a wrong one is a one-line ``InputError``."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.runtime import load
from mlcpack.runtime.errors import InputError


def _dense_model() -> onnx.ModelProto:
    """x [1, 3, H, W] -> 2x2 max pool -> nearest upsampling x2 -> + x -> sigmoid (y) and the
    pooled map (p): two outputs whose sizes follow H and W (even H and W)."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Resize", ["p", "", "s"], ["u"], mode="nearest"),
             helper.make_node("Add", ["x", "u"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["y"])]
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, None)], [scales])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


KINDS = ["static", "batch", "symbolic_plans", "symbolic", "bounded"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, run_cli, paths, mlp_bundle):
    folder = tmp_path_factory.mktemp("kinds")
    onnx.save(_dense_model(), folder / "dense.onnx")
    args = {"batch": [paths["mlp_pickle"], "--batch-sizes", "1,8"],
            "symbolic_plans": [paths["artifacts"] / "cnn.onnx", "--input-shape",
                               "x=N,1,28,28", "--batch-sizes", "1,8"],
            "symbolic": [folder / "dense.onnx"],
            "bounded": [folder / "dense.onnx", "--max-shape", "x=1,3,64,64"]}
    out = {"static": mlp_bundle[0]}
    for kind, a in args.items():
        out[kind] = folder / f"{kind}.mlc"
        proc = run_cli("export", *a, "-o", out[kind], "--target", "host", "--no-check",
                       timeout=300)
        assert proc.returncode == 0, proc.stderr
    return out


def _feeds(model, kind: str, n: int) -> list[dict[str, np.ndarray]]:
    """``n`` inputs of several shapes the bundle takes."""
    rng = np.random.default_rng(len(kind))
    spec = model.inputs[0]
    shapes = {"static": [(1, 784)], "batch": [(1, 784), (3, 784), (8, 784)],
              "symbolic_plans": [(1, 1, 28, 28), (3, 1, 28, 28), (8, 1, 28, 28)],
              "symbolic": [(1, 3, 8, 12), (1, 3, 16, 6)], "bounded": [(1, 3, 8, 12), (1, 3, 64, 2)]}
    return [{spec.name: rng.standard_normal(shapes[kind][i % len(shapes[kind])]).astype(
        np.float32)} for i in range(n)]


@pytest.mark.parametrize("kind", KINDS)
def test_sessions_run_at_once_and_agree(bundles, kind):
    with load(bundles[kind]) as model:
        feeds = _feeds(model, kind, 6)
        want = [model.run(f) for f in feeds]
        got: dict[int, list] = {}

        def work(t: int, session) -> None:
            with session:
                got[t] = [session.run(f) for _ in range(3) for f in feeds]

        threads = [threading.Thread(target=work, args=(t, model.session(threads=1 + t)))
                   for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for t in range(2):
            for i, result in enumerate(got[t]):
                ref = want[i % len(feeds)]
                assert list(result) == list(ref)
                for name in ref:
                    assert result[name].tobytes() == ref[name].tobytes(), (kind, t, i, name)
        assert not model._sessions   # each closed by its `with`
        session = model.session()
        session.close()
        with pytest.raises(InputError, match="session is closed"):
            session.run(feeds[0])


@pytest.mark.parametrize("kind", KINDS)
def test_run_out_on_every_kind(bundles, kind):
    with load(bundles[kind]) as model:
        for runner in (model, model.session()):
            for f in _feeds(model, kind, 3):
                ref = model.run(f)
                name = model.outputs[0].name
                buf = np.full(ref[name].shape, np.nan, ref[name].dtype)
                result = runner.run(f, out={name: buf})
                assert result[name] is buf and buf.tobytes() == ref[name].tobytes()
                assert list(result) == [s.name for s in model.outputs]
                only = runner.run(f, outputs=[name], out={name: buf})
                assert list(only) == [name] and only[name] is buf
                wrong = np.empty((*ref[name].shape[:-1], ref[name].shape[-1] + 1), np.float32)
                with pytest.raises(InputError, match=rf"out\['{name}'\] has shape .*; output "
                                                     rf"'{name}' has shape"):
                    runner.run(f, out={name: wrong})
                with pytest.raises(InputError, match="float64"):
                    runner.run(f, out={name: buf.astype(np.float64)})


def test_a_symbolic_session_holds_its_own_arenas(bundles):
    with load(bundles["symbolic"]) as model, model.session() as session:
        assert session.arena_bytes == 0   # nothing planned yet
        session.run(_feeds(model, "symbolic", 1)[0])
        one = session.arena_bytes
        assert one > 0
        session.run(_feeds(model, "symbolic", 2)[1])   # another shape: another plan
        assert session.arena_bytes > one
        assert session.last_plan == "symbolic"


@pytest.mark.parametrize("kind", KINDS)
def test_profile_on_every_kind(bundles, kind):
    """``profile`` on the model and on a session: the plan the feeds' shapes run on, every
    instruction timed, on the session's threads; bad counts refused in one line."""
    with load(bundles[kind]) as model, model.session(threads=2) as session:
        feeds = _feeds(model, kind, 1)[0]
        for runner, threads in ((model, 1), (session, 2)):
            prof = runner.profile(feeds, runs=2, warmup=0)
            assert prof.runs == 2 and prof.threads == threads
            assert prof.durations_ns.shape == (2, len(prof.steps)) and len(prof.steps) > 0
            with pytest.raises(InputError, match="runs >= 1"):
                runner.profile(feeds, runs=0)
        assert model.run(feeds).keys() == session.run(feeds).keys()


@pytest.mark.parametrize("kind", KINDS)
def test_threads_on_every_kind(bundles, kind):
    """A model loaded on 2 threads and sessions on 1 or 3 give the 1-thread answers bit for
    bit; a bad thread count is a ``UsageError`` before anything is made."""
    from mlcpack.runtime.errors import UsageError

    with load(bundles[kind], threads=1) as one, load(bundles[kind], threads=2) as two:
        feeds = _feeds(one, kind, 3)
        want = [one.run(f) for f in feeds]
        with two.session(threads=3) as three, two.session(threads=1) as single:
            for runner in (two, three, single):
                for f, ref in zip(feeds, want):
                    got = runner.run(f)
                    assert all(got[k].tobytes() == ref[k].tobytes() for k in ref), kind
        for bad in (0, -1, 1.5, True):
            with pytest.raises(UsageError, match="whole number >= 1"):
                two.session(threads=bad)


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_in_place_on_every_kind(bundles, kind, monkeypatch):
    """With every input read and every output written in place (thresholds at 0), each kind
    gives the default copies' answers, and a result survives the runs after it."""
    from mlcpack.runtime import model as runtime_model

    with load(bundles[kind]) as plain:
        feeds = _feeds(plain, kind, 4)
        want = [plain.run(f) for f in feeds]
    monkeypatch.setattr(runtime_model, "OUTPUT_INPLACE_MIN_BYTES", 0)
    monkeypatch.setattr(runtime_model, "INPLACE_MIN_BYTES", 0)
    with load(bundles[kind]) as model, model.session() as session:
        for runner in (model, session):
            got = [runner.run(f) for f in feeds]
            for result, ref in zip(got, want):
                assert list(result) == list(ref)
                for name in ref:
                    assert result[name].tobytes() == ref[name].tobytes(), (kind, name)
            name = model.outputs[0].name
            buf = np.full(want[0][name].shape, np.nan, want[0][name].dtype)
            assert runner.run(feeds[0], out={name: buf})[name] is buf
            assert buf.tobytes() == want[0][name].tobytes()


def test_every_kind_has_the_same_model_attributes(bundles):
    """One plan object per kind behind ``Model``: no attribute exists in some kinds only, and
    a closed model refuses every call in one line, whatever its kind."""
    seen = {}
    for kind in KINDS:
        model = load(bundles[kind])
        seen[kind] = sorted(vars(model))
        assert model.last_plan is None and isinstance(model.has_parallel_kernels, bool)
        feeds = _feeds(model, kind, 1)[0]
        model.close()
        calls = [(model.run, (feeds,)), (model, (feeds[model.inputs[0].name],)),
                 (model.profile, (feeds,)), (model.session, ())]
        for call, args in calls:
            with pytest.raises(InputError, match="closed"):
                call(*args)
        assert sorted(vars(model)) == seen[kind]
    assert all(names == seen["static"] for names in seen.values()), seen
