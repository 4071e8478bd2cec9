"""``infer`` over many inputs: files, folders and globs, run in batches that fit the bundle's plans,
written as one result per input (``.jsonl``, ``.csv`` or ``.npz``) in input order.

Decoding runs on a thread beside the compute (the next batch decodes while this one runs); a
bad file gets an ``error`` in its line and in the summary and does not stop the run
(``fail_fast`` stops it); ``resume`` skips the inputs an earlier run already wrote. The
progress bar uses rich when it is installed and the stream is a terminal, a plain line
otherwise, and nothing when piped. ``runtime/distributed.py`` reuses ``predict_records``.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .errors import InputError, MlcpackError

INPUT_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".npy")
OUTPUT_SUFFIXES = (".jsonl", ".csv", ".npz")


def expand_inputs(inputs: Sequence[str | os.PathLike]) -> list[str]:
    """Files as given, folders walked (sorted, recursively, images and .npy only), globs
    expanded (sorted, ``**`` allowed); an argument that matches nothing is an error (exit 7)."""
    out: list[str] = []
    for raw in inputs:
        p = os.fspath(raw)
        if os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs.sort()
                found += [os.path.join(root, f) for f in sorted(files)
                          if f.lower().endswith(INPUT_SUFFIXES) and not f.startswith(".")]
            if not found:
                raise InputError(f"{p}: the folder has no images or .npy files")
            out += found
        elif os.path.exists(p):
            out.append(p)
        elif glob.has_magic(p):
            found = sorted(f for f in glob.glob(p, recursive=True) if os.path.isfile(f))
            if not found:
                raise InputError(f"{p}: the pattern matches no file")
            out += found
        else:
            raise InputError(f"{p}: no such file (the input file)")
    return out


def is_many(inputs: Sequence[str | os.PathLike]) -> bool:
    """Whether the arguments name a folder or a glob (the many-input mode)."""
    return any(os.path.isdir(p) or (not os.path.exists(p) and glob.has_magic(os.fspath(p)))
               for p in inputs)


def is_classifier(model: Any) -> bool:
    """Top-k results when the bundle has labels, or its one output is a vector per row."""
    if model.labels:
        return True
    outs = model.outputs
    if len(outs) != 1:
        return False
    rows = outs[0].shape[1:] if model.batch is not None else outs[0].shape
    rows = [d for d in rows if d != 1] if model.batch is not None else list(outs[0].shape)
    # (1, C), or (S, C) where S is a size variable (a symbolic bundle's open batch): one
    # vector of C scores per row, as `infer IMAGE` ranks it
    return (len(rows) == 1 and isinstance(rows[0], int) and rows[0] > 1) or (
        model.batch is None and len(outs[0].shape) == 2
        and (outs[0].shape[0] == 1 or isinstance(outs[0].shape[0], str))
        and isinstance(outs[0].shape[1], int) and outs[0].shape[1] > 1)


def decode(model: Any, path: str, strict: bool = False) -> np.ndarray:
    """One input file as the first input's value, one row (``InputError`` when unreadable)."""
    from .preprocess import load_input

    spec = model.inputs[0]
    x = load_input(path, spec, model.preprocess, note=lambda _m: None, strict=strict,
                   model=model)
    want = spec.shape[1:] if model.batch is not None else spec.shape
    if model.batch is not None:
        if tuple(np.shape(x)) == tuple(want):
            x = np.asarray(x)[None]
        if np.ndim(x) != len(spec.shape) or np.shape(x)[0] != 1:
            raise InputError(f"{path}: shape {list(np.shape(x))}, the input takes one row of "
                             f"{list(spec.shape[1:])}")
    return np.asarray(x, dtype=spec.dtype)


def batch_size_of(model: Any) -> int:
    """The largest plan's batch (1 for a fixed-shape bundle)."""
    return max(model.batch.sizes) if model.batch is not None else 1


def records_from_outputs(model: Any, paths: Sequence[str], outputs: dict[str, np.ndarray],
                         top_k: int, classifier: bool) -> list[dict[str, Any]]:
    """One result record per row of ``outputs``."""
    from .results import top_k_of

    recs = []
    for i, p in enumerate(paths):
        if model.batch is not None:
            row = {k: v[i] if k in model.batch.outputs else v for k, v in outputs.items()}
        else:   # one input ran alone: its batch of one is dropped, as a batch plan's row is
            row = {k: v[0] if np.ndim(v) >= 1 and np.shape(v)[0] == 1 else v
                   for k, v in outputs.items()}
        if classifier:
            first = np.asarray(row[model.outputs[0].name]).reshape(-1)
            recs.append({"path": p, "top_k": top_k_of(first, top_k, model.labels)})
        else:
            recs.append({"path": p, "outputs": {k: np.asarray(v) for k, v in row.items()}})
    return recs


