"""Every Python or shell code block in README.md and docs/*.md runs as written (issue 14, item 7),
in order, in one scratch folder that holds the files the examples name.

A block that cannot run here (it installs packages from the network, needs another machine, or
runs for minutes) has the marker line ``<!-- docs-test: skip (why) -->`` right above its fence;
the test honours it, requires the reason, and counts what ran and what was skipped. Blocks in
other languages (``text`` output, ``toml``, diagrams without a language) are not code to run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conftest import ARTIFACTS, MLP_PICKLE, ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
PYTHON = {"python", "py"}
SKIP = re.compile(r"^\s*<!-- docs-test: skip \((?P<why>[^)]+)\) -->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")


@dataclass
class Block:
    doc: str
    line: int          # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None   # the marker's reason

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    """The fenced blocks of every document, in order (indented fences too)."""
    out = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            start, indent = i, len(m["indent"])
            body = []
            i += 1
            while i < len(lines) and not FENCE.match(lines[i]):
                body.append(lines[i][indent:])
                i += 1
            marker = SKIP.match(lines[start - 1]) if start else None
            out.append(Block(doc.relative_to(ROOT).as_posix(), start + 1, m["lang"].lower(),
                             "\n".join(body) + "\n", marker["why"] if marker else None))
            i += 1
    return out


def _tiny_onnx(path: Path, batch: int | str) -> None:
    """x [batch, 3, 224, 224] -> global average pool -> 3x10 linear -> softmax: the stand-in
    for "model.onnx" (an RGB image classifier) in the examples."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((3, 10)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
         helper.make_node("Flatten", ["p"], ["f"]),
         helper.make_node("MatMul", ["f", "w"], ["z"]),
         helper.make_node("Softmax", ["z"], ["y"], axis=1)],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 224, 224])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


NET_TOML = """\
input = { name = "x", shape = [1, 784] }
output = "logits"
[[layers]]
op = "linear"
weight = "w0"
bias = "b0"
[[layers]]
op = "library"
func = "myapp.swish"
[[layers]]
op = "linear"
weight = "w1"
bias = "b1"
"""


def _setup(folder: Path, env: dict[str, str]) -> None:
    """The files the examples name: the demo artifacts, stand-ins for "your model"
    (model.onnx fixed at 1x3x224x224, dynamic.onnx with a symbolic batch, params.pkl/mlp.pkl the
    demo MLP's weights, net.toml a spec calling the library function the README registers),
    inputs (image.png, digit.png, x.npy, rows.npy) and the bundles the examples run before any
    example exports them (mlp.mlc, model.mlc, batch.mlc)."""
    from PIL import Image

    (folder / "artifacts").symlink_to(ARTIFACTS)
    shutil.copytree(ROOT / "runtime", folder / "runtime",  # docs/edge.md copies it into an app
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("params.pkl", "mlp.pkl"):
        shutil.copy(MLP_PICKLE, folder / name)
    (folder / "net.toml").write_text(NET_TOML)
    _tiny_onnx(folder / "model.onnx", 1)
    _tiny_onnx(folder / "dynamic.onnx", "N")
    rng = np.random.default_rng(0)
    Image.fromarray((rng.random((224, 224, 3)) * 255).astype(np.uint8)).save(folder / "image.png")
    shutil.copy(ARTIFACTS / "samples" / "digit_3.png", folder / "digit.png")
    np.save(folder / "x.npy", rng.random((1, 3, 224, 224), dtype=np.float32))
    np.save(folder / "rows.npy", rng.random((3, 784), dtype=np.float32))
    exe = str(Path(sys.executable).parent / "mlcpack")
    for args in (["artifacts/mlp_params.pkl", "-o", "mlp.mlc", "--labels", "artifacts/labels.txt"],
                 ["model.onnx", "-o", "model.mlc"],
                 ["mlp.pkl", "-o", "batch.mlc", "--batch-sizes", "1,8"]):
        proc = subprocess.run([exe, "export", *args, "--target", "host", "--no-check"],
                              cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr


def test_every_block_is_code_or_skipped_with_a_reason() -> None:
    found = blocks()
    assert len(found) >= 20
    for b in found:
        if b.skip is not None:
            assert b.lang in SHELL | PYTHON, f"{b.where}: a skip marker on a {b.lang!r} block"
            assert len(b.skip) >= 10, f"{b.where}: say why it cannot run here"


def test_documented_examples_run_as_written(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ)
    for key in ("MLCPACK_CPU_FEATURES", "MLCPACK_CPU_ARCH", "MLCPACK_NUM_THREADS"):
        env.pop(key, None)
    # `mlcpack` and `python` as a user's shell finds them; HOME apart, for --install-completion
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               HOME=str(home), SHELL="/bin/bash", PYTHONDONTWRITEBYTECODE="1")
    _setup(work, env)
    ran, skipped, failures = [], [], []
    for b in blocks():
        if b.lang not in SHELL | PYTHON:
            continue
        if b.skip is not None:
            skipped.append(b.where)
            continue
        if b.lang in SHELL:
            # ":" last: bash would exec the last command in place of itself, and then
            # `mlcpack --install-completion` finds no shell among its parents to install for
            cmd = ["bash", "-e", "-o", "pipefail", "-c", b.code + ":\n"]
        else:
            cmd = [sys.executable, "-c", b.code]
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        ran.append(b.where)
        if proc.returncode != 0 or "Traceback" in proc.stderr:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            failures.append(f"{b.where} ({b.lang}) exit {proc.returncode}: {' | '.join(tail)}")
    print(f"docs examples: {len(ran)} blocks ran, {len(skipped)} skipped by marker: "
          f"{', '.join(skipped)}")
    assert not failures, "\n".join(failures)
    # 15 blocks ran and 5 were skipped when this was written (about 1 min of CPU time, most of it
    # the exports; several times that on a loaded machine); fewer ran means a marker too many.
    # The sixth skip is docs/quantization.md's calibrated export, which
    # tests/precision/test_quantize_at_export.py runs; the seventh the README's install of torch's CPU build
    # (tests/house/test_packaging_extras.py checks its line). 22 ran and 7 were skipped on 2026-12-06.
    assert len(ran) >= 15 and len(skipped) <= 7, (ran, skipped)
