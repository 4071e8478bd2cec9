"""A small ONNX Loop whose trip count and condition are graph inputs (format 1.8: the VM's
LOOP ... NEXT), with a break condition computed in the body and an If on the iteration number
inside the body (a jump within the loop's body). Shared by tests/export/test_run_time_loops.py
and the C runtime's test.

M int64 scalar, cond bool scalar, x0 float32 [N], lim float32 [1]; carried x [N], s [1]:
    for i in range(M) while cond:
        x = (x * 1.5 if i % 2 == 0 else x * -0.5) + i
        s = s + sum(x)
        cond = s < lim
    outputs x, s
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _scaled(tag: str, scale: float) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Mul", ["x", f"{tag}_k"], [f"{tag}_y"])], tag, [],
        [helper.make_tensor_value_info(f"{tag}_y", F, None)],
        [numpy_helper.from_array(np.array(scale, np.float32), f"{tag}_k")])


def counted_loop(path: Path, symbolic: bool = True) -> Path:
    """The model above, saved at ``path`` (``symbolic``: x's length open, else 3)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mod", ["i", "two"], ["odd"]),
         helper.make_node("Equal", ["odd", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["xm"], then_branch=_scaled("up", 1.5),
                          else_branch=_scaled("down", -0.5)),
         helper.make_node("Add", ["xm", "fi"], ["x2"]),
         helper.make_node("ReduceSum", ["x2"], ["total"], keepdims=1),
         helper.make_node("Add", ["s", "total"], ["s2"]),
         helper.make_node("Less", ["s2", "lim"], ["below"]),
         helper.make_node("Squeeze", ["below"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("x", F, None), helper.make_tensor_value_info("s", F, [1])],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("x2", F, None), helper.make_tensor_value_info("s2", F, [1])],
        [numpy_helper.from_array(np.array(2, np.int64), "two"),
         numpy_helper.from_array(np.array(0, np.int64), "zero")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "x0", "s0"], ["x", "s"], body=body)],
        "counted_loop",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("cond", B, []),
         helper.make_tensor_value_info("x0", F, ["N"] if symbolic else [3]),
         helper.make_tensor_value_info("lim", F, [1])],
        [helper.make_tensor_value_info("x", F, None), helper.make_tensor_value_info("s", F, None)],
        [numpy_helper.from_array(np.zeros(1, np.float32), "s0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def feeds(m: int, cond: bool = True, lim: float = 1e9, n: int = 3, seed: int = 0
          ) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return {"M": np.array(m, np.int64), "cond": np.array(cond), "x0": x,
            "lim": np.array([lim], np.float32)}


def exported(tmp_path_factory, symbolic: bool = True) -> tuple[Path, Path]:
    """(onnx file, bundle) of ``counted_loop``, exported with the command line's defaults
    (golden check on), once per test run (shared with tests/runtime/test_c_runtime.py)."""
    import fcntl
    import os

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / ("counted-loop" + ("" if symbolic else "-static"))
    folder.mkdir(exist_ok=True)
    src, bundle = folder / "counted_loop.onnx", folder / "counted_loop.mlc"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not bundle.exists():
            from mlcpack.packager.api import Options, export

            counted_loop(src, symbolic)
            result = export(src, bundle, Options())
            assert result.check and "golden check passed" in result.check, result.check
    return src, bundle


def instruction_starts(words: list[int]) -> list[int]:
    """The word of each instruction (docs/format.md section 6's encoding)."""
    starts, pc = [], 0
    size = {3: 3, 4: 3, 5: 3, 6: 2, 7: 2, 8: 5, 9: 3}
    while pc < len(words):
        starts.append(pc)
        op = words[pc]
        pc += 3 + words[pc + 2] if op in (1, 2) else size[op]
    return starts


DAMAGE = ("next_elsewhere", "next_forward", "end_elsewhere", "count_float", "number_constant",
          "jump_out")


def damaged_bytecode(bundle: Path, out: Path, change: str) -> Path:
    """``bundle`` with its loop's bytecode changed in place (same length, digest valid):
    "next_elsewhere" (NEXT names the word after its LOOP), "end_elsewhere" (LOOP's end is one
    instruction early), "count_float" (the count is a float32 tensor), "number_constant" (the
    iteration number is a constant row: the VM would write it), "jump_out" (the body's JUMP
    leaves the body), "next_forward" (NEXT names a word after itself)."""
    import struct

    from bundle_parts import payload_spans, read_parts, write_parts

    header, payloads = read_parts(bundle)
    ref = header["vm"]["bytecode"]
    k = payload_spans(header).index((ref["offset"], ref["size"]))
    words = list(struct.unpack(f"<{ref['size'] // 4}i", payloads[k]))
    starts = instruction_starts(words)
    head = next(p for p in starts if words[p] == 8)
    nxt = next(p for p in starts if words[p] == 9)
    tensors = header["tensors"]
    if change == "next_elsewhere":
        words[nxt + 2] = head + 5
    elif change == "end_elsewhere":
        words[head + 4] = starts[starts.index(nxt) - 1]
    elif change == "count_float":
        words[head + 1] = next(i for i, t in enumerate(tensors) if t[3] == "float32")
    elif change == "number_constant":
        words[head + 3] = next(i for i, t in enumerate(tensors) if t[0] == 1)
    elif change == "jump_out":
        jump = next(p for p in starts if words[p] == 6 and head < p < nxt)
        words[jump + 1] = nxt + 3
    elif change == "next_forward":
        words[nxt + 2] = nxt + 3
    else:
        raise ValueError(change)
    payloads[k] = struct.pack(f"<{len(words)}i", *words)
    return write_parts(out, header, payloads)
