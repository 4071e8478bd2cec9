"""The ``mlcpack`` command line: export, infer, inspect, verify, bench, keygen.

``infer``, ``inspect`` and ``verify`` import only the runtime, so they work where llvmlite and onnx are not
installed; ``export`` imports the compiler when it runs: it parses its flags into a
``packager/api.py`` ``Options``, calls ``api.export`` (which makes every export decision) and
prints the result. User mistakes print one line on stderr and exit with the error class's code
(``--debug`` shows the traceback).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

import numpy as np
import typer

from ..runtime import commands
from ..runtime.errors import MlcpackError

app = typer.Typer(add_completion=True, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Compile ML models ahead of time into one .mlc bundle, and run bundles.")

EXIT_INTERNAL = commands.EXIT_INTERNAL


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"mlcpack {commands.version('mlcpack')}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_show_version,
                                       is_eager=True, help="print the version and exit")) -> None:
    """Compile ML models ahead of time into one .mlc bundle, and run bundles."""


def _example(text: str) -> str:
    """A help epilog with one example (rich markup off: brackets stay literal)."""
    return f"Example: mlcpack {text}"


def _shared(debug: bool, fn: Callable[[], None]) -> None:
    """Run a body from runtime/commands.py (shared with mlcpack-run) with its exit code."""
    code = commands.guarded(fn, debug=debug, err=lambda line: typer.echo(line, err=True))
    if code:
        raise typer.Exit(code)


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


def _parse_binds(values: list[str]) -> dict:
    """``--bind name=file.npy``: the arrays (read without pickles)."""
    out = {}
    for item in values:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            _fail(f"--bind {item!r} should look like name=file.npy", 2)
        try:
            out[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            _fail(f"--bind {name}: cannot read {path} as a .npy array: "
                  f"{' '.join(str(exc).split())}", 2)
    return out


def _parse_shapes(values: list[str], flag: str = "--input-shape"
                  ) -> dict[str, tuple[int | None, ...]]:
    """``name=1,3,224,224``; a dim that is a name (``N``) stays symbolic (a size variable; the
    batch, with --batch-sizes, when it is the first)."""
    shapes: dict[str, tuple[int | None, ...]] = {}
    for item in values:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            parts = [d.strip() for d in dims.replace("x", ",").split(",")]
            # a name keeps that dim symbolic (the batch, with --batch-sizes, if first)
            shapes[name] = tuple(d if d.isidentifier() else int(d) for d in parts)
        except ValueError:
            _fail(f"{flag} {item!r} should look like name=1,3,224,224 (or name=N,3,224,224 "
                  "with --batch-sizes)", 2)
    return shapes


def _parse_batch_sizes(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        sizes = sorted({int(v) for v in text.split(",")})
        if not sizes or sizes[0] < 1:
            raise ValueError
    except ValueError:
        _fail(f"--batch-sizes {text!r} should be positive integers, e.g. 1,8,32", 2)
    return sizes


def _parse_check_inputs(values: list[str]) -> Optional[dict[str, np.ndarray]]:
    if not values:
        return None
    from ..runtime.errors import InputError

    feeds = {}
    for item in values:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            _fail(f"--check-input {item!r} should look like name=file.npy", 2)
        if not os.path.isfile(file):
            raise InputError(f"--check-input {name}: {file}: no such file")
        try:
            feeds[name] = np.load(file, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"--check-input {name}: {file} is not a readable .npy file "
                             f"({exc})") from None
    return feeds


def _floats(text: Optional[str], flag: str) -> Optional[list[float]]:
    if text is None:
        return None
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        _fail(f"{flag} {text!r} should be comma-separated numbers", 2)
    return None


def _labels(text: Optional[str]) -> Optional[list[str]]:
    """A labels file (one a line) or a,b,c; a name with no comma that is no file is a missing
    file (exit 7), not a model with one class."""
    if text is None:
        return None
    if os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    if "," not in text and (os.sep in text or os.path.splitext(text)[1]):
        commands.check_files([text], "--labels file")
    return [t.strip() for t in text.split(",")]


def _preprocess_options(input_size: Optional[str], color: Optional[str], scale: Optional[float],
                        mean: Optional[str], std: Optional[str], layout: Optional[str]
                        ) -> dict[str, Any]:
    """The image options given, parsed and spelled canonically (``--color XYZ`` or
    ``--layout NWHC`` fail here, exit 2, before the model is read)."""
    from ..runtime.preprocess import PreprocessError, normalize_preprocess

    given: dict[str, Any] = {}
    if input_size:
        try:
            given["size"] = [int(v) for v in input_size.lower().replace("x", ",").split(",")]
        except ValueError:
            _fail(f"--input-size {input_size!r} should look like 224x224", 2)
    for key, value in (("color", color), ("layout", layout), ("scale", scale),
                       ("mean", _floats(mean, "--mean")), ("std", _floats(std, "--std"))):
        if value is not None:
            given[key] = value
    try:
        normalize_preprocess(given)
    except PreprocessError as exc:
        _fail(str(exc), 2)
    return given


@app.command(epilog=_example("export artifacts/cnn.onnx -o cnn.mlc --labels artifacts/labels.txt"))
def export(
    model: Path = typer.Argument(..., help="model.onnx, model.pt2 (torch.export.save), or weights "
                         "(.pkl/.npz)", metavar="MODEL"),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          help="bundle to write (default: MODEL's name .mlc)",
                                          metavar="BUNDLE"),
    arch: Optional[Path] = typer.Option(None, help="architecture spec (.toml/.json) for weights",
                                        metavar="SPEC"),
    target: Optional[str] = typer.Option(None, help="portable (default: one code variant per "
                                         "level from x86-64-v2 up to this CPU's, so the bundle "
                                         "runs on any x86-64-v2 machine and up), host (this "
                                         "CPU's level only: smallest and fastest to export), "
                                         "x86-64-v2/v3/v4, aarch64, aarch64+dotprod, "
                                         "aarch64+bf16; several, "
                                         "comma-separated, make a fat bundle whose runtime "
                                         "picks the best", metavar="LEVELS"),
    input_shape: list[str] = typer.Option([], help="fix an input's shape: name=1,3,224,224",
                                         metavar="NAME=DIMS"),
    labels: Optional[str] = typer.Option(None, help="labels file (one a line) or a,b,c",
                                         metavar="FILE|A,B,C"),
    input_size: Optional[str] = typer.Option(None, help="image size HxW to record, e.g. 28x28",
                                             metavar="HxW"),
    color: Optional[str] = typer.Option(None, help="image colour to record: L or RGB",
                                        metavar="L|RGB"),
    scale: Optional[float] = typer.Option(None, help="pixel scale to record (default 1/255)",
                                          metavar="FLOAT"),
    mean: Optional[str] = typer.Option(None, help="per-channel mean to record, e.g. 0.485,0.456,0.406",
                                       metavar="M1,M2,..."),
    std: Optional[str] = typer.Option(None, help="per-channel std to record",
                                      metavar="S1,S2,..."),
    layout: Optional[str] = typer.Option(None, help="image layout: NCHW, NHWC or flat",
                                         metavar="LAYOUT"),
    sign: Optional[Path] = typer.Option(None, help="Ed25519 private key (PEM) to sign with",
                                       metavar="KEY.pem"),
    batch_sizes: Optional[str] = typer.Option(None, help="compile one plan per batch size, e.g. "
                                              "1,8,32: the bundle runs any batch (padded to the "
                                              "next plan, or in chunks of the largest); the "
                                              "batch is the first dim named in --input-shape "
                                              "(x=N,3,224,224) or symbolic in the ONNX model",
                                              metavar="B1,B2,..."),
    bind: list[str] = typer.Option([], help="make an input a constant with this array "
                                   "(repeatable)", metavar="NAME=FILE.npy"),
    max_shape: list[str] = typer.Option([], help="largest size of each dim of an input with "
                                        "symbolic dims: name=1,3,1280,1280 (larger inputs are "
                                        "refused at run time); with a bound on every symbolic "
                                        "size, memory is planned once, at export, for the bound",
                                        metavar="NAME=DIMS"),
    check: bool = typer.Option(True, "--check/--no-check", help="run the model once with a "
                               "reference and with the bundle, embed the pair, fail on a "
                               "mismatch (default on)"),
    check_input: list[str] = typer.Option([], help="input for the check: name=file.npy "
                                          "(repeatable; default seeded random)",
                                          metavar="NAME=FILE.npy"),
    check_rtol: float = typer.Option(1e-3, help="golden check relative tolerance, times "
                                     "|reference|", metavar="FLOAT"),
    check_atol: float = typer.Option(1e-4, help="golden check absolute tolerance, times the "
                                     "output's largest |value| (never below 64 float32 "
                                     "roundings of the values that computed it)", metavar="FLOAT"),
    check_advice: Optional[bool] = typer.Option(
        None, "--check-advice/--no-check-advice", help="without onnxruntime, also run the ONNX "
        "model with onnx.reference as advice (a disagreement warns, never fails): default only "
        "where it is cheap (it is slow and memory-hungry on large convolution networks)",
        show_default=False),
    quantize: Optional[str] = typer.Option(None, help="int8: static post-training "
                                           "quantization (per-channel weights, per-tensor "
                                           "activations from --calibration)", metavar="int8"),
    calibration: Optional[Path] = typer.Option(None, help="calibration data for --quantize: a "
                                               "folder of images (read with the recorded "
                                               "preprocessing) or .npy files, or one .npy",
                                               metavar="DATA"),
    calibration_method: Optional[str] = typer.Option(
        None, help="activation ranges: percentile (default: 99.99 % of each side), minmax or "
        "entropy (KL-optimal clipping)", metavar="METHOD"),
    precision: str = typer.Option("fp32", help="fp32, or bf16: matmul and convolution "
                                  "weights stored as bfloat16 (half their size) and widened to "
                                  "fp32 in the kernels; layers (or the model) kept fp32 when "
                                  "the error against fp32 passes 1 % of an output's scale "
                                  "(docs/precision.md)",
                                  metavar="fp32|bf16"),
    quantize_guard: bool = typer.Option(True, "--quantize-guard/--no-quantize-guard",
                                        help="with --quantize: keep float the layers the "
                                        "outputs' accuracy on the calibration data needs "
                                        "(default); off: every layer int8 but those faster in "
                                        "float (the report still gives the error against "
                                        "float)"),
    quantize_fallback: bool = typer.Option(False, help="when int8 runs slower than float, "
                                           "write the float bundle instead of failing"),
    cache: bool = typer.Option(True, "--cache/--no-cache", help="reuse compiled kernels from "
                               "the compile cache and store new ones there (MLCPACK_CACHE_DIR, "
                               "default ~/.cache/mlcpack/objects; MLCPACK_CACHE_SIZE caps it, "
                               "default 1G)"),
    timings: bool = typer.Option(False, "--timings", help="print where the export's time went: "
                                 "import, passes, codegen per target, golden check, writing"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Compile a model into one .mlc bundle."""
    def run() -> None:
        from . import api   # the compiler's side: not for verify/infer
        from .codegen import cache as compile_cache
        from .timings import cpu_seconds, process_seconds, timings_table

        started = time.perf_counter()
        startup = process_seconds()   # the interpreter and the imports before this command
        startup_cpu = cpu_seconds()
        try:
            compile_cache.max_bytes(os.environ)
        except compile_cache.CacheSettingError as exc:
            _fail(str(exc), 2)
        out = output or Path(model.stem + ".mlc")
        api.check_paths(model, out, arch, target)   # before the flags that read files
        shapes = _parse_shapes(input_shape)
        sizes = _parse_batch_sizes(batch_sizes)
        # parsed in the order the flags were always checked: the check's inputs, the image
        # options, the labels, then what only the import used (--max-shape, --bind)
        check_inputs = _parse_check_inputs(check_input) if check else None
        given = _preprocess_options(input_size, color, scale, mean, std, layout)
        label_list = _labels(labels)
        options = api.Options(
            arch=arch, target=target, input_shapes=shapes, batch_sizes=sizes,
            max_shapes=_parse_shapes(max_shape, "--max-shape"), bind=_parse_binds(bind),
            check=check, check_inputs=check_inputs, check_rtol=check_rtol,
            check_atol=check_atol, check_advice=check_advice, preprocess=given,
            labels=label_list, sign_key=sign,
            quantize=quantize, calibration=calibration, calibration_method=calibration_method,
            quantize_fallback=quantize_fallback, quantize_guard=quantize_guard,
            precision=precision, cache=cache)
        report = api.export(model, out, options,
                            on_note=lambda line: typer.echo(f"note: {line}", err=True))
        for line in report.quantization:
            typer.echo(line)
        typer.echo(f"wrote {report.path} ({report.bundle_bytes / 1024:.1f} KiB) in "
                   f"{report.seconds:.2f} s: {report.kernels} kernels, {report.instructions} VM "
                   f"instructions, target {','.join(t.name for t in report.targets)}, weights "
                   f"{report.weights_bytes / 1024:.1f} KiB, "
                   + (f"arena {report.arena_bytes} B (tensors {report.intermediate_bytes} B)"
                      if report.arena_bytes or report.intermediate_bytes
                      else f"arena at most {report.bound_bytes} B (planned for the sizes' bounds)"
                      if report.bound_bytes is not None
                      else "memory planned at run time (symbolic shapes)"))
        if report.plan_note:
            typer.echo(f"  {report.plan_note}")
        if report.precision_note:
            typer.echo(report.precision_note)
        from .codegen.target import runs_on
        typer.echo(f"  runs on {runs_on(report.targets)}")
        for p in report.plans:
            typer.echo(f"  plan batch {p['batch']}: arena {p['arena_bytes']} B, {p['kernels']} "
                       f"kernels, {p['instructions']} VM instructions, code {p['code_bytes']} B"
                       + (" (runs that exact batch; the symbolic plan runs the others)"
                          if report.specialized else ""))
        typer.echo(report.check or "golden check: off (--no-check)")
        if timings:
            stages = {"start-up": startup} if startup is not None else {}
            stages.update({"import": report.import_seconds, **report.stages})
            cpu = {"start-up": startup_cpu, **report.stage_cpu}   # import's is in "other"
            typer.echo(timings_table(stages, report.compiles,
                                     time.perf_counter() - started + (startup or 0.0), cpu,
                                     cpu_seconds(), report.compile_phases))
        for line in report.compile_warnings + report.check_warnings:
            typer.echo(f"warning: {line}", err=True)

    _guarded(debug, run)


