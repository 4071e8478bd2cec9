"""Convolutions of a batch on several threads: the tasks share an image's planes without a
barrier, so each image needs planes of its own (a task that went on to the next image used to
overwrite rows another task still read: 17 of 200 runs of a batch-2 64x28x28 conv were wrong on
2 threads). Many runs, since a race shows only some of the time."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import build_op_module
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ops import get_op
from mlcpack.runtime import load


@pytest.mark.parametrize("xs,ws,padding", [
    ((2, 64, 28, 28), (64, 64, 3, 3), (1, 1, 1, 1)),
    ((3, 24, 44, 12), (16, 24, 3, 3), (0, 1, 2, 1)),
])
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("packed", [False, True])   # codegen/contraction/'s kernel / conv_oc.py's
def test_batched_conv_on_threads_is_deterministic(tmp_path, monkeypatch, xs, ws, padding,
                                                  threads, packed):
    if not packed:
        import mlcpack.packager.codegen.conv_oc as conv_oc   # CompileOptions.for_targets
        monkeypatch.setattr(conv_oc, "packs_conv_weights", lambda targets: False)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    attrs = dict(strides=(1, 1), padding=padding, dilation=(1, 1), groups=1)
    mod = build_op_module("nn.conv2d", [x, w], [False, True], **attrs)
    want = get_op("nn.conv2d").reference(x, w, **attrs)
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target="host"))
    with load(tmp_path / "m.mlc", threads=threads) as model:
        for _ in range(150):
            np.testing.assert_allclose(model.run({"x0": x})["y"], want, rtol=1e-4, atol=1e-3)
