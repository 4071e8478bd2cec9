"""An If on a run-time condition runs only its taken branch (issue 37 item 3, format 1.7: the
VM's JUMP_UNLESS, JUMP and TRAP). The model (``branch_models.rate_switch``) has silero VAD v6's
control flow in small: an If on the sample rate whose branches give outputs of different shapes
and each hold an If on a size whose other branch cannot be compiled. At 16 kHz sizes the 8 kHz
branch would fail (ONNX Runtime fails there too), so running both branches is not an option.

The bundle is exported once per test run with the command line's defaults (golden check on);
tests/runtime/test_c_runtime.py checks the C runtime bit-identical on it, and refusing the same
damaged jumps."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from mlcpack.runtime import bundle as bundle_format
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader, reader_minor
from mlcpack.runtime.errors import BundleError, FormatVersionError, InputError
from mlcpack.runtime.header import OP_JUMP, OP_JUMP_UNLESS, OP_TRAP

import branch_models as bm
from helpers import ort_outputs


@pytest.fixture(scope="module")
def switch(tmp_path_factory):
    return bm.exported(tmp_path_factory)


# (N, L, sample rate): at 16 kHz T = ceil(L / 16) must be 1, at 8 kHz ceil(L / 8)
WORKING = [(1, 12, 16000), (2, 16, 16000), (4, 1, 16000), (4, 8, 8000), (3, 5, 8000)]


def test_taken_branch_matches_onnx_runtime(switch) -> None:
    """Each output has the taken branch's shape ([N, 3] at 16 kHz, [N, 5] at 8 kHz: a size
    the branch binds) and ONNX Runtime's values, at sizes where the other branch would fail."""
    src, bundle = switch
    with load(bundle) as model:
        for n, length, rate in WORKING:
            feeds = bm.feeds(n, length, rate, seed=n + length)
            got, want = model.run(feeds), ort_outputs(src, feeds)
            for name, ref in want.items():
                assert got[name].shape == ref.shape, (name, n, length, rate)
                np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6)
        assert model.run(bm.feeds(2, 12, 16000))["y"].shape == (2, 3)
        assert model.run(bm.feeds(2, 8, 8000))["y"].shape == (2, 5)


def test_sizes_the_taken_branch_cannot_run_are_refused_in_one_line(switch) -> None:
    """L = 12 at 8 kHz: T = 2, the size If's compiled branch (Squeeze) does not apply and its
    other branch was left out: a one-line input error, as ONNX Runtime fails there too; the
    same L at 16 kHz runs (the 8 kHz branch's sizes are never looked at)."""
    src, bundle = switch
    feeds = bm.feeds(1, 12, 8000)
    session = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="MatMul dimension mismatch"):   # its own error type
        session.run(None, feeds)
    with load(bundle) as model:
        with pytest.raises(InputError, match="take a branch of one of the model's If") as info:
            model.run(feeds)
        assert "\n" not in str(info.value)
        model.run(bm.feeds(1, 12, 16000))   # the model still runs after a refusal


def test_bundle_is_format_1_7_and_older_readers_refuse_it(switch, monkeypatch) -> None:
    _, bundle = switch
    with BundleReader(bundle) as reader:
        header = reader.header
        assert header["format"] == [1, 7] and header["min_reader"] == [1, 7]
        assert header["vm"]["branches"] >= 3   # the rate If and one size If per branch
        assert reader_minor(header) == 7
    with load(bundle) as model:
        ops = {ins.opcode for ins in model._plan.runner.program}
    assert {OP_JUMP_UNLESS, OP_JUMP, OP_TRAP} <= ops
    # a 1.6 reader (the rule of docs/format.md section 2: min_reader 1.7 is newer than it)
    monkeypatch.setattr(bundle_format, "BRANCH_MINOR", 6)
    with pytest.raises(FormatVersionError, match="1.7"):
        load(bundle).close()


@pytest.mark.parametrize("change", ["backward", "past_end", "mid_instruction", "not_bool",
                                    "trap_reason"])
def test_damaged_jumps_are_refused(switch, tmp_path, change) -> None:
    """A jump that is not forward, leaves the bytecode or lands inside an instruction, a
    condition that is not one bool, an unknown TRAP reason: refused at load, in one line."""
    _, bundle = switch
    path = bm.damaged_bytecode(bundle, tmp_path / f"{change}.mlc", change)
    with pytest.raises(BundleError) as info:
        load(path).close()
    assert "\n" not in str(info.value)
    assert ("bytecode" in str(info.value) or "JUMP_UNLESS" in str(info.value)), info.value


def test_profile_times_the_taken_branch_only(switch) -> None:
    """``Model.profile`` of a bundle with branches: each timed instruction is the one that ran
    (the skipped branch's kernels get no time), and the inputs are placed before every timed
    run (the plan reuses the rate's bytes once it is read: a stale one took the wrong branch)."""
    _, bundle = switch
    with load(bundle) as model:
        for rate, taken, skipped in ((16000, "k16", "k8"), (8000, "k8", "k16")):
            prof = model.profile(bm.feeds(2, 8, rate), runs=3)

            def timed(tag: str, prof=prof) -> list[float]:
                return [t.min_us for t in prof.instructions if t.step.kind == "kernel"
                        and any(s.name.startswith(tag) for s in t.step.sources)]

            assert timed(taken) and all(us > 0 for us in timed(taken)), rate
            assert timed(skipped) and all(us == 0 for us in timed(skipped)), rate
