"""A small model with silero VAD v6's control flow (format 1.7, the VM's branch): an ``If`` on a
run-time input (the sample rate) whose branches give outputs of different shapes, each branch
holding an ``If`` on a size (``T == 1 ? Squeeze : Identity``) whose other branch cannot be
compiled (a MatMul over T instead of 4). At 16 kHz sizes the 8 kHz branch would fail, so only
the taken branch may run. Shared by tests/export/test_if_branches.py and the C runtime's test.

x [N, 4, L], sr int64 scalar:
    sr == 16000: z = x[:, :, ::16] (T = ceil(L / 16)); y = squeeze(z, 2) @ W16 [4, 3] -> [N, 3]
    else:        z = x[:, :, ::8]  (T = ceil(L / 8));  y = squeeze(z, 2) @ W8 [4, 5]  -> [N, 5]
    s = x * 2 (16 kHz) or x * 3: a second output of the same shape in both branches.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _rate_branch(tag: str, step: int, width: int, scale: float) -> onnx.GraphProto:
    squeeze = helper.make_graph(
        [helper.make_node("Squeeze", [f"{tag}_z", "axis2"], [f"{tag}_sq"])], f"{tag}_sq", [],
        [helper.make_tensor_value_info(f"{tag}_sq", F, None)])
    keep = helper.make_graph(
        [helper.make_node("Identity", [f"{tag}_z"], [f"{tag}_id"])], f"{tag}_id", [],
        [helper.make_tensor_value_info(f"{tag}_id", F, None)])
    nodes = [
        helper.make_node("Slice", ["x", "zero", "big", "axis2", f"{tag}_step"], [f"{tag}_z"]),
        helper.make_node("Shape", [f"{tag}_z"], [f"{tag}_shape"]),
        helper.make_node("Gather", [f"{tag}_shape", "two"], [f"{tag}_t"]),
        helper.make_node("Equal", [f"{tag}_t", "one"], [f"{tag}_single"]),
        helper.make_node("If", [f"{tag}_single"], [f"{tag}_h"], then_branch=squeeze,
                         else_branch=keep),
        helper.make_node("MatMul", [f"{tag}_h", f"{tag}_w"], [f"{tag}_y"]),
        helper.make_node("Mul", ["x", f"{tag}_scale"], [f"{tag}_s"]),
    ]
    rng = np.random.default_rng(step)
    inits = [numpy_helper.from_array(np.array([step], np.int64), f"{tag}_step"),
             numpy_helper.from_array(rng.standard_normal((4, width)).astype(np.float32),
                                     f"{tag}_w"),
             numpy_helper.from_array(np.array(scale, np.float32), f"{tag}_scale")]
    return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"{tag}_y", F, None),
                                              helper.make_tensor_value_info(f"{tag}_s", F, None)],
                             inits)


def rate_switch(path: Path) -> Path:
    """The model above, saved at ``path``."""
    nodes = [helper.make_node("Equal", ["sr", "sixteen"], ["is16"]),
             helper.make_node("If", ["is16"], ["y", "s"],
                              then_branch=_rate_branch("k16", 16, 3, 2.0),
                              else_branch=_rate_branch("k8", 8, 5, 3.0))]
    inits = [numpy_helper.from_array(np.array(16000, np.int64), "sixteen"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1 << 30], np.int64), "big"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2"),
             numpy_helper.from_array(np.array(2, np.int64), "two"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    graph = helper.make_graph(
        nodes, "rate_switch",
        [helper.make_tensor_value_info("x", F, ["N", 4, "L"]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("s", F, None)],
        inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), path)
    return path


def feeds(n: int, length: int, rate: int, seed: int = 0) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((n, 4, length)).astype(np.float32)
    return {"x": x, "sr": np.array(rate, np.int64)}


def exported(tmp_path_factory) -> tuple[Path, Path]:
    """(onnx file, bundle) of ``rate_switch``, exported as ``mlcpack export`` does with its
    defaults (``packager.api.export``: golden check on). Once per test run: xdist workers share
    the folder above their own, and the first to take the lock exports for the others (this
    module's tests and tests/runtime/test_c_runtime.py's)."""
    import fcntl
    import os

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / "rate-switch"
    folder.mkdir(exist_ok=True)
    src, bundle = folder / "rate_switch.onnx", folder / "rate_switch.mlc"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not bundle.exists():
            from mlcpack.packager.api import Options, export

            rate_switch(src)
            result = export(src, bundle, Options())
            assert result.check and "golden check passed" in result.check, result.check
    return src, bundle


def damaged_bytecode(bundle: Path, out: Path, change: str) -> Path:
    """``bundle`` with its bytecode changed in place (same length, digest valid): ``change``
    is "backward" (the first JUMP_UNLESS continues at itself), "past_end", "mid_instruction",
    "not_bool" (it tests a float tensor) or "trap_reason" (a TRAP's reason 9)."""
    import struct

    from bundle_parts import payload_spans, read_parts, write_parts

    header, payloads = read_parts(bundle)
    ref = header["vm"]["bytecode"]
    k = payload_spans(header).index((ref["offset"], ref["size"]))
    words = list(struct.unpack(f"<{ref['size'] // 4}i", payloads[k]))
    starts, pc = [], 0
    while pc < len(words):   # instruction starts (docs/format.md section 6's encoding)
        starts.append(pc)
        op = words[pc]
        pc += 3 + words[pc + 2] if op in (1, 2) else 2 if op in (6, 7) else 3
    first = next(p for p in starts if words[p] == 5)   # JUMP_UNLESS t, w
    if change == "backward":
        words[first + 2] = first
    elif change == "past_end":
        words[first + 2] = len(words) + 3
    elif change == "mid_instruction":
        words[first + 2] = first + 1
    elif change == "not_bool":
        words[first + 1] = next(i for i, t in enumerate(header["tensors"]) if t[3] == "float32")
    elif change == "trap_reason":
        words[next(p for p in starts if words[p] == 7) + 1] = 9
    else:
        raise ValueError(change)
    payloads[k] = struct.pack(f"<{len(words)}i", *words)
    return write_parts(out, header, payloads)


def _padded_branch(tag: str, pad: int, step: int, scale: float) -> onnx.GraphProto:
    """x reflect-padded by ``pad`` on the right of axis 2, one sample in ``step`` kept, the
    size If (one frame: Squeeze), @ W [4, 3], times ``scale``."""
    squeeze = helper.make_graph(
        [helper.make_node("Squeeze", [f"{tag}_z", "axis2"], [f"{tag}_sq"])], f"{tag}_sq", [],
        [helper.make_tensor_value_info(f"{tag}_sq", F, None)])
    keep = helper.make_graph(
        [helper.make_node("Identity", [f"{tag}_z"], [f"{tag}_id"])], f"{tag}_id", [],
        [helper.make_tensor_value_info(f"{tag}_id", F, None)])
    nodes = [
        helper.make_node("Pad", ["x", f"{tag}_pads"], [f"{tag}_p"], mode="reflect"),
        helper.make_node("Slice", [f"{tag}_p", "zero", "big", "axis2", f"{tag}_step"],
                         [f"{tag}_z"]),
        helper.make_node("Shape", [f"{tag}_z"], [f"{tag}_shape"]),
        helper.make_node("Gather", [f"{tag}_shape", "two"], [f"{tag}_t"]),
        helper.make_node("Equal", [f"{tag}_t", "one"], [f"{tag}_single"]),
        helper.make_node("If", [f"{tag}_single"], [f"{tag}_h"], then_branch=squeeze,
                         else_branch=keep),
        helper.make_node("MatMul", [f"{tag}_h", "w"], [f"{tag}_m"]),
        helper.make_node("Mul", [f"{tag}_m", f"{tag}_scale"], [f"{tag}_y"]),
    ]
    inits = [numpy_helper.from_array(np.array([0, 0, 0, 0, 0, pad], np.int64), f"{tag}_pads"),
             numpy_helper.from_array(np.array([step], np.int64), f"{tag}_step"),
             numpy_helper.from_array(np.array(scale, np.float32), f"{tag}_scale")]
    return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"{tag}_y", F, None)],
                             inits)


def padded_rate_switch(path: Path) -> Path:
    """silero VAD's If on the sample rate with its size needs, in small: x [N, 4, L], sr int64
    scalar; sr == 16000: reflect pad 64, one sample in 256 (so 65 <= L <= 192 for one frame);
    else reflect pad 32, one in 128 (33 <= L <= 96). y [N, 3]. Zeros for sr and the check's
    smallest L take the 8 kHz branch at L = 2, where ONNX Runtime's reflect Pad fails."""
    nodes = [helper.make_node("Equal", ["sr", "sixteen"], ["is16"]),
             helper.make_node("If", ["is16"], ["y"],
                              then_branch=_padded_branch("k16", 64, 256, 2.0),
                              else_branch=_padded_branch("k8", 32, 128, 3.0))]
    inits = [numpy_helper.from_array(np.array(16000, np.int64), "sixteen"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1 << 30], np.int64), "big"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2"),
             numpy_helper.from_array(np.array(2, np.int64), "two"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.random.default_rng(3).standard_normal((4, 3))
                                     .astype(np.float32), "w")]
    graph = helper.make_graph(
        nodes, "padded_rate_switch",
        [helper.make_tensor_value_info("x", F, ["N", 4, "L"]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", F, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), path)
    return path
