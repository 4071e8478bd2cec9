"""The ``mlcpack`` command line: export, infer, inspect.

``infer`` and ``inspect`` import only the runtime, so they work where llvmlite and onnx are not
installed; ``export`` imports the compiler when it runs. User mistakes print one line on stderr
and exit with the error class's code (``--debug`` shows the traceback).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import typer

from ..runtime.errors import MlcpackError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Compile ML models ahead of time into one .mlc bundle, and run bundles.")

EXIT_INTERNAL = 70


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _guarded(debug: bool, fn: Callable[[], Any]) -> Any:
    """Run ``fn``; turn expected errors into one line and an exit code."""
    try:
        return fn()
    except typer.Exit:
        raise
    except MlcpackError as exc:
        if debug:
            raise
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:  # a bug in mlcpack, not the user's fault: say so
        if debug:
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc} (run again with --debug for the "
              "traceback, and please report it)", EXIT_INTERNAL)


def _parse_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in values:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.replace("x", ",").split(","))
        except ValueError:
            _fail(f"--input-shape {item!r} should look like name=1,3,224,224", 2)
    return shapes


def _floats(text: Optional[str], flag: str) -> Optional[list[float]]:
    if text is None:
        return None
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        _fail(f"{flag} {text!r} should be comma-separated numbers", 2)
    return None


def _labels(text: Optional[str]) -> Optional[list[str]]:
    if text is None:
        return None
    if os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    return [t.strip() for t in text.split(",")]


def _build_module(model: Path, arch: Optional[Path], shapes: dict[str, tuple[int, ...]]):
    suffix = model.suffix.lower()
    if not model.exists():
        _fail(f"{model}: no such file", 3)
    if model.is_dir():
        _fail(f"{model} is a directory; give a .onnx, .pkl or .npz file", 3)
    if suffix == ".onnx":
        from ..frontends.onnx import import_onnx
        mod, _ = import_onnx(str(model), input_shapes=shapes or None)
        return mod
    if suffix in (".pkl", ".pickle", ".npz"):
        from ..frontends.arch import build_from_spec, infer_mlp_spec, read_spec
        from ..frontends.weights import load_weights
        weights = load_weights(model)
        spec = read_spec(arch) if arch else infer_mlp_spec(weights)
        shape = next(iter(shapes.values())) if shapes else None
        return build_from_spec(spec, weights, shape)
    _fail(f"{model}: unknown model type {suffix or '(no suffix)'}; mlcpack exports .onnx files "
          "and pickled weights (.pkl, .npz)", 2)


@app.command()
def export(
    model: Path = typer.Argument(..., help="model.onnx, or weights (.pkl/.npz)"),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          help="bundle to write (default: MODEL's name .mlc)"),
    arch: Optional[Path] = typer.Option(None, help="architecture spec (.toml/.json) for weights"),
    target: Optional[str] = typer.Option(None, help="host (default), x86-64-v2/v3/v4, aarch64, "
                                         "aarch64+dotprod; several, comma-separated, make a fat "
                                         "bundle whose runtime picks the best"),
    input_shape: list[str] = typer.Option([], help="fix an input's shape: name=1,3,224,224"),
    labels: Optional[str] = typer.Option(None, help="labels file (one a line) or a,b,c"),
    input_size: Optional[str] = typer.Option(None, help="image size HxW to record, e.g. 28x28"),
    color: Optional[str] = typer.Option(None, help="image colour to record: L or RGB"),
    scale: Optional[float] = typer.Option(None, help="pixel scale to record (default 1/255)"),
    mean: Optional[str] = typer.Option(None, help="per-channel mean to record, e.g. 0.485,0.456,0.406"),
    std: Optional[str] = typer.Option(None, help="per-channel std to record"),
    layout: Optional[str] = typer.Option(None, help="image layout: NCHW, NHWC or flat"),
    sign: Optional[Path] = typer.Option(None, help="Ed25519 private key (PEM) to sign with"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Compile a model into one .mlc bundle."""
    def run() -> None:
        from ..runtime.model import TensorSpec
        from ..runtime.preprocess import default_preprocess
        from .export import ExportOptions, export_module, file_sha256

        shapes = _parse_shapes(input_shape)
        out = output or Path(model.stem + ".mlc")
        mod = _build_module(model, arch, shapes)
        first = mod.main.params[0]
        pre = default_preprocess(TensorSpec(first.name, first.type.shape, first.type.dtype, 0))
        if any(v is not None for v in (input_size, color, scale, mean, std, layout)):
            pre = dict(pre or {"scale": 1 / 255, "mean": [0.0], "std": [1.0], "layout": "NCHW",
                               "color": "RGB"})
            if input_size:
                try:
                    pre["size"] = [int(v) for v in input_size.lower().replace("x", ",").split(",")]
                except ValueError:
                    _fail(f"--input-size {input_size!r} should look like 224x224", 2)
            for key, value in (("color", color), ("layout", layout), ("scale", scale),
                               ("mean", _floats(mean, "--mean")), ("std", _floats(std, "--std"))):
                if value is not None:
                    pre[key] = value
            if "size" not in pre:
                _fail("--input-size is needed to record image preprocessing for this input", 2)
        opts = ExportOptions(target=target, preprocess=pre, labels=_labels(labels),
                             model_name=model.stem, source=model.name,
                             source_sha256=file_sha256(model), sign_key=sign)
        report = export_module(mod, out, opts)
        typer.echo(f"wrote {report.path} ({report.bundle_bytes / 1024:.1f} KiB) in "
                   f"{report.seconds:.2f} s: {report.kernels} kernels, {report.instructions} VM "
                   f"instructions, target {','.join(t.name for t in report.targets)}, weights "
                   f"{report.weights_bytes / 1024:.1f} KiB, arena {report.arena_bytes} B "
                   f"(tensors {report.intermediate_bytes} B)")

    _guarded(debug, run)


