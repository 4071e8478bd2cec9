"""The bodies of the commands that only need the runtime: ``infer``, ``inspect``, ``verify`` and
``bench``. Both command lines call them, ``mlcpack`` (typer, with the compiler) and ``mlcpack-run``
(argparse, ``runtime/cli.py``, for devices without the compiler), so their options, output and
exit codes cannot drift apart.

Each body validates its options first (a ``UsageError``, exit 2), writes its output through
``echo`` and raises an ``MlcpackError`` subclass for every refusal; ``guarded`` turns those into
one line on stderr and the class's exit code.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from .errors import InputError, MlcpackError, UsageError  # noqa: F401 (UsageError: re-exported)
from .errors import check_files  # noqa: F401 (re-exported: the compiler's command line uses it)
from .profile import Profile, sources_text
from .results import _probabilities, is_vector, summary_of, summary_text, top_k_of  # noqa: F401

EXIT_INTERNAL = 70

Echo = Callable[[str], None]

# One summary and one example per command, shown by both command lines' help.
INFER_HELP = "Run a bundle on an input and print the top-k classes (one block per row of a batch)."
INFER_EXAMPLE = "infer model.mlc digit.png -k 3"
OUTPUT_HELP = ("write one result per input to FILE: .jsonl (path + top_k, or raw outputs), .csv "
               "(path, label1, score1, ..., error) or .npz (raw outputs stacked, path, error)")
FAIL_FAST_HELP = "many inputs: stop at the first input that fails (default: report it, go on)"
RESUME_HELP = ("go on from --output FILE (.jsonl/.csv): skip the inputs it already has results "
               "for")
BATCH_SIZE_HELP = "many inputs: inputs per run (default: the bundle's largest batch plan, or 1)"
WORKERS_HELP = "with --ray: how many actors (default: the cluster's CPUs)"
RAY_HELP = ("run on Ray (pip install 'mlcpack[ray]'): the cluster at ADDRESS, or a local one "
            "when given without ADDRESS")
STRICT_HELP = ("refuse (exit 7) an image whose size or colour differs from the bundle's recorded "
               "preprocessing, instead of resizing/converting it with a note")
INSPECT_HELP = "Show a bundle's inputs, target, kernels, weights, memory plan and versions."
INSPECT_EXAMPLE = "inspect model.mlc --json"
VERIFY_HELP = ("Re-run the golden input embedded at export with the runtime alone; PASS (exit 0) "
               "or FAIL (exit 13; 14 when the bundle has no golden data).")
VERIFY_EXAMPLE = "verify model.mlc"
BENCH_HELP = ("Time a bundle on random inputs: load, first inference, then p50/p90/p99 "
              "latency.")
BENCH_EXAMPLE = "bench model.mlc --threads 2 --runs 200"


def _ray_runner():
    from .distributed import run_paths

    return run_paths


def _stdout(text: str) -> None:
    print(text, flush=True)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def guarded(fn: Callable[[], Any], debug: bool = False, err: Echo = _stderr) -> int:
    """Run ``fn``; return 0, or print one ``error: ...`` line with ``err`` and return the error
    class's exit code (70 for a bug in mlcpack). With ``debug`` the traceback is shown instead."""
    try:
        fn()
        return 0
    except MlcpackError as exc:
        if debug:
            raise
        err(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        err("error: interrupted")
        return 130
    except BrokenPipeError:  # `mlcpack-run infer ... | head`: the reader left, not an error
        return 0
    except Exception as exc:  # a bug in mlcpack, not the user's fault: say so
        if debug:
            raise
        err(f"error: internal error: {type(exc).__name__}: {exc} (run again with --debug for "
            "the traceback, and please report it)")
        return EXIT_INTERNAL


def version(distribution: str = "mlcpack-runtime") -> str:
    """The installed version of ``distribution`` (the runtime ships in both distributions)."""
    from importlib import metadata

    for name in (distribution, "mlcpack-runtime", "mlcpack"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown (not installed; running from a copy of runtime/)"


# ---- option checks --------------------------------------------------------------------------------

def check_at_least(value: int | float | None, low: int | float, flag: str) -> None:
    """``--runs 0`` and friends: a one-line usage error, never a silent clamp."""
    if value is not None and not value >= low:
        raise UsageError(f"{flag} must be >= {low:g}, got {value:g}")


# ---- infer -----------------------------------------------------------------------------------------

def result_rows(model: Any, feeds: dict[str, np.ndarray], first: np.ndarray,
                image: bool = False) -> tuple[np.ndarray, bool]:
    """The first output as (rows, values per row), and whether the input was a batch.

    A dynamic-batch bundle's outputs have the batch first, so each row is one result; so does a
    fixed-shape output whose first dim is the first input's (> 1). Anything else is one result
    (the whole output, flattened): ranking the scores of two images together gave labels past
    the last class. One ``image`` is never a batch: it prints as the same one result whatever
    kind of bundle runs it."""
    name = model.outputs[0].name
    if model.batch is not None and name in model.batch.outputs:
        return first.reshape(first.shape[0], -1), not (image and first.shape[0] == 1)
    x = feeds[model.inputs[0].name]
    if first.ndim >= 2 and np.ndim(x) >= 1 and first.shape[0] == np.shape(x)[0] > 1:
        return first.reshape(first.shape[0], -1), True
    return first.reshape(1, -1), False


def _rows_text(name: str, rows: list[list[dict[str, Any]]], batched: bool) -> list[str]:
    lines = []
    for r, top in enumerate(rows):
        where = f"{name}[{r}]" if batched else name
        if top and not np.isfinite(top[0]["score"]):  # never a class chosen from NaN/inf
            lines.append(f"{where}: no result (its scores are not finite)")
        elif top:
            lines.append(f"{where}: {top[0]['label']}")
        for rank, t in enumerate(top, 1):
            lines.append(f"  {rank}. {t['label']:<12} score {t['score']:>10.4f}   "
                         f"p {t['probability']:.4f}")
    return lines


def _run(model: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``model.run``; a batch given to a fixed-shape bundle is refused with the way out."""
    try:
        return model.run(feeds)
    except InputError as exc:
        rows = [s for s in model.inputs if model.batch is None and np.ndim(feeds[s.name]) ==
                len(s.shape) > 1 and np.shape(feeds[s.name])[1:] == s.shape[1:]
                and np.shape(feeds[s.name])[0] != s.shape[0]]
        if not rows:
            raise
        raise InputError(f"{exc}; to run batches, export with --batch-sizes, e.g. "
                         "--batch-sizes 1,8,32") from None


def infer(bundle: str | os.PathLike, inputs: Sequence[str | os.PathLike], *, top_k: int = 5,
          as_json: bool = False, threads: int | None = None,
          trusted_keys: Sequence[str | os.PathLike] = (), echo: Echo = _stdout,
          warn: Echo = _stderr, strict: bool = False, output: str | os.PathLike | None = None,
          fail_fast: bool = False, resume: bool = False, ray: str | None = None,
          workers: int | None = None, batch_size: int | None = None,
          progress: bool | None = None) -> None:
    """Run ``bundle`` on ``inputs`` (one image or .npy per model input) and print the top-k
    classes of the first output: one block per row when the input is a batch. An image that
    the recorded preprocessing resizes or converts gets a ``note:`` line through ``warn``
    (``strict``: refused, exit 7); non-finite outputs a ``warning:`` line (and, with
    ``as_json``, a count under "non_finite").

    Many inputs (folders, globs, or any of ``output``, ``resume``, ``ray``):
    ``many.infer_many``, one result per input in input order."""
    from .many import infer_many, is_many
    from .model import load
    from .preprocess import load_input

    check_at_least(top_k, 1, "-k/--top-k")
    check_at_least(threads, 1, "--threads")
    check_at_least(workers, 1, "--workers")
    check_at_least(batch_size, 1, "--batch-size")
    if not inputs:
        raise UsageError("give one input file (image or .npy) per model input")
    check_files(trusted_keys, "trusted public key")
    many = output is not None or resume or ray is not None or is_many(inputs)
    if not many:
        check_files(inputs, "input file")
    if (workers is not None or fail_fast) and not many and len(inputs) == 1:
        raise UsageError("--workers and --fail-fast apply to many inputs (folders, globs, "
                         "--output)")
    if many:
        infer_many(bundle, inputs, output=None if output is None else os.fspath(output),
                   top_k=top_k, threads=threads, trusted_keys=trusted_keys, strict=strict,
                   fail_fast=fail_fast, resume=resume, batch_size=batch_size, ray=ray,
                   workers=workers, progress=progress, echo=echo, warn=warn,
                   ray_runner=_ray_runner() if ray is not None else None)
        return
    with load(bundle, threads=threads, trusted_keys=list(trusted_keys) or None) as model:
        if len(inputs) != len(model.inputs):
            hint = ("; to run it on each file, give a folder or a quoted glob, or --output "
                    "results.jsonl") if len(model.inputs) == 1 else ""
            raise InputError(f"{model.name} takes {len(model.inputs)} input(s) "
                             f"({', '.join(s.name for s in model.inputs)}); got {len(inputs)}"
                             + hint)
        feeds = {s.name: load_input(p, s, model.preprocess, note=warn, strict=strict, model=model)
                 for s, p in zip(model.inputs, inputs)}
        outputs = _run(model, feeds)
        first = outputs[model.outputs[0].name]
        image = not os.fspath(inputs[0]).lower().endswith(".npy")
        rows, batched = result_rows(model, feeds, first, image)
        tops = [top_k_of(row, top_k, model.labels) for row in rows]
    bad = int(np.size(first) - np.count_nonzero(np.isfinite(first))) if first.dtype.kind == "f" \
        else 0
    if bad:
        warn(f"warning: output {model.outputs[0].name!r} has {bad} non-finite value(s) "
             "(NaN or inf): check the input")
    # a map, or several outputs (a box and a score, as `is_classifier` says for many inputs),
    # not one vector of scores: summarize each
    if not model.labels and (len(outputs) > 1 or not is_vector(first.shape)):
        axis = 3 if _layout(model) == "NHWC" else 1   # a channels-last model's maps too
        summaries = [summary_of(k, v, axis) for k, v in outputs.items()]
        name = os.path.basename(os.fspath(inputs[0]))
        if as_json:
            echo(json.dumps({"bundle": os.fspath(bundle),
                             "inputs": [os.fspath(p) for p in inputs],
                             "outputs": {k: v.tolist() for k, v in outputs.items()},
                             "summary": summaries, "non_finite": bad}))
        else:
            echo("\n".join([f"{name}: {len(summaries)} output(s), not class scores "
                             "(--json or -o FILE.npz for the values)"]
                            + [summary_text(d) for d in summaries]))
        return
    if as_json:
        doc: dict[str, Any] = {"bundle": os.fspath(bundle), "inputs": [os.fspath(p) for p in inputs],
                               "outputs": {k: v.tolist() for k, v in outputs.items()},
                               "batch": len(tops) if batched else None, "rows": tops,
                               "non_finite": bad}
        if not batched:
            doc["top_k"] = tops[0]
        echo(json.dumps(doc))
        return
    echo("\n".join(_rows_text(os.path.basename(os.fspath(inputs[0])), tops, batched)))


def _layout(model: Any) -> str | None:
    """The layout the bundle's first input is read in: the recorded preprocessing's, else the
    one ``load_input`` guesses from its shape (``preprocess.default_preprocess``)."""
    from .preprocess import default_preprocess

    pre = model.preprocess or (default_preprocess(model.inputs[0]) if model.inputs else None)
    return None if not pre else str(pre.get("layout", "NCHW")).upper()


# ---- inspect ---------------------------------------------------------------------------------------

def inspect(bundle: str | os.PathLike, *, ir: bool = False, as_json: bool = False,
            echo: Echo = _stdout) -> None:
    """Print a bundle's summary (inputs, target, kernels, weights, plan, versions), or with
    ``ir`` the IRModule text it was built from; ``as_json`` for either."""
    from .describe import describe, describe_text, ir_text

    if ir:
        text = ir_text(bundle)
        if as_json:
            echo(json.dumps({"file": os.fspath(bundle), "ir": text}))
        else:
            echo(text.rstrip("\n"))
        return
    info = describe(bundle)
    echo(json.dumps(info, indent=2) if as_json else describe_text(info))


# ---- verify ----------------------------------------------------------------------------------------

def verify(bundle: str | os.PathLike, *, rtol: float | None = None, atol: float | None = None,
           threads: int | None = None, echo: Echo = _stdout) -> None:
    """Re-run the golden pair embedded at export; print PASS, or FAIL and raise
    ``GoldenMismatchError`` (exit 13; 14 when the bundle has no golden data)."""
    from .selftest import GoldenMismatchError, verify as verify_bundle

    check_at_least(rtol, 0, "--rtol")
    check_at_least(atol, 0, "--atol")
    check_at_least(threads, 1, "--threads")
    result = verify_bundle(bundle, threads=threads, rtol=rtol, atol=atol)
    name = os.path.basename(os.fspath(bundle))
    runs = sorted({c.batch for c in result.checks if c.batch is not None})
    extra = f", also its first {', '.join(map(str, runs))} rows" if runs else ""
    echo(f"{name}: {len(result.checks)} output checks{extra}; {result.summary()}")
    if not result.ok:
        echo("FAIL")
        raise GoldenMismatchError(f"{name} does not reproduce its golden output: "
                                  f"{result.summary()}")
    echo("PASS")


# ---- bench --profile: every kernel timed (runtime/profile.py) ------------------------------

def parse_shapes(values: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """``--shape NAME=D,D,...`` values (repeatable) as {name: shape}; a usage error otherwise."""
    shapes: dict[str, tuple[int, ...]] = {}
    for text in values or ():
        name, sep, dims = str(text).partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(",")) if sep and name else ()
        except ValueError:
            shape = ()
        if not shape or min(shape) < 1:
            raise UsageError(f"--shape {text}: expected NAME=DIMS with every dim >= 1, "
                             "e.g. --shape x=1,3,48,320")
        if name in shapes:
            raise UsageError(f"--shape {name} is given twice")
        shapes[name] = shape
    return shapes


def profile_bundle(path: str | os.PathLike, runs: int | None = None, threads: int = 1,
                   budget_s: float = 1.0, shapes: dict[str, tuple[int, ...]] | None = None
                   ) -> Profile:
    """Load the bundle at ``path`` with ``threads`` threads and profile it on random inputs
    (``bench``'s, of ``shapes`` when given: a symbolic bundle is profiled on the plan of those
    sizes): ``runs`` timed runs, or as many as fit in about ``budget_s`` (5 to 1000)."""
    from .bench import first_run, random_feeds
    from .model import load

    with load(path, threads=threads) as model:
        feeds = random_feeds(model, shapes)
        t0 = time.perf_counter()
        first_run(model, feeds, bool(shapes))
        once = time.perf_counter() - t0
        if runs is None:
            runs = int(min(1000, max(5, budget_s / max(once, 1e-6))))
        # Model.profile picks the plan that runs these feeds: a --batch-sizes plan when the
        # shapes match one, else the symbolic plan at these sizes.
        return model.profile(feeds, runs=runs, warmup=1)


def rich_table(profile: Profile, top: int | None = None) -> Any:
    """The profile as a ``rich`` table, the slowest first (rich: an extra of the runtime)."""
    from rich.table import Table

    ranked = profile.ranked()
    shown = ranked[:top] if top else ranked
    table = Table(title=profile.title, title_justify="left")
    table.add_column("#", justify="right")
    # fused kernels have long symbols: one line each, cut short; the nodes say what they are
    table.add_column("kernel", no_wrap=True, overflow="ellipsis", max_width=30)
    table.add_column("source nodes", overflow="fold", ratio=1)
    for header in ("mean µs", "min µs", "share", "GFLOP/s"):
        table.add_column(header, justify="right", no_wrap=True)
    for rank, t in enumerate(shown, start=1):
        gf = t.gflops
        table.add_row(str(rank), t.step.symbol, sources_text(t.step.sources) or "-",
                      f"{t.mean_us:.1f}", f"{t.min_us:.1f}", f"{t.share:.1f}%",
                      "" if gf is None else f"{gf:.1f}")
    rest = ranked[len(shown):]
    if rest:
        table.add_row("", f"... {len(rest)} more", "", f"{sum(t.mean_us for t in rest):.1f}",
                      "", f"{sum(t.share for t in rest):.1f}%", "")
    table.caption = (f"run: mean {profile.total_mean_us:.1f} µs, min {profile.total_min_us:.1f} µs"
                     f"; instructions sum {profile.kernels_sum_us:.1f} µs (the rest is the VM "
                     "loop and the timer); GFLOP/s at the min time")
    table.caption_justify = "left"
    return table


def _render(profile: Profile, top: int | None) -> str:
    """The rich table as text at the terminal's width (plain text where rich is missing)."""
    try:
        from rich.console import Console
    except ImportError:
        return profile.text(top)
    buffer = io.StringIO()
    width = max(110, shutil.get_terminal_size((140, 24)).columns)
    Console(file=buffer, width=width, color_system=None).print(rich_table(profile, top))
    return "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").splitlines())


def write_trace(profile: Profile, path: str | os.PathLike) -> None:
    """Write the Chrome trace to ``path`` (a temporary file renamed into place)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(profile.chrome_trace(), f)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise MlcpackError(f"cannot write the trace to {path}: {exc.strerror or exc}") from None


def profile_command(bundle: str | os.PathLike, *, runs: int | None = None, threads: int = 1,
                    budget_s: float = 1.0, as_json: bool = False,
                    trace: str | os.PathLike | None = None, top: int | None = None,
                    echo: Callable[[str], None] = print,
                    shapes: Sequence[str] | None = None) -> Profile:
    """``mlcpack bench --profile``: profile ``bundle``, print the table (or JSON) and write the
    trace to ``trace`` when given."""
    for value, low, flag in ((runs, 1, "--runs"), (threads, 1, "--threads"),
                             (budget_s, 0, "--budget"), (top, 0, "--top")):
        check_at_least(value, low, flag)
    profile = profile_bundle(bundle, runs, threads, budget_s, parse_shapes(shapes))
    if trace is not None:
        write_trace(profile, trace)
    if as_json:
        echo(json.dumps(profile.to_json()))
    else:
        echo(_render(profile, top))
        if trace is not None:
            echo(f"trace: {os.fspath(trace)} ({profile.runs * len(profile.steps)} events; open it "
                 "in https://ui.perfetto.dev or chrome://tracing)")
    return profile


# ---- bench -----------------------------------------------------------------------------------------

def bench(bundle: str | os.PathLike, *, runs: int | None = None, threads: int = 1,
          budget_s: float = 1.0, as_json: bool = False, profile: bool = False,
          trace: str | os.PathLike | None = None, top: int | None = 30,
          echo: Echo = _stdout, shapes: Sequence[str] | None = None) -> None:
    """Time ``bundle`` on random inputs: load, first run, then latency percentiles over
    ``runs`` runs (default: as many as fit in ``budget_s`` seconds, at least 5). With
    ``profile`` (or a ``trace`` file) time every kernel instead (runtime/profile.py)."""
    from .bench import bench as time_bundle

    if profile or trace is not None:
        profile_command(bundle, runs=runs, threads=threads, budget_s=budget_s, as_json=as_json,
                        trace=trace, top=top, echo=echo, shapes=shapes)
        return
    check_at_least(runs, 1, "--runs")
    check_at_least(threads, 1, "--threads")
    check_at_least(budget_s, 0, "--budget")
    t = time_bundle(bundle, runs, threads, budget_s, parse_shapes(shapes))
    name = os.path.basename(os.fspath(bundle))
    if as_json:
        echo(json.dumps({"bundle": os.fspath(bundle), "threads": threads, "runs": t.runs,
                         "load_ms": t.load_ms, "first_ms": t.first_ms, "min_us": t.min_us,
                         "p50_us": t.median_us, "p90_us": t.p90_us, "p99_us": t.p99_us}))
        return
    echo(f"{name}: load {t.load_ms:.2f} ms, first {t.first_ms:.2f} ms, "
         f"p50 {t.median_us:.1f} us, p90 {t.p90_us:.1f} us, p99 {t.p99_us:.1f} us, "
         f"min {t.min_us:.1f} us ({t.runs} runs, {threads} thread{'s' if threads > 1 else ''})")
