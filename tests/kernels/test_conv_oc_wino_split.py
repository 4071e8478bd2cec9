"""Channel-lane Winograd (codegen/conv_oc.py) at 16 lanes: bands and groups chosen for two
threads (``_wino_split_plan``: no band transformed by both threads where an even split exists,
bands of equal work), and V's 16 planes padded where their stride is a multiple of 2 KB (the
input transform's stores shared L1 sets). Plans are checked on any host (export only); the runs
against ONNX Runtime at 1 and 2 threads need AVX-512."""

from __future__ import annotations

import numpy as np
import pytest
from conv_models import avx512_host, conv_feeds, conv_model, export_model

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("c,o,hw,bands", [
    (64, 64, 20, 2),     # 10 tile rows: 2 bands of 5 (were 4 + 4 + 2 in 2 groups: 12 : 8)
    (32, 32, 40, 10),    # one block of channels: 10 bands (were 5, split 2 : 3)
    (128, 128, 10, 1),   # one band of 5 tile rows, its V planes 40 KB apart: padded
])
def test_two_thread_plan_matches_onnxruntime(tmp_path, c, o, hw, bands):
    from mlcpack.runtime import load
    from mlcpack.runtime.describe import describe

    path, bundle = export_model(tmp_path, conv_model(1, c, hw, hw, o, 3, 1, act="silu"),
                                "x86-64-v4")
    (kernel,) = [k for k in describe(bundle)["kernels"] if "conv" in k["name"]]
    assert "Winograd" in kernel["kernel"] and kernel["kernel"].endswith(f" {bands} band(s)")
    if not avx512_host():
        return
    feeds = conv_feeds(1, c, hw, hw, o, 3, 1)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for threads in (1, 2):
        with load(bundle, threads=threads) as m:
            for _ in range(2):
                got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
