"""Run a bundle over a Ray Dataset (the optional extra ``mlcpack[ray]``).

``BundlePredictor`` is the callable class Ray Data's ``map_batches`` wants: its ``__init__``
loads the bundle once per actor (from bytes shipped through the object store, or a path every
worker can read), verifies its SHA-256 (and, when given, that it is the expected bundle), and
sizes the kernels' threads from the CPUs Ray gave the actor, never from all host cores. A worker
whose CPU cannot run the bundle refuses at load with the runtime's clear error. ``predict``
wraps it; ``mlcpack infer ... --ray [ADDRESS]`` uses ``run_paths``. Imports no compiler.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any, Iterator, Sequence

import numpy as np


class BundlePredictor:
    """``ds.map_batches(BundlePredictor, fn_constructor_kwargs={"bundle": data}, concurrency=2,
    num_cpus=1)``: each batch's ``column`` holds file paths; the result has ``path``, ``label``,
    ``score``, ``top_k`` (JSON), ``outputs`` (JSON, non-classifiers) and ``error`` (empty when
    the row ran) columns, in the batch's order."""

    def __init__(self, bundle: bytes | str, *, sha256: str | None = None,
                 threads: int | None = None, column: str = "path", top_k: int = 5,
                 strict: bool = False, raw: bool = False) -> None:
        from .errors import BundleError
        from .model import load

        data = bundle if isinstance(bundle, (bytes, bytearray)) else None
        if data is not None:
            digest = hashlib.sha256(data).hexdigest()
            if sha256 is not None and digest != sha256:
                raise BundleError(f"the bundle bytes reaching this worker have SHA-256 {digest}, "
                                  f"expected {sha256}")
            fd, path = tempfile.mkstemp(suffix=".mlc")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        else:
            path = os.fspath(bundle)
        self.threads = threads or _actor_cpus()
        try:
            self.model = load(path, threads=self.threads)  # checks content hash + CPU features
        finally:
            if data is not None:
                os.unlink(path)
        self.column, self.top_k, self.strict = column, top_k, strict
        self.classifier = False if raw else None

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import json

        from .many import _safe_decode, predict_records

        paths = [str(p) for p in batch[self.column]]
        arrays = [_safe_decode(self.model, p, self.strict) for p in paths]
        recs = predict_records(self.model, paths, arrays, top_k=self.top_k,
                               classifier=self.classifier)
        out: dict[str, list] = {"path": [], "label": [], "score": [], "top_k": [],
                                "outputs": [], "error": []}
        for r in recs:
            top = r.get("top_k") or []
            out["path"].append(r["path"])
            out["label"].append(top[0]["label"] if top else "")
            out["score"].append(top[0]["score"] if top else float("nan"))
            out["top_k"].append(json.dumps(top))
            out["outputs"].append(json.dumps({k: np.asarray(v).tolist() for k, v in
                                              r.get("outputs", {}).items()}))
            out["error"].append(r.get("error", ""))
        return {k: np.array(v) for k, v in out.items()}


def _actor_cpus() -> int:
    try:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        return max(1, int(cpus))
    except Exception:  # noqa: BLE001 - outside Ray: one thread
        return 1


def predict(dataset: Any, bundle: str | os.PathLike, *, column: str = "path", top_k: int = 5,
            concurrency: int = 1, num_cpus: float = 1, batch_size: int | None = 32,
            threads: int | None = None, ship: str = "bytes", strict: bool = False,
            raw: bool = False) -> Any:
    """A Ray Dataset of results for ``dataset``'s ``column`` of file paths (see
    ``BundlePredictor``). ``ship="bytes"`` sends the bundle through the object store (read once
    here, hash-checked on each worker); ``ship="path"`` has workers read ``bundle`` themselves
    (a shared file system); ``raw`` gives every model's raw outputs (JSON) instead of top-k."""
    path = os.fspath(bundle)
    if ship == "bytes":
        with open(path, "rb") as f:
            data = f.read()
        kwargs: dict[str, Any] = {"bundle": data, "sha256": hashlib.sha256(data).hexdigest()}
    elif ship == "path":
        kwargs = {"bundle": os.path.abspath(path)}
    else:
        raise ValueError(f"ship must be 'bytes' or 'path', got {ship!r}")
    kwargs.update(column=column, top_k=top_k, threads=threads, strict=strict, raw=raw)
    return dataset.map_batches(BundlePredictor, fn_constructor_kwargs=kwargs,
                               concurrency=concurrency, num_cpus=num_cpus,
                               batch_size=batch_size, batch_format="numpy")


def run_paths(bundle: str | os.PathLike, paths: Sequence[str], *, address: str | None = None,
              workers: int | None = None, top_k: int = 5, threads: int | None = None,
              strict: bool = False, batch_size: int = 32, raw: bool = False
              ) -> Iterator[list[dict]]:
    """``infer --ray``: ``paths`` through ``predict`` on the Ray cluster at ``address`` (a local
    one when None), yielding ``many``'s records in input order."""
    import json

    from .errors import MlcpackError, install_hint

    try:
        import ray
        import ray.data
    except ImportError:
        raise MlcpackError(f"--ray needs Ray: {install_hint('ray')}") from None
    import logging

    logging.getLogger("ray.data").setLevel(logging.ERROR)
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR",
                 **({} if address else {"num_cpus": workers or os.cpu_count() or 1}))
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        ds = ray.data.from_items([{"path": os.path.abspath(p)} for p in paths],
                                 override_num_blocks=max(1, min(len(paths) // batch_size + 1,
                                                                4 * n)))
        res = predict(ds, bundle, top_k=top_k, concurrency=n, threads=threads or 1,
                      batch_size=batch_size, strict=strict, raw=raw)
        back = dict(zip((os.path.abspath(p) for p in paths), paths))
        for b in res.iter_batches(batch_size=batch_size, batch_format="numpy"):
            recs = []
            for i, p in enumerate(b["path"]):
                p = back.get(str(p), str(p))
                if b["error"][i]:   # named as given, as the local run names it
                    error = str(b["error"][i]).replace(os.path.abspath(p), p)
                    recs.append({"path": p, "error": error})
                elif json.loads(str(b["top_k"][i])):
                    recs.append({"path": p, "top_k": json.loads(str(b["top_k"][i]))})
                else:
                    recs.append({"path": p, "outputs": {k: np.asarray(v) for k, v in
                                                        json.loads(str(b["outputs"][i])).items()}})
            yield recs
    finally:
        if started:
            ray.shutdown()