@app.command(epilog=_example(commands.INFER_EXAMPLE))
def infer(
    bundle: Path = typer.Argument(..., help="the .mlc bundle", metavar="BUNDLE"),
    inputs: list[Path] = typer.Argument(..., help="image (PNG/JPEG) or .npy tensor per input",
                                        metavar="INPUT"),
    top_k: int = typer.Option(5, "--top-k", "-k", help="how many classes to print (>= 1)",
                              metavar="K"),
    as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON (a top-k "
                                 "list per row under \"rows\")"),
    threads: Optional[int] = typer.Option(None, help="threads (default MLCPACK_NUM_THREADS or 1)",
                                          metavar="N"),
    trusted_key: list[Path] = typer.Option([], help="run only if signed by this Ed25519 "
                                                    "public key (PEM); repeatable",
                                           metavar="KEY.pub"),
    strict: bool = typer.Option(False, "--strict", help=commands.STRICT_HELP),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help=commands.OUTPUT_HELP,
                                          metavar="FILE"),
    fail_fast: bool = typer.Option(False, "--fail-fast", help=commands.FAIL_FAST_HELP),
    resume: bool = typer.Option(False, "--resume", help=commands.RESUME_HELP),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help=commands.BATCH_SIZE_HELP,
                                             metavar="N"),
    ray: Optional[str] = typer.Option(None, "--ray", help=commands.RAY_HELP + " (also "
                                      "spelled --ray local)", metavar="ADDRESS"),
    workers: Optional[int] = typer.Option(None, "--workers", help=commands.WORKERS_HELP,
                                          metavar="N"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Run a bundle on an input and print the top-k classes (one block per row of a batch)."""
    _shared(debug, lambda: commands.infer(bundle, inputs, top_k=top_k, as_json=as_json,
                                          threads=threads, trusted_keys=trusted_key, strict=strict,
                                          echo=typer.echo, output=output, fail_fast=fail_fast,
                                          resume=resume, batch_size=batch_size,
                                          ray=None if ray is None else
                                          ("" if ray == "local" else ray), workers=workers))


@app.command(epilog=_example(commands.INSPECT_EXAMPLE))
def inspect(
    bundle: Path = typer.Argument(..., help="the .mlc bundle", metavar="BUNDLE"),
    ir: bool = typer.Option(False, "--ir", help="print the IRModule the bundle was built from"),
    as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Show a bundle's inputs, target, kernels, weights, memory plan and versions."""
    _shared(debug, lambda: commands.inspect(bundle, ir=ir, as_json=as_json, echo=typer.echo))


@app.command(epilog=_example(commands.BENCH_EXAMPLE))
def bench(
    bundle: Path = typer.Argument(..., help="the .mlc bundle", metavar="BUNDLE"),
    runs: Optional[int] = typer.Option(None, help="timed runs, >= 1 (default: as many as fit "
                                       "in --budget)", metavar="N"),
    threads: int = typer.Option(1, help="threads for parallel kernels (>= 1)", metavar="N"),
    budget: float = typer.Option(1.0, help="seconds of timed runs when --runs is not given",
                                 metavar="SECONDS"),
    as_json: bool = typer.Option(False, "--json", help="print machine-readable JSON"),
    profile: bool = typer.Option(False, "--profile", help="time every kernel: mean/min us, share, "
                                 "GFLOP/s and the source ONNX nodes, slowest first"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="write a Chrome trace-event JSON "
                                         "(Perfetto, chrome://tracing); implies --profile",
                                         metavar="FILE"),
    top: int = typer.Option(30, "--top", help="kernels in the --profile table (0: all)",
                            metavar="N"),
    shape: Optional[List[str]] = typer.Option(
        None, "--shape", help="an input's shape, NAME=DIMS (repeatable): the sizes a bundle "
        "with symbolic shapes is timed at (default: every size variable 1)",
        metavar="NAME=DIMS"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Time a bundle on random inputs: load, first inference, then p50/p90/p99 latency
    (--profile: per kernel)."""
    _shared(debug, lambda: commands.bench(bundle, runs=runs, threads=threads, budget_s=budget,
                                          as_json=as_json, profile=profile, trace=trace,
                                          top=top, echo=typer.echo, shapes=shape))


@app.command(epilog=_example(commands.VERIFY_EXAMPLE))
def verify(
    bundle: Path = typer.Argument(..., help="the .mlc bundle", metavar="BUNDLE"),
    rtol: Optional[float] = typer.Option(None, help="override the recorded relative tolerance"),
    atol: Optional[float] = typer.Option(None, help="override the recorded absolute tolerance"),
    threads: Optional[int] = typer.Option(None, help="threads (default MLCPACK_NUM_THREADS or 1)",
                                          metavar="N"),
    debug: bool = typer.Option(False, help="show tracebacks"),
) -> None:
    """Re-run the golden input embedded at export with the runtime alone; PASS (exit 0) or
    FAIL (exit 13; 14 when the bundle has no golden data)."""
    _shared(debug, lambda: commands.verify(bundle, rtol=rtol, atol=atol, threads=threads,
                                           echo=typer.echo))


@app.command(epilog=_example("keygen app.pem   (then: export m.onnx --sign app.pem)"))
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


def bare_ray(argv: list[str]) -> list[str]:
    """``argv`` with a bare ``--ray`` (no ADDRESS: the next word is an option, or none) spelled
    ``--ray local``: typer options always take a value, and ``mlcpack-run``'s argparse takes
    the bare form as its help says, so both command lines accept the same words."""
    out: list[str] = []
    for i, word in enumerate(argv):
        out.append(word)
        if word == "--ray" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append("local")
    return out


def main() -> None:
    argv = bare_ray(sys.argv[1:])
    if argv == sys.argv[1:]:   # typer reads sys.argv itself (shell completion needs that)
        app(prog_name="mlcpack")
    else:
        app(prog_name="mlcpack", args=argv)


if __name__ == "__main__":
    sys.exit(main())
