"""The ONNX backend test suite run through mlcpack: export, run the bundle, compare.

The data is what the pinned ``onnx`` wheel (1.22.0, the last to ship it) installs under
``onnx/backend/test/data``. Each case is exported with ``import_onnx`` + ``export_module``, its
bundle loaded with the runtime and run on every ``test_data_set_*``; outputs are compared the
way ONNX's backend runner does (same shape, same dtype, ``assert_allclose`` with the case's
``rtol``/``atol``, by default 1e-3 / 1e-7). A case ends as one of:

- ``passed``: every output of every data set matches;
- ``unsupported``: mlcpack refused it with a one-line ``ExportError`` (an operator, attribute or
  run-time dtype it lacks), or its inputs/outputs are not plain tensors (sequences, optionals,
  strings);
- ``failed``: it exported but gave wrong numbers, shapes or dtypes, or something crashed.

Inputs a static-shape compiler must know at export (a Reshape's shape, a Pad's pads, TopK's k:
a converter raises ``NeedsConstantError`` naming the value) are bound as constants from the
data set and the export is tried again, as ``--input-shape`` does for dims; such passes are
counted in the ``frozen`` column, and ``frozen.txt`` records which inputs each case needed, so
that a converter that starts demanding a constant fails the test. A case whose every input was
bound that way (or that has none) is ``constant``: its bundle computes nothing at run time, so
it is counted apart from the real passes. Everything else is fed at run time.
``--runtime-inputs`` runs the cases of ``frozen.txt`` with nothing bound and prints which pass
(issue 12: values fed at run time instead of frozen at export).

``light`` cases are the model-zoo architectures of ``data/real`` with constant weights
(``data/light/*.onnx``); their input is the runner's dummy input (``arange / n``) and their
expected output ships beside the model.

Run ``python tests/conformance/harness.py`` to print the table and rewrite
``tests/conformance/passing.txt`` (the cases CI runs, constant ones included), ``frozen.txt``,
``failing.txt`` (known wrong answers) and ``docs/conformance.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
CATEGORIES = ("node", "pytorch-converted", "pytorch-operator", "simple", "light")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PASSING_LIST = HERE / "passing.txt"
FAILING_LIST = HERE / "failing.txt"
FROZEN_LIST = HERE / "frozen.txt"
REPORT = ROOT / "docs" / "conformance.md"
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7
MAX_FREEZES = 8


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    model: Path
    data_sets: tuple[tuple[tuple[Path, ...], tuple[Path, ...]], ...]  # (inputs, outputs) per set
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    @property
    def key(self) -> str:
        return f"{self.category}/{self.name}"


@dataclass
class Result:
    key: str
    status: str                      # passed, failed, unsupported
    reason: str = ""
    frozen: list[str] = field(default_factory=list)
    constant: bool = False           # no run-time input left: the bundle computes nothing
    seconds: float = 0.0


def _tolerances(folder: Path) -> tuple[float, float]:
    meta = folder / "data.json"
    if meta.is_file():
        data = json.loads(meta.read_text())
        return float(data.get("rtol", DEFAULT_RTOL)), float(data.get("atol", DEFAULT_ATOL))
    return DEFAULT_RTOL, DEFAULT_ATOL


def _data_sets(folder: Path) -> tuple[tuple[tuple[Path, ...], tuple[Path, ...]], ...]:
    sets = []
    for d in sorted(folder.glob("test_data_set_*")):
        ins = tuple(sorted(d.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1])))
        outs = tuple(sorted(d.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1])))
        sets.append((ins, outs))
    return tuple(sets)


def discover(categories: Sequence[str] = CATEGORIES) -> list[Case]:
    """Every case of ``categories`` shipped in the onnx wheel, sorted by category then name."""
    cases = []
    for cat in categories:
        if cat == "light":
            for folder in sorted((DATA / "real").glob("test_*")):
                meta = json.loads((folder / "data.json").read_text())
                model = DATA.parent.parent.parent.parent / meta["url"]
                outs = tuple(sorted(model.parent.glob(f"{model.stem}_output_*.pb")))
                cases.append(Case(cat, folder.name, model, (((), outs),),
                                  float(meta.get("rtol", DEFAULT_RTOL)),
                                  float(meta.get("atol", DEFAULT_ATOL))))
            continue
        for folder in sorted((DATA / cat).glob("test_*")):
            rtol, atol = _tolerances(folder)
            cases.append(Case(cat, folder.name, folder / "model.onnx", _data_sets(folder),
                              rtol, atol))
    return cases


def _dummy_input(vi: onnx.ValueInfoProto) -> np.ndarray:
    """The backend runner's input for light models: ``arange(n) / n`` in the declared shape."""
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                  for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


