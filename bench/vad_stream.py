"""Silero VAD v6 (silero-vad 6.2.3's ``silero_vad.onnx``) over a 10-second stream, as silero's
own Python wrapper feeds it (``utils_vad.OnnxWrapper``): chunks of 512 samples at 16 kHz or 256
at 8 kHz, each prefixed by the last 64 / 32 samples of the previous one (the context), the LSTM
state carried from call to call, the sample rate as an int64 scalar. The bundle is exported with
the default command (``mlcpack export silero_vad.onnx``: no --bind, open sizes); the model's If
on the sample rate runs only its taken branch (format 1.7).

Prints, per rate and batch, the largest |difference| to ONNX Runtime over the whole stream
(speech probabilities and the final state; each runtime carries its own state) and the
per-chunk latency of both, measured alternately on the same inputs (median and min, µs).

Run: .venv/bin/python bench/vad_stream.py [--bundle vad.mlc] [--seconds 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import corpus  # noqa: E402

SILERO_VAD_6 = corpus.Wheel("silero-vad==6.2.3", "silero_vad-6.2.3-py3-none-any.whl",
                            "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8")
MEMBER = "silero_vad/data/silero_vad.onnx"
ONNX_SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"
CHUNK = {16000: 512, 8000: 256}     # samples per call (the wrapper refuses others)
CONTEXT = {16000: 64, 8000: 32}     # samples of the previous chunk before each one

Run = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def model_path() -> Path:
    """silero_vad.onnx of silero-vad 6.2.3, from the corpus cache (fetched on first use)."""
    folder = corpus.cache_dir() / "models" / "silero_vad_v6"
    dest = folder / "silero_vad.onnx"
    if not (dest.exists() and corpus.sha256_of(dest) == ONNX_SHA256):
        folder.mkdir(parents=True, exist_ok=True)
        corpus._extract(corpus.fetch_wheel(SILERO_VAD_6), MEMBER, dest)
        if corpus.sha256_of(dest) != ONNX_SHA256:
            raise corpus.CorpusError(f"{MEMBER} in {SILERO_VAD_6.filename}: not the pinned "
                                     f"SHA-256 {ONNX_SHA256}")
    return dest


def audio(rate: int, batch: int, seconds: float, seed: int = 0) -> np.ndarray:
    """[batch, samples] float32 in [-1, 1]: quiet noise with voiced bursts (a pitch and its
    harmonics under a syllable-rate envelope), different per row."""
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    t = np.arange(n) / rate
    rows = []
    for _ in range(batch):
        pitch = rng.uniform(100, 220)
        voiced = sum(np.sin(2 * np.pi * pitch * k * t + rng.uniform(0, 6)) / k for k in range(1, 6))
        envelope = np.clip(np.sin(2 * np.pi * rng.uniform(2, 5) * t), 0, None)
        bursts = (np.sin(2 * np.pi * 0.3 * t + rng.uniform(0, 6)) > 0).astype(np.float64)
        rows.append(0.3 * voiced * envelope * bursts + 0.01 * rng.standard_normal(n))
    return np.clip(np.asarray(rows), -1, 1).astype(np.float32)


def chunks(wave: np.ndarray, rate: int) -> list[np.ndarray]:
    """The model's inputs, as the wrapper makes them: each chunk (the last one zero-padded)
    after the previous call's last CONTEXT samples (zeros before the first)."""
    size, ctx = CHUNK[rate], CONTEXT[rate]
    padded = np.pad(wave, ((0, 0), (0, -wave.shape[1] % size)))
    context = np.zeros((wave.shape[0], ctx), np.float32)
    out = []
    for start in range(0, padded.shape[1], size):
        x = np.concatenate([context, padded[:, start:start + size]], axis=1)
        out.append(np.ascontiguousarray(x))
        context = x[:, -ctx:]
    return out


def stream(run: Run, inputs: list[np.ndarray], rate: int) -> tuple[np.ndarray, np.ndarray]:
    """(every chunk's output [chunks, batch, 1], the last state), the state carried."""
    state = np.zeros((2, inputs[0].shape[0], 128), np.float32)
    sr = np.array(rate, np.int64)
    outs = []
    for x in inputs:
        out, state = run(x, state, sr)
        outs.append(out)
    return np.stack(outs), state


def ort_runner(path: Path) -> Run:
    import onnxruntime as ort

    opts = ort.SessionOptions()   # as silero's wrapper: one thread
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def run(x, state, sr):
        out, new = session.run(None, {"input": x, "state": state, "sr": sr})
        return out, new
    return run


def mlc_runner(model) -> Run:
    def run(x, state, sr):
        got = model.run({"input": x, "state": state, "sr": sr})
        return got["output"], got["stateN"]
    return run


def host_flags() -> str:
    try:
        flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(),
                              re.M).group(1).split())
    except (OSError, AttributeError):
        return platform.machine()
    level = ("AVX-512" if "avx512f" in flags else "AVX2+FMA, no AVX-512"
             if {"avx2", "fma"} <= flags else "no AVX2")
    return f"{platform.machine()} {level}"


def export_default(src: Path, bundle: Path) -> None:
    """``mlcpack export silero_vad.onnx -o bundle``: the default command, nothing bound."""
    exe = Path(sys.executable).with_name("mlcpack")
    proc = subprocess.run([str(exe), "export", str(src), "-o", str(bundle)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"export failed: {proc.stderr.strip()}")
    print(proc.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=None,
                        help="a bundle of silero_vad.onnx (exported with the default command "
                             "when not given)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the stream")
    args = parser.parse_args()
    from mlcpack.runtime import load

    src = model_path()
    bundle = args.bundle or corpus.cache_dir() / "bundles" / "silero_vad_v6_default.mlc"
    if args.bundle is None:
        bundle.parent.mkdir(parents=True, exist_ok=True)
        export_default(src, bundle)
    ort_run = ort_runner(src)
    print(f"host: {host_flags()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; ONNX Runtime 1 thread, mlcpack 1 thread")
    print("rate  batch chunks  max|out-ORT|  max|state-ORT|  ORT us/chunk (med/min)  "
          "mlcpack us/chunk (med/min)")
    with load(bundle, threads=1) as model:
        mlc_run = mlc_runner(model)
        for rate in (16000, 8000):
            for batch in (1, 4):
                inputs = chunks(audio(rate, batch, args.seconds, seed=batch), rate)
                want, want_state = stream(ort_run, inputs, rate)
                got, got_state = stream(mlc_run, inputs, rate)
                d_out = float(np.abs(got - want).max())
                d_state = float(np.abs(got_state - want_state).max())
                times: dict[str, list[float]] = {"ort": [], "mlc": []}
                state = np.zeros((2, batch, 128), np.float32)
                sr = np.array(rate, np.int64)
                for _ in range(args.repeats):
                    for x in inputs:   # alternate, on the same inputs
                        for name, run in (("ort", ort_run), ("mlc", mlc_run)):
                            t0 = time.perf_counter()
                            out, new = run(x, state, sr)
                            times[name].append((time.perf_counter() - t0) * 1e6)
                        state = new
                o, m = times["ort"], times["mlc"]
                print(f"{rate:5d} {batch:5d} {len(inputs):6d}  {d_out:11.3g}  {d_state:14.3g}  "
                      f"{statistics.median(o):10.1f} / {min(o):7.1f}  "
                      f"{statistics.median(m):13.1f} / {min(m):7.1f}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
