"""ONNX Runtime on the same ONNX backend node cases the harness runs: how many it passes.

``python tests/conformance/ort_count.py [-k PATTERN] [-v]`` runs every ``node`` case's model with
onnxruntime (CPU, 1 thread, all graph optimizations as a user gets them) on every data set and
compares each output the way ``harness.py`` compares mlcpack's (same shape, dtype and
``assert_allclose`` with the case's rtol/atol). Inputs and outputs that are sequences or
optionals are read with onnx's own protos (ORT takes lists and None); maps and anything else
that fails to load, a session that refuses the model, or a run that raises count as not passed.
Prints the count and the version of each; writes nothing (docs/conformance.md quotes it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Case, _compare, discover  # noqa: E402


def _load(path: Path):
    data = path.read_bytes()
    t = onnx.TensorProto()
    try:
        t.ParseFromString(data)
        if t.data_type or t.dims:
            return numpy_helper.to_array(t)
    except Exception:  # noqa: BLE001  (not a tensor proto)
        pass
    seq = onnx.SequenceProto()
    try:
        seq.ParseFromString(data)
        if seq.elem_type == onnx.SequenceProto.TENSOR:
            return [numpy_helper.to_array(x) for x in seq.tensor_values]
    except Exception:  # noqa: BLE001
        pass
    opt = onnx.OptionalProto()
    opt.ParseFromString(data)
    if opt.elem_type == onnx.OptionalProto.TENSOR:
        return numpy_helper.to_array(opt.tensor_value) if opt.HasField("tensor_value") else None
    if opt.elem_type == onnx.OptionalProto.SEQUENCE:
        return [numpy_helper.to_array(x) for x in opt.sequence_value.tensor_values]
    raise ValueError(f"{path.name}: not a tensor, sequence or optional")


def _same(got, ref, case: Case, what: str) -> str | None:
    if isinstance(ref, list):
        if not isinstance(got, list) or len(got) != len(ref):
            return f"{what}: a sequence of another length"
        for i, (g, r) in enumerate(zip(got, ref)):
            problem = _same(g, r, case, f"{what}[{i}]")
            if problem:
                return problem
        return None
    if ref is None:
        return None if got is None else f"{what}: expected no value"
    got = np.asarray(got)
    if ref.dtype == object or got.dtype == object:
        return None if np.array_equal(got.astype(str), ref.astype(str)) else f"{what}: strings"
    return _compare(got, ref, case, what)


def run_ort(case: Case) -> str | None:
    """None when ONNX Runtime passes the case, else why not."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(case.model), opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        for k, (ins, outs) in enumerate(case.data_sets):
            feeds = dict(zip(names, (_load(p) for p in ins)))
            got = session.run(None, feeds)
            want = [_load(p) for p in outs]
            if len(got) != len(want):
                return f"set {k}: {len(got)} outputs, expected {len(want)}"
            for i, (g, w) in enumerate(zip(got, want)):
                problem = _same(g, w, case, f"set {k} output {i}")
                if problem:
                    return problem
    except Exception as exc:  # noqa: BLE001  (a refusal or a crash: not passed)
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
    return None


def main(argv=None) -> int:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-k", dest="pattern")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    cases = [c for c in discover(["node"]) if not args.pattern or args.pattern in c.name]
    t0 = time.perf_counter()
    passed = 0
    for case in cases:
        why = run_ort(case) if case.data_sets else "no test data"
        passed += why is None
        if args.verbose and why:
            print(f"{case.key}: {why}")
    print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}: {passed} of {len(cases)} "
          f"node cases pass ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