def predict_records(model: Any, paths: Sequence[str], arrays: Sequence[np.ndarray | Exception],
                    *, top_k: int = 5, classifier: bool | None = None) -> list[dict[str, Any]]:
    """Run the decoded ``arrays`` (an exception for a file that failed) of ``paths``; one record
    per path, in order: ``{"path", "top_k"}``, ``{"path", "outputs"}`` or ``{"path", "error"}``.
    A batch that fails as a whole is retried one input at a time, so one bad row loses only
    itself."""
    if classifier is None:
        classifier = is_classifier(model)
    name = model.inputs[0].name
    good = [i for i, a in enumerate(arrays) if not isinstance(a, Exception)]
    recs: list[dict[str, Any] | None] = [None] * len(paths)
    for i, a in enumerate(arrays):
        if isinstance(a, Exception):
            recs[i] = {"path": paths[i], "error": _error_text(a)}
    groups = [good] if model.batch is not None else [[i] for i in good]
    for g in groups:
        if not g:
            continue
        try:
            x = np.concatenate([arrays[i] for i in g]) if model.batch is not None \
                else arrays[g[0]]
            out = model.run({name: x})
            for i, r in zip(g, records_from_outputs(model, [paths[i] for i in g], out, top_k,
                                                    classifier)):
                recs[i] = r
        except Exception as exc:  # noqa: BLE001 - reported per input
            if len(g) == 1:
                recs[g[0]] = {"path": paths[g[0]], "error": _error_text(exc)}
            else:
                for i in g:
                    recs[i] = predict_records(model, [paths[i]], [arrays[i]], top_k=top_k,
                                              classifier=classifier)[0]
    return recs  # type: ignore[return-value]


def _error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, MlcpackError) else f"{type(exc).__name__}: {exc}"


def _safe_decode(model: Any, path: str, strict: bool) -> np.ndarray | Exception:
    try:
        return decode(model, path, strict)
    except Exception as exc:  # noqa: BLE001 - reported in the input's line
        return exc


# ---- result files ---------------------------------------------------------------------------------

def _jsonable(rec: dict[str, Any]) -> dict[str, Any]:
    if "outputs" in rec:
        return {"path": rec["path"], "outputs": {k: np.asarray(v).tolist()
                                                  for k, v in rec["outputs"].items()}}
    return rec


def _csv_row(rec: dict[str, Any], top_k: int) -> list[str]:
    row = [rec["path"]]
    if "top_k" in rec:
        for t in rec["top_k"]:
            row += [t["label"], repr(t["score"])]
        row += ["", ""] * (top_k - len(rec["top_k"]))
        return row + [""]
    if "outputs" in rec:
        flat = np.concatenate([np.asarray(v, np.float64).reshape(-1)
                               for v in rec["outputs"].values()])
        return row + [" ".join(repr(float(v)) for v in flat)] + [""]
    return row + ["", ""] * top_k + [rec["error"]]


def _result_lines(output: str) -> tuple[list[str], list[tuple[str, bool, str]]]:
    """The complete lines of a result file: (the CSV header, or nothing; one (path, ok, line)
    per result line). A last line cut short by an interruption is left out."""
    with open(output, encoding="utf-8", newline="") as f:
        lines = [line for line in f.read().splitlines(keepends=True) if line.endswith("\n")]
    head: list[str] = []
    rows: list[tuple[str, bool, str]] = []
    if output.lower().endswith(".jsonl"):
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "path" in rec:
                rows.append((str(rec["path"]), "error" not in rec, line))
        return head, rows
    head, lines = lines[:1], lines[1:]
    for line in lines:
        row = next(csv.reader([line]), [])
        if row:
            rows.append((row[0], not row[-1], line))
    return head, rows


def _rewrite(output: str, head: list[str], lines: list[str]) -> None:
    tmp = output + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write("".join(head + lines))
    os.replace(tmp, output)


def done_paths(output: str) -> set[str]:
    """The inputs an earlier run wrote a result (not an error) for. The file is rewritten with
    those results only, one per input: failed inputs run again, and their old lines go."""
    if not os.path.exists(output):
        return set()
    head, rows = _result_lines(output)
    done: set[str] = set()
    keep: list[str] = []
    for path, ok, line in rows:
        if ok and path not in done:
            done.add(path)
            keep.append(line)
    _rewrite(output, head, keep)
    return done


def order_results(output: str, paths: Sequence[str]) -> None:
    """Rewrite a .jsonl/.csv result file with one line per input in the order of ``paths``
    (an input's newest line; lines of paths not among them keep their place after those)."""
    if not os.path.exists(output):
        return
    head, rows = _result_lines(output)
    newest: dict[str, str] = {}
    for path, _ok, line in rows:
        newest[path] = line
    lines = [newest.pop(p) for p in dict.fromkeys(paths) if p in newest]
    lines += list(newest.values())
    _rewrite(output, head, lines)