def _probabilities(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.float64)
    if v.min() >= 0 and abs(v.sum() - 1) < 1e-3:
        return v
    e = np.exp(v - v.max())
    return e / e.sum()


@app.command()
def infer(
    bundle: Path = typer.Argument(..., help="the .mlc bundle"),
    inputs: list[Path] = typer.Argument(..., help="image (PNG/JPEG) or .npy tensor per input"),
    top_k: int = typer.Option(5, "--top-k", "-k", help="how many classes to print"),
    as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
    threads: Optional[int] = typer.Option(None, help="threads (default MLCPACK_NUM_THREADS or 1)"),
    trusted_key: list[Path] = typer.Option([], help="run only if signed by this Ed25519 "
                                                    "public key (PEM); repeatable"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Run a bundle on an input and print the top-k classes."""
    def run() -> None:
        from ..runtime import load
        from ..runtime.errors import InputError
        from ..runtime.preprocess import load_input

        with load(bundle, threads=threads, trusted_keys=trusted_key or None) as model:
            if len(inputs) != len(model.inputs):
                raise InputError(f"{bundle.name} takes {len(model.inputs)} input(s) "
                                 f"({', '.join(s.name for s in model.inputs)}); got {len(inputs)}")
            feeds = {s.name: load_input(p, s, model.preprocess)
                     for s, p in zip(model.inputs, inputs)}
            outputs = model.run(feeds)
            first = outputs[model.outputs[0].name].reshape(-1)
            probs = _probabilities(first)
            order = np.argsort(-first, kind="stable")[:max(0, top_k)]
            labels = model.labels or []
            top = [{"index": int(i), "label": labels[i] if i < len(labels) else str(int(i)),
                    "score": float(first[i]), "probability": float(probs[i])} for i in order]
        if as_json:
            typer.echo(json.dumps({"bundle": str(bundle), "inputs": [str(p) for p in inputs],
                                   "outputs": {k: v.tolist() for k, v in outputs.items()},
                                   "top_k": top}))
            return
        if top:
            typer.echo(f"{inputs[0].name}: {top[0]['label']}")
        for rank, t in enumerate(top, 1):
            typer.echo(f"  {rank}. {t['label']:<12} score {t['score']:>10.4f}   "
                       f"p {t['probability']:.4f}")

    _guarded(debug, run)


@app.command()
def inspect(
    bundle: Path = typer.Argument(..., help="the .mlc bundle"),
    ir: bool = typer.Option(False, "--ir", help="print the IRModule the bundle was built from"),
    as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Show a bundle's inputs, target, kernels, weights, memory plan and versions."""
    def run() -> None:
        from ..runtime.describe import describe, describe_text, ir_text

        if ir:
            typer.echo(ir_text(bundle), nl=False)
            return
        info = describe(bundle)
        typer.echo(json.dumps(info, indent=2) if as_json else describe_text(info))

    _guarded(debug, run)


@app.command()
def bench(
    bundle: Path = typer.Argument(..., help="the .mlc bundle"),
    runs: Optional[int] = typer.Option(None, help="timed runs (default: about one second)"),
    threads: int = typer.Option(1, help="threads for parallel kernels"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Time a bundle on random inputs: load, first inference, steady-state latency."""
    def run() -> None:
        from ..runtime.bench import bench as time_bundle

        t = time_bundle(bundle, runs, threads)
        typer.echo(f"{bundle.name}: load {t.load_ms:.2f} ms, first {t.first_ms:.2f} ms, "
                   f"median {t.median_us:.1f} us, min {t.min_us:.1f} us ({t.runs} runs, "
                   f"{threads} thread{'s' if threads > 1 else ''})")

    _guarded(debug, run)


@app.command()
def keygen(
    key: Path = typer.Argument(..., help="private key file to create (its public key goes to KEY.pub)"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Make an Ed25519 key pair for `export --sign KEY` and `infer --trusted-key KEY.pub`."""
    def run() -> None:
        from .signing import generate_key

        private, public, fp = generate_key(key)
        typer.echo(f"wrote {private} (private, keep it secret) and {public} (public); "
                   f"key {fp}")

    _guarded(debug, run)


def main() -> None:
    app(prog_name="mlcpack")


if __name__ == "__main__":
    sys.exit(main())
