"""Silero VAD v6 (silero-vad 6.2.3's ``silero_vad.onnx``, pinned and hashed in
bench/vad_stream.py, fetched into the corpus cache) exported with the default command (``mlcpack
export silero_vad.onnx``: no --bind, open sizes; format 1.7, only the taken branch of its If on
the sample rate runs; its golden check passes against ONNX Runtime), then fed a 10-second stream as silero's own wrapper feeds it (context
samples, state carried) at 16 kHz and 8 kHz, batch 1 and 4: every chunk's speech probability and
the final state as ONNX Runtime's, each runtime carrying its own state. The C runtime gives the
Python runtime's bytes on the same chunks.

Under ``MLCPACK_SLOW=1`` only: it fetches the wheel, and the export compiles two sub-networks
for two CPU levels (about 20 CPU-s since the STFT conv's phase planes fill in a loop: it was
minutes). The same path in seconds: tests/export/test_if_branches.py (a model with the
same control flow) and its C runtime test."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SLOW

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import vad_stream  # noqa: E402

pytestmark = pytest.mark.skipif(not SLOW, reason="MLCPACK_SLOW=1: exports silero VAD v6 "
                                "(minutes); tests/export/test_if_branches.py covers the path")


@pytest.fixture(scope="module")
def vad(tmp_path_factory, run_cli) -> tuple[Path, Path]:
    src = vad_stream.model_path()
    bundle = tmp_path_factory.mktemp("vad") / "silero_vad.mlc"
    proc = run_cli("export", src, "-o", bundle, timeout=900)   # minutes on a loaded host
    assert proc.returncode == 0, proc.stderr
    # checked against ONNX Runtime at a rate and chunk length the model takes (the If compares
    # sr with 16000; its branch's reflect pad and one-frame Squeeze need 192 <= L < 704)
    assert "golden check passed against onnxruntime" in proc.stdout, proc.stdout
    assert "sr = 16000 (a value its condition accepts); input (2, 256)" in proc.stdout
    return src, bundle


@pytest.mark.parametrize("rate", [16000, 8000])
@pytest.mark.parametrize("batch", [1, 4])
def test_stream_matches_onnx_runtime(vad, rate, batch) -> None:
    from mlcpack.runtime import load

    src, bundle = vad
    inputs = vad_stream.chunks(vad_stream.audio(rate, batch, 10.0, seed=batch), rate)
    want, want_state = vad_stream.stream(vad_stream.ort_runner(src), inputs, rate)
    with load(bundle) as model:
        got, got_state = vad_stream.stream(vad_stream.mlc_runner(model), inputs, rate)
    assert got.shape == want.shape == (len(inputs), batch, 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(got_state, want_state, rtol=0, atol=1e-4)
    assert want.max() > 0.5 > want.min(), "the stream has speech and silence"


def test_c_runtime_bit_identical(vad, tmp_path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from test_c_runtime import _make, assert_bit_identical

    _make("all")
    _, bundle = vad
    build = ROOT / "runtime" / "c" / "build"
    for rate in (16000, 8000):
        x = vad_stream.chunks(vad_stream.audio(rate, 4, 1.0, seed=3), rate)[5]
        state = np.random.default_rng(rate).standard_normal((2, 4, 128)).astype(np.float32)
        feeds = {"input": x, "state": state, "sr": np.array(rate, np.int64)}
        assert_bit_identical(build, bundle, feeds, tmp_path / str(rate))