class ResultWriter:
    """Writes records in order to ``output`` (None: JSON lines through ``echo``)."""

    def __init__(self, output: str | None, top_k: int, echo: Callable[[str], None],
                 append: bool = False) -> None:
        self.output, self.top_k, self.echo = output, top_k, echo
        self.kind = "jsonl" if output is None else os.path.splitext(output)[1][1:].lower()
        self.f: Any = None
        self.npz: list[dict[str, Any]] = []
        if output is not None and self.kind != "npz":
            fresh = not (append and os.path.exists(output) and os.path.getsize(output))
            self.f = open(output, "a" if append else "w", encoding="utf-8", newline="")
            if self.kind == "csv":
                self.csv = csv.writer(self.f, lineterminator="\n")
                if fresh:
                    head = ["path"]
                    for r in range(1, top_k + 1):
                        head += [f"label{r}", f"score{r}"]
                    self.csv.writerow(head + ["error"])

    def write(self, recs: Sequence[dict[str, Any]]) -> None:
        if self.kind == "npz":
            self.npz += recs
            return
        if self.kind == "csv":
            for r in recs:
                self.csv.writerow(_csv_row(r, self.top_k))
        else:
            text = "\n".join(json.dumps(_jsonable(r)) for r in recs)
            if self.f is None:
                self.echo(text)
            else:
                self.f.write(text + "\n")
        if self.f is not None:
            self.f.flush()

    def close(self, model: Any = None) -> None:
        if self.f is not None:
            self.f.close()
        if self.kind == "npz" and self.output is not None:
            self._write_npz(model)

    def _write_npz(self, model: Any) -> None:
        arrays: dict[str, Any] = {"path": np.array([r["path"] for r in self.npz], dtype=str),
                                  "error": np.array([r.get("error", "") for r in self.npz],
                                                    dtype=str)}
        names = [s.name for s in model.outputs] if model is not None else []
        for k in names:
            ok = [r for r in self.npz if "outputs" in r]
            if not ok:
                continue
            if len({np.shape(r["outputs"][k]) for r in ok}) > 1:
                # open sizes: each input's output has its own shape, so one array per input,
                # NAME_i for the i-th input (none for a failed one)
                for i, r in enumerate(self.npz):
                    if "outputs" in r:
                        arrays[f"{k}_{i}"] = np.asarray(r["outputs"][k])
                continue
            proto = np.asarray(ok[0]["outputs"][k])
            stack = np.zeros((len(self.npz), *proto.shape), dtype=np.float64 if
                             proto.dtype.kind == "f" else proto.dtype)
            if stack.dtype.kind == "f":
                stack[:] = np.nan
            for i, r in enumerate(self.npz):
                if "outputs" in r:
                    stack[i] = r["outputs"][k]
            arrays[k] = stack.astype(proto.dtype) if proto.dtype.kind == "f" else stack
        tmp = self.output + ".tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, self.output)


# ---- progress -------------------------------------------------------------------------------------

