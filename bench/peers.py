"""The engines mlcpack is timed against in bench/ (real.py, bench.py): ONNX Runtime, and
OpenVINO when it is installed (``pip install -e '.[bench]'``), in fp32 and at its default
precision.

OpenVINO's CPU plugin picks its inference precision from the CPU: bf16 where the CPU has
AVX-512 BF16 or AMX, f16 on some ARM cores, f32 otherwise (an AVX2 + FMA host like this one).
So two OpenVINO engines are built: ``OV f32`` (``INFERENCE_PRECISION_HINT=f32``, the fp32 peer)
and ``OV default``, whose label names the precision it resolved to. Where the default resolves
to f32 it is the same configuration as ``OV f32``: it is not timed twice, and the note says so.
Each engine is compiled for the thread count it runs at (``INFERENCE_NUM_THREADS``, one stream,
the latency hint), static shapes from the feeds where the model allows it, and without CPU
pinning (ONNX Runtime and mlcpack do not pin either): on a shared 2-core host, a pinned thread
waits for whatever else runs on its core (measured on the MLP while an export ran: OpenVINO's
median 3.6 ms pinned against its 70-80 µs alone), an unpinned one moves to the free core.

"Best peer" is the fastest fp32 engine by median: ONNX Runtime or OV f32 (a default that
resolved to bf16 is shown beside them, but not counted: its outputs are not fp32's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

OPENVINO_MISSING = ("OpenVINO not installed: timing ONNX Runtime only (pip install -e "
                    "'.[bench]' adds it)")


@dataclass
class Engine:
    """One peer ready to run: ``run()`` one inference on the feeds it was built with,
    ``outputs()`` its outputs in the model's order (for the error against ONNX Runtime)."""
    label: str                   # "ORT", "OV f32", "OV default (bf16)"
    run: Callable[[], Any]
    outputs: Callable[[], list[np.ndarray]]
    compile_s: float             # building the session / compiling the model
    fp32: bool = True            # counts toward the best fp32 peer
    notes: list[str] = field(default_factory=list)


def ort_engine(path: Path, feeds: dict[str, np.ndarray], threads: int) -> Engine:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3  # ddddocr's declared output shape makes ORT warn on every run
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    compile_s = time.perf_counter() - t0
    return Engine("ORT", lambda: sess.run(None, feeds), lambda: sess.run(None, feeds), compile_s)


def openvino_version() -> str | None:
    """OpenVINO's version, or None when it is not installed."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino.__version__.split("-")[0]


def openvino_engines(path: Path, feeds: dict[str, np.ndarray], threads: int) -> list[Engine]:
    """``OV f32`` and, where the default precision is not f32, ``OV default (<precision>)``;
    [] when OpenVINO is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return []
    core = ov.Core()
    default = _precision_name(core.get_property("CPU", "INFERENCE_PRECISION_HINT"))
    engines = []
    for hint in ("f32", None) if default != "f32" else ("f32",):
        config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
                                  "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False}
        if hint is not None:
            config["INFERENCE_PRECISION_HINT"] = hint
        t0 = time.perf_counter()
        model = core.read_model(str(path))
        notes = []
        try:   # static shapes from the feeds: what OpenVINO runs fastest
            model.reshape({name: list(a.shape) for name, a in feeds.items()})
        except Exception:  # noqa: BLE001  (a graph that cannot be reshaped runs dynamic)
            model = core.read_model(str(path))
            notes.append("dynamic shapes (reshape to the feeds failed)")
        compiled = core.compile_model(model, "CPU", config)
        compile_s = time.perf_counter() - t0
        precision = _precision_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
        request = compiled.create_infer_request()
        names = [o.get_any_name() for o in compiled.outputs]

        def run(request=request) -> Any:
            return request.infer(feeds, share_inputs=True)

        def outputs(request=request, names=names) -> list[np.ndarray]:
            result = request.infer(feeds)
            return [np.array(result[name]) for name in names]

        if hint == "f32" and default == "f32":
            notes.append("OpenVINO's default precision on this CPU is f32 too (no bf16/f16 "
                         "hardware): the default is this row")
        label = "OV f32" if hint == "f32" else f"OV default ({precision})"
        engines.append(Engine(label, run, outputs, compile_s, precision == "f32", notes))
    return engines


def _precision_name(value: Any) -> str:
    """'f32', 'bf16', 'f16' from an OpenVINO element type (or its string form)."""
    text = str(value).lower().replace("<type: '", "").replace("'>", "")
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(text, text)


def max_abs_err(got: list[np.ndarray], expected: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(e, np.float64))))
               for g, e in zip(got, expected))


def best_fp32(medians: dict[str, float], engines: list[Engine]) -> tuple[str, float]:
    """(label, median) of the fastest fp32 engine among ``engines`` (by ``medians``)."""
    return min(((e.label, medians[e.label]) for e in engines if e.fp32), key=lambda p: p[1])