class NotATensor(Exception):
    """A case input or output that is a sequence, optional or map, not a plain tensor."""


def _load_tensor(path: Path) -> np.ndarray:
    try:
        value = numpy_helper.to_array(onnx.load_tensor(str(path)))
    except Exception as exc:  # noqa: BLE001  (sequence/optional protos fail to parse as tensors)
        raise NotATensor(f"{path.name} is not a plain tensor") from exc
    if value.dtype == object:
        raise NotATensor(f"{path.name} holds strings")
    return value


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


# dtypes numpy lacks (ml_dtypes' in onnx's test data), which the runtime returns as unsigned bits
_BITS_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                "int4", "uint4", "int2", "uint2")


def _compare(got: np.ndarray, ref: np.ndarray, case: Case, what: str) -> str | None:
    if ref.dtype.name in _BITS_DTYPES and got.dtype.kind == "u" \
            and got.dtype.itemsize == ref.dtype.itemsize:  # the runtime returns their bits
        got = got.view(ref.dtype)
    if got.shape != ref.shape:
        return f"{what}: shape {got.shape}, expected {ref.shape}"
    if got.dtype != ref.dtype:
        return f"{what}: dtype {got.dtype}, expected {ref.dtype}"
    try:
        np.testing.assert_allclose(got, ref, rtol=case.rtol, atol=case.atol)
    except AssertionError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip().startswith("Max")]
        return f"{what}: values differ ({'; '.join(lines) or 'mismatch'})"
    return None