class Progress:
    """A progress bar with items/s: rich on a terminal when installed, a plain line on a terminal
    without it, nothing when the stream is not a terminal."""

    def __init__(self, total: int, stream: Any = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total, self.done, self.t0, self.last = total, 0, time.perf_counter(), 0.0
        self.rich: Any = None
        if self.enabled:
            try:
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RP,
                                           TextColumn, TimeRemainingColumn)
                from rich.console import Console
                self.rich = RP(TextColumn("infer"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                               console=Console(file=self.stream), transient=True)
                self.task = self.rich.add_task("infer", total=total, rate="")
                self.rich.start()
            except ImportError:
                self.rich = None

    def rate(self) -> float:
        dt = time.perf_counter() - self.t0
        return self.done / dt if dt > 0 else 0.0

    def advance(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.rich is not None:
            self.rich.update(self.task, advance=n, rate=f"{self.rate():.1f} items/s")
        elif time.perf_counter() - self.last > 0.2 or self.done == self.total:
            self.last = time.perf_counter()
            self.stream.write(f"\rinfer {self.done}/{self.total}  {self.rate():.1f} items/s")
            self.stream.flush()

    def close(self) -> None:
        if self.rich is not None:
            self.rich.stop()
        elif self.enabled:
            self.stream.write("\n")
            self.stream.flush()


# ---- the run --------------------------------------------------------------------------------------

def _batches(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def infer_many(bundle: str | os.PathLike, inputs: Sequence[str | os.PathLike], *,
               output: str | None = None, top_k: int = 5, threads: int | None = None,
               trusted_keys: Sequence[str | os.PathLike] = (), strict: bool = False,
               fail_fast: bool = False, resume: bool = False, batch_size: int | None = None,
               ray: str | None = None, workers: int | None = None, progress: bool | None = None,
               echo: Callable[[str], None] = print, warn: Callable[[str], None] = print,
               ray_runner: Callable[..., Iterator[list[dict]]] | None = None) -> dict:
    """Run ``bundle`` over every input (files, folders, globs), writing one result per input in
    input order; returns the summary (counts, failures, seconds, items/s). Failed inputs:
    ``InputError`` (exit 7) after the run, at the first one with ``fail_fast``. ``ray_runner``
    (``distributed.run_paths``, passed in by the caller) runs the inputs on Ray when ``ray``."""
    from .errors import UsageError
    from .model import load

    if output is not None and not output.lower().endswith(OUTPUT_SUFFIXES):
        raise UsageError(f"--output {output}: give a .jsonl, .csv or .npz file")
    if resume and (output is None or output.lower().endswith(".npz")):
        raise UsageError("--resume needs --output FILE.jsonl or FILE.csv (the file to go on)")
    if output is not None and os.path.isdir(output):
        raise UsageError(f"--output {output} is a directory")
    paths = expand_inputs(inputs)
    skip = done_paths(output) if resume and output is not None else set()
    todo = [p for p in paths if p not in skip]
    t0 = time.perf_counter()
    failed: list[tuple[str, str]] = []
    with load(bundle, threads=threads, trusted_keys=list(trusted_keys) or None) as model:
        if len(model.inputs) != 1:
            raise InputError(f"{model.name} takes {len(model.inputs)} inputs; infer over many "
                             "files runs bundles with one input")
        size = batch_size or batch_size_of(model)
        classifier = is_classifier(model) and not (output or "").lower().endswith(".npz")
        if not classifier and (output or "").lower().endswith(".csv"):
            outs = ", ".join(f"{s.name} {list(s.shape)}" for s in model.outputs)
            raise UsageError(f"--output {output}: a .csv holds top-k classes, and {outs} is "
                             "not one vector of class scores per input; give a .jsonl or .npz")
        writer = ResultWriter(output, top_k, echo, append=resume)
        bar = Progress(len(todo), enabled=progress)
        try:
            if ray is not None:
                if ray_runner is None:
                    raise UsageError("--ray needs the distributed runner (runtime/distributed.py)")
                source: Iterator[list[dict]] = ray_runner(
                    bundle, todo, address=None if ray in ("", "local") else ray,
                    workers=workers, top_k=top_k,
                    threads=threads, strict=strict, batch_size=size, raw=not classifier)
            else:
                source = _local(model, todo, size, top_k, strict, classifier, threads or 1)
            for recs in source:
                writer.write(recs)
                bar.advance(len(recs))
                for r in recs:
                    if "error" in r:
                        failed.append((r["path"], r["error"]))
                        if fail_fast:
                            raise InputError(f"{r['path']}: {r['error']} (stopped by "
                                             "--fail-fast)")
        finally:
            bar.close()
            writer.close(model)
            if resume and output is not None:
                order_results(output, paths)
    dt = time.perf_counter() - t0
    summary = {"inputs": len(paths), "skipped": len(paths) - len(todo), "ok":
               len(todo) - len(failed), "failed": len(failed), "seconds": dt,
               "items_per_s": len(todo) / dt if dt > 0 else 0.0}
    if output is not None or failed:
        warn(f"{summary['ok']} of {len(todo)} input(s) done in {dt:.2f} s "
             f"({summary['items_per_s']:.1f} items/s)" +
             (f", {summary['skipped']} already in {output}" if summary["skipped"] else "") +
             (f", {len(failed)} failed" if failed else "") +
             (f"; results in {output}" if output else ""))
    for p, e in failed[:10]:
        warn(f"  failed: {p}: {e}")
    if len(failed) > 10:
        warn(f"  ... and {len(failed) - 10} more (see their lines)")
    if failed:
        raise InputError(f"{len(failed)} of {len(todo)} input(s) failed")
    return summary


def _local(model: Any, todo: list[str], size: int, top_k: int, strict: bool,
           classifier: bool, workers: int = 1) -> Iterator[list[dict]]:
    """Decode batch n+1 on ``workers`` threads while batch n runs."""
    with ThreadPoolExecutor(max(1, workers)) as pool:
        batches = list(_batches(todo, size))

        def submit(b: list[str]) -> list[Any]:
            return [pool.submit(_safe_decode, model, p, strict) for p in b]

        pending = submit(batches[0]) if batches else []
        for n, b in enumerate(batches):
            arrays = [f.result() for f in pending]
            if n + 1 < len(batches):
                pending = submit(batches[n + 1])
            yield predict_records(model, b, arrays, top_k=top_k, classifier=classifier)
