"""The golden check's numpy reference runs with numpy's BLAS on one thread
(packager/blas_threads.py): the compile workers have the cores, and OpenBLAS's spinning threads
doubled the reference's CPU time on yolo11n_seg_nms under load. The thread count is restored
after, and the reference's values do not depend on it."""

from __future__ import annotations

import numpy as np
import pytest

from test_golden_advice import _model


def _blas_threads():
    from mlcpack.packager.blas_threads import blas_threads
    if blas_threads() is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS this process can find (needs Linux "
                    "/proc and OpenBLAS, as numpy's wheels bundle)")
    return blas_threads


def test_one_blas_thread_inside_and_the_count_restored_after() -> None:
    from mlcpack.packager.blas_threads import _openblas, one_blas_thread
    threads = _blas_threads()
    set_threads = _openblas()[0]
    before = threads()
    set_threads(2)   # as on a host with more cores than one
    try:
        with one_blas_thread():
            assert threads() == 1
        assert threads() == 2
        with pytest.raises(RuntimeError), one_blas_thread():
            raise RuntimeError
        assert threads() == 2
    finally:
        set_threads(before)


def test_the_reference_runs_on_one_blas_thread_with_the_same_result(tmp_path, monkeypatch
                                                                     ) -> None:
    from mlcpack.frontends.loader import load_model
    from mlcpack.packager import golden
    from mlcpack.packager.blas_threads import _openblas
    from mlcpack.packager.export import ExportOptions
    threads = _blas_threads()
    set_threads = _openblas()[0]
    before = threads()
    monkeypatch.setenv("MLCPACK_NO_ORT", "1")
    loaded = load_model(_model(tmp_path / "m.onnx"), {}, None, None, reference=True)
    seen = []
    real = golden.evaluate_ir
    monkeypatch.setattr(golden, "evaluate_ir", lambda *a, **k: seen.append(threads())
                        or real(*a, **k))
    opts = ExportOptions(check=True, reference=loaded.reference,
                         reference_name=loaded.reference_name, check_advice=False)
    set_threads(2)
    try:
        g = golden.prepare_golden(loaded.modules[None], None, opts)
        assert threads() == 2
        unlimited = golden._prepare_golden(loaded.modules[None], None, opts)
    finally:
        set_threads(before)
    assert seen == [1, 2]
    assert not g.skipped and g.reference == golden.IR_REFERENCE
    assert g.magnitudes == unlimited.magnitudes
    for name, value in g.outputs.items():
        np.testing.assert_array_equal(value, unlimited.outputs[name])