def _freeze(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    """Make graph input ``name`` an initializer holding ``value``."""
    model.graph.initializer.append(numpy_helper.from_array(value, name))


class NoTestData(Exception):
    """A case that ships no data set."""


@dataclass
class Imported:
    """A case's model imported as the harness runs it: the IR module and its info, the data
    sets (feeds by graph input name, expected outputs), and the inputs bound as constants."""
    mod: object
    info: object
    sets: list[tuple[dict[str, np.ndarray], list[np.ndarray]]]
    frozen: list[str]
    constant: bool


def import_case(case: Case, bind: bool = True) -> Imported:
    """Load and import one case, binding the inputs a converter needs at export from the first
    data set (``NeedsConstantError``; not when ``bind`` is false: every input is then fed at
    run time; also the inputs read as sizes at run time, format 1.6, when the data set gives
    a size 0, which a symbolic bundle refuses: ``_sizes_refused``), and giving a model left with no run-time input one that nothing reads. Raises
    what the import raises (``ExportError``, ``NotATensor``...)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.frontends.onnx.registry import NeedsConstantError
    from mlcpack.packager.export import ExportError

    model = onnx.load(str(case.model))
    init_names = {t.name for t in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in init_names]
    sets = []
    for ins, outs in case.data_sets:
        if case.category == "light":
            inputs = [_dummy_input(vi) for vi in graph_inputs]
        else:
            inputs = [_load_tensor(p) for p in ins]
        sets.append((dict(zip([vi.name for vi in graph_inputs], inputs)),
                     [_load_tensor(p) for p in outs]))
    if not sets:
        raise NoTestData("no test data")
    frozen: list[str] = []
    constant = False
    while True:
        try:
            mod, info = import_onnx(model)
            refused = _sizes_refused(mod, info, sets[0][0]) if bind else []
            if refused and len(sets) == 1:   # bound as the values a converter needs are
                for name in refused:
                    _freeze(model, name, sets[0][0][name])
                    frozen.append(name)
                continue
            return Imported(mod, info, sets, frozen, constant)
        except NeedsConstantError as exc:
            name = exc.value_name
            if not bind or name in frozen or name not in sets[0][0] \
                    or len(frozen) >= MAX_FREEZES or len(sets) > 1:
                raise
            _freeze(model, name, sets[0][0][name])
            frozen.append(name)
        except ExportError as exc:
            if "has no run-time inputs" not in str(exc) or constant:
                raise
            # Every input is known at export: the outputs are constants. A bundle still
            # needs an input, so give it one that nothing reads.
            constant = True
            model.graph.input.append(helper.make_tensor_value_info(
                "unused_input", onnx.TensorProto.FLOAT, [1]))
            for feeds, _ in sets:
                feeds["unused_input"] = np.zeros(1, np.float32)


def run_case(case: Case, workdir: str | os.PathLike | None = None, bind: bool = True) -> Result:
    """Export, run and compare one case; never raises. ``bind=False``: no input is bound as a
    constant at export (see ``import_case``)."""
    return _run_case(case, workdir, bind)


def _sizes_refused(mod: object, info: object, feeds: dict) -> list[str]:
    """The graph inputs read as sizes (``value_vars``) when the data set gives a size a
    symbolic bundle refuses (0: an empty input, or a value that makes an empty output); []
    when it does not."""
    from mlcpack.packager.ir.concrete import SizeMismatch, bind_sizes
    from mlcpack.packager.vm_emit import value_rows
    from mlcpack.runtime.errors import InputError
    from mlcpack.runtime.values import bind_values

    rows = getattr(mod, "value_vars", ())
    if not rows:
        return []
    by_param = {v: k for k, v in info.input_names.items()}
    names = sorted({by_param[n] for r in rows for n in (r[0], *(r[4:] if r[1] in ("slice", "pad")
                                                               else ())) if n in by_param})
    params = {info.input_names[k]: np.asarray(v) for k, v in feeds.items()
              if k in info.input_names}
    if any(0 in a.shape for a in params.values()):
        return names
    try:
        env = bind_sizes(mod.main.params, params)
        bind_values(value_rows(mod), params, env)
    except (InputError, SizeMismatch, KeyError):
        return names
    return []


def _run_case(case: Case, workdir: str | os.PathLike | None, bind: bool) -> Result:
    from mlcpack.packager.export import ExportError, ExportOptions, export_module
    from mlcpack.runtime import load

    t0 = time.perf_counter()
    result = Result(case.key, "failed")
    try:
        try:
            imported = import_case(case, bind)
        except NoTestData as exc:
            result.status, result.reason = "unsupported", str(exc)
            return result
        mod, info, sets, frozen = imported.mod, imported.info, imported.sets, imported.frozen
        result.frozen, result.constant = frozen, imported.constant
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            path = Path(tmp) / "case.mlc"
            # This host's level only: the case runs here, and the portable default would
            # also compile an x86-64-v2 object that never runs (test_golden_default_path
            # exports a stratified third of the cases with the portable default).
            export_module(mod, path, ExportOptions(target="host"))
            bundle = load(path)
            for k, (feeds, expected) in enumerate(sets):
                run_feeds = {info.input_names[n]: v for n, v in feeds.items() if n not in frozen}
                got = bundle.run(run_feeds)
                if len(expected) != len(info.output_names):
                    result.reason = (f"{len(info.output_names)} outputs, expected "
                                     f"{len(expected)}")
                    return result
                for name, ref in zip(info.output_names, expected):
                    problem = _compare(got[name], ref, case, f"set {k} output {name!r}")
                    if problem:
                        result.reason = problem
                        return result
        result.status = "passed"
    except NotATensor as exc:
        result.status, result.reason = "unsupported", str(exc)
    except ExportError as exc:
        result.status = "unsupported"
        message = str(exc)
        if message.startswith(case.model.name + ": ") or message.startswith(case.name + ": "):
            message = message.split(": ", 1)[1]
        result.reason = _one_line(message)
    except Exception as exc:  # noqa: BLE001  (a crash is a failure to report, not to stop on)
        result.reason = _one_line(f"{type(exc).__name__}: {exc}")
    finally:
        result.seconds = time.perf_counter() - t0
    return result


def _run_one(case: Case) -> Result:
    return run_case(case)


def run_all(cases: Sequence[Case], jobs: int = 1, run=_run_one) -> list[Result]:
    if jobs <= 1:
        return [run(c) for c in cases]
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(jobs, maxtasksperchild=200) as pool:
        return pool.map(run, cases, chunksize=4)


def read_frozen(path: Path = FROZEN_LIST) -> dict[str, tuple[tuple[str, ...], bool]]:
    """``frozen.txt``: passing case -> (the inputs bound as constants, whether it is constant).
    A line is ``KEY INPUT,INPUT`` (or ``KEY -`` for none), then ``constant`` when no run-time
    input is left; a passing case not listed needed nothing."""
    out = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) not in (2, 3) or (len(words) == 3 and words[2] != "constant"):
            raise ValueError(f"{path.name}: malformed line {line!r}")
        names = () if words[1] == "-" else tuple(words[1].split(","))
        out[words[0]] = (names, len(words) == 3)
    return out


def write_frozen(results: Sequence[Result], path: Path = FROZEN_LIST) -> None:
    lines = ["# Passing conformance cases that needed graph inputs bound as constants from the",
             "# data set (a shape, axes, pads, k), and those left with no run-time input",
             "# ('constant': the bundle computes nothing). Written by harness.py; checked by",
             "# tests/corpus/test_onnx_conformance.py. KEY INPUT,INPUT|- [constant]"]
    for r in sorted(results, key=lambda r: r.key):
        if r.status == "passed" and (r.frozen or r.constant):
            lines.append(f"{r.key} {','.join(r.frozen) or '-'}" + (" constant" if r.constant
                                                                     else ""))
    path.write_text("\n".join(lines) + "\n")


def table(results: Sequence[Result]) -> str:
    """A markdown table per category: real passes (and those with frozen inputs), constant
    passes (every input frozen: the bundle computes nothing) apart, failed, unsupported."""
    rows = ["| category | cases | passed | (frozen inputs) | constant (all inputs frozen) | "
            "failed | unsupported |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    totals = Counter()
    for cat in CATEGORIES:
        mine = [r for r in results if r.key.split("/")[0] == cat]
        if not mine:
            continue
        c = Counter(r.status for r in mine)
        constant = sum(1 for r in mine if r.status == "passed" and r.constant)
        real = c["passed"] - constant
        frozen = sum(1 for r in mine if r.status == "passed" and r.frozen and not r.constant)
        rows.append(f"| {cat} | {len(mine)} | {real} | {frozen} | {constant} | {c['failed']} | "
                    f"{c['unsupported']} |")
        totals.update(c)
        totals.update(cases=len(mine), frozen=frozen, constant=constant, real=real)
    rows.append(f"| **all** | {totals['cases']} | {totals['real']} | {totals['frozen']} | "
                f"{totals['constant']} | {totals['failed']} | {totals['unsupported']} |")
    return "\n".join(rows)


def _reason_kind(reason: str) -> str:
    """A short grouping key for a refusal or failure reason."""
    if "operator" in reason and "does not support" in reason:
        return "operator not supported: " + reason.split("support: ", 1)[1].split(" (opset")[0]
    if "not supported yet" in reason and "tensors at run time" in reason:
        return "dtype not supported at run time (float16, bfloat16, float8, 4-bit...)"
    if "must be a constant known at export" in reason:
        return "value needed at export is computed at run time"
    if "values differ" in reason:
        return "wrong values"
    return reason.split(":")[0][:80]


REST_HEADING = "## Why the others do not pass (grouped)"
# ONNX Runtime on the same node cases: ``python tests/conformance/ort_count.py`` (its Python API,
# CPU, 1 thread; outputs compared as mlcpack's are), with the versions it ran.
ORT_NODE = (1519, "onnxruntime 1.32.0")


def write_report(results: Sequence[Result], path: Path = REPORT, rest: str | None = None) -> None:
    """Write ``docs/conformance.md``; ``rest`` keeps the existing text from ``REST_HEADING`` on
    (the reasons) instead of writing it from ``results``."""
    lines = ["# ONNX backend test suite: conformance", "",
             "Generated by `python tests/conformance/harness.py` from the test data of the pinned "
             f"`onnx` {onnx.__version__} wheel (rtol/atol as ONNX's runner: 1e-3/1e-7 unless a "
             "case's `data.json` says otherwise). CI runs every passing case "
             "(`tests/corpus/test_onnx_conformance.py`, list in `tests/conformance/passing.txt`).",
             "", table(results), "",
             "*frozen inputs*: passes where a graph input that must be known at export (a shape, "
             "axes, pads, k) was bound as a constant from the data set, as `--input-shape` does "
             "for dims; every other input is fed at run time. Which inputs each case needed is "
             "recorded in `tests/conformance/frozen.txt` and checked by the test. *constant*: "
             "cases where every input was so bound (or that have none), so the bundle computes "
             "nothing at run time (the frontend's constant evaluation is what they test); they "
             "are not counted in *passed*, and CI runs them too.", ""]
    passed = [r for r in results if r.status == "passed"]
    bound = [r for r in passed if r.frozen or r.constant]
    lines += ["## Inputs fed at run time vs bound at export", "",
              f"Of the {len(passed)} passing cases, **{len(passed) - len(bound)} pass with every "
              f"input fed at run time**; **{len(bound)} still need an input bound at export** "
              f"(`--bind NAME=file.npy`, as the harness does from the data set: "
              f"{len(bound) - sum(r.constant for r in bound)} with run-time inputs left, "
              f"{sum(r.constant for r in bound)} constant). What they bind, by input: "
              + ", ".join(f"{name} {n}" for name, n in Counter(
                  n for r in bound for n in r.frozen).most_common()) + ". "
              "`python tests/conformance/harness.py --runtime-inputs` tries the cases of "
              "`frozen.txt` with nothing bound and prints which pass.", ""]
    node = [r for r in results if r.key.startswith("node/")]
    fed = sum(r.status == "passed" and not r.frozen and not r.constant for r in node)
    lines += [f"**Node cases as users export them** (nothing bound: every input fed at run time, "
              f"as `mlcpack export model.onnx` with no `--bind`): **{fed} of {len(node)}**; "
              f"{ORT_NODE[1]} passes {ORT_NODE[0]} of the same cases on the same data "
              "(`python tests/conformance/ort_count.py`; most of those it does not pass feed "
              "bfloat16, float8 or 4-bit arrays its Python API does not take). A shape, axes, "
              "pads, starts/ends or split sizes fed as a graph input bind size variables from "
              "their values at run start (format 1.6, `docs/symbolic-shapes.md`), a Resize's "
              "scales bind `floor(scale * dim)` (format 1.7); a data set "
              "that gives a size 0 still binds them (symbolic bundles take sizes of at least "
              "1).", ""]
    constant = sorted(r.key for r in results if r.status == "passed" and r.constant)
    if constant:
        lines += ["## Constant cases (every input frozen)", "", ", ".join(constant), ""]
    if rest is not None:
        path.write_text("\n".join(lines) + "\n" + rest)
        return
    others = [r for r in results if r.status != "passed"]
    kinds = Counter(_reason_kind(r.reason) for r in others)
    lines += [REST_HEADING, "", "| reason | cases |", "|---|---:|"]
    lines += [f"| {k.replace('|', '/')} | {n} |" for k, n in kinds.most_common()]
    lines += ["", "## Every case that does not pass", "", "| case | status | reason |",
              "|---|---|---|"]
    lines += [f"| {r.key} | {r.status} | {r.reason.replace('|', '/')} |" for r in others]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def record_frozen(jobs: int = 1) -> list[Result]:
    """Import (only) every case of ``passing.txt`` to record the inputs it needs frozen, and
    take the other cases' status from the lists (``failing.txt``: failed, else unsupported),
    which the test keeps current: minutes instead of a full run's half hour. Rewrites
    ``frozen.txt`` and the table of ``docs/conformance.md``, keeping its reasons."""
    passing = set(PASSING_LIST.read_text().split())
    failing = set(FAILING_LIST.read_text().split()) if FAILING_LIST.is_file() else set()
    cases = discover()
    imported = run_all([c for c in cases if c.key in passing], jobs, _import_only)
    by_key = {r.key: r for r in imported}
    results = [by_key.get(c.key) or Result(c.key, "failed" if c.key in failing else "unsupported")
               for c in cases]
    bad = [r.key for r in imported if r.status != "passed"]
    if bad:
        raise SystemExit(f"passing cases that no longer import: {bad}")
    write_frozen(results)
    text = REPORT.read_text()
    write_report(results, rest=text[text.index(REST_HEADING):])
    return results


def _import_only(case: Case) -> Result:
    try:
        imported = import_case(case)
    except Exception as exc:  # noqa: BLE001
        return Result(case.key, "failed", _one_line(f"{type(exc).__name__}: {exc}"))
    return Result(case.key, "passed", frozen=imported.frozen, constant=imported.constant)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--category", action="append", choices=CATEGORIES)
    parser.add_argument("-k", dest="pattern", help="only cases whose name contains this")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-write", action="store_true",
                        help="print only; do not rewrite passing.txt and docs/conformance.md")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case")
    parser.add_argument("--frozen-only", action="store_true",
                        help="import the passing cases only: rewrite frozen.txt and the table")
    parser.add_argument("--runtime-inputs", action="store_true",
                        help="run the cases of frozen.txt with every input fed at run time "
                        "(nothing bound) and print which pass; writes nothing")
    args = parser.parse_args(argv)
    if args.runtime_inputs:
        needs = read_frozen()
        cases = [c for c in discover() if needs.get(c.key, ((), False))[0]]
        results = [run_case(c, bind=False) for c in cases]   # export compiles in processes
        for r in results:
            print(f"{r.status:12s} {r.key}  (binds {','.join(needs[r.key][0])})  {r.reason}")
        ok = sum(r.status == "passed" for r in results)
        print(f"{ok} of {len(results)} cases that bind inputs pass with them fed at run time")
        return 0
    if args.frozen_only:
        print(table(record_frozen(args.jobs)))
        print(f"wrote {FROZEN_LIST.relative_to(ROOT)} and {REPORT.relative_to(ROOT)}")
        return 0
    cases = discover(args.category or CATEGORIES)
    if args.pattern:
        cases = [c for c in cases if args.pattern in c.name]
    t0 = time.perf_counter()
    results = run_all(cases, args.jobs)
    if args.verbose:
        for r in results:
            print(f"{r.status:12s} {r.key}  {r.reason}")
    print(table(results))
    print(f"{len(results)} cases in {time.perf_counter() - t0:.1f} s")
    partial = bool(args.pattern or args.category)
    if not args.no_write and not partial:
        PASSING_LIST.write_text("".join(f"{r.key}\n" for r in results if r.status == "passed"))
        write_frozen(results)
        FAILING_LIST.write_text("".join(f"{r.key}\n" for r in results if r.status == "failed"))
        write_report(results)
        print(f"wrote {PASSING_LIST.relative_to(ROOT)}, {FROZEN_LIST.name}, {FAILING_LIST.name} and "
              f"{REPORT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
