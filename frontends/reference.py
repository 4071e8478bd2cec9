"""The golden check's references: run the source model with an engine other than mlcpack.

- ONNX models: ``onnx_reference``, ONNX Runtime when it is installed (it may refuse an export;
  onnx's ReferenceEvaluator is its second opinion), else the ReferenceEvaluator as advice only.
  ONNX Runtime's u8 x s8 integer kernel saturates on AVX2 without VNNI, so a model with such
  operators runs as an exact copy (``exact_integers``, ``onnx/exact_reference.py``).
- PyTorch programs: the module run eagerly (``frontends/torch/api.py``).

The golden check itself (``packager/golden.py``) runs a ``Reference`` and compares. Test hook:
``MLCPACK_NO_ORT=1`` makes ``onnx_reference`` behave as if onnxruntime were not installed.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import numpy as np

NO_ORT_ENV = "MLCPACK_NO_ORT"   # test hook: "1" hides onnxruntime from the golden check


class ReferenceUnavailable(Exception):
    """The reference cannot evaluate this model (the check is skipped, and says so)."""


class Reference:
    """A golden-check reference: ``run(feeds) -> outputs`` (bundle names). ``refuses``: a
    disagreement with it fails the export; False for advice only (onnx.reference)."""

    def __init__(self, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
                 name: str, refuses: bool = True, second: Reference | None = None,
                 fork_safe: bool = False, identity: str | None = None) -> None:
        self.run, self.name, self.refuses, self.second = run, name, refuses, second
        # runs in a forked worker beside the compile (packager/export.py): true of references
        # that start their engine per run (ONNX Runtime, onnx.reference), not of one whose
        # engine already runs threads here (PyTorch's OpenMP pool does not survive a fork)
        self.fork_safe = fork_safe
        # what its outputs are a function of besides the feeds (the engine and its version,
        # the model's bytes, the fixed feeds), as a digest: the golden cache
        # (packager/golden_cache.py) keeps the outputs of a reference that has one
        self.identity = identity

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(feeds)


def onnx_reference(model_path: str | os.PathLike | bytes, input_names: Mapping[str, str],
                   fixed: Mapping[str, np.ndarray] | None = None) -> tuple[Reference, str]:
    """A reference for an ONNX file: onnxruntime if it imports (it may refuse the export; onnx's
    ReferenceEvaluator is its second opinion), else the ReferenceEvaluator as advice only
    (``refuses`` False: see the module docstring). ``input_names`` maps ONNX input names to the
    bundle's. ``model_path`` may be the model's serialized bytes. ``fixed``: graph inputs that
    ``--bind`` made constants (ONNX name -> array), fed to the reference with every run, since
    the ONNX file still takes them. Returns (reference, name)."""
    source = model_path if isinstance(model_path, bytes) else os.fspath(model_path)
    to_onnx = {bundle: onnx_name for onnx_name, bundle in input_names.items()}
    fixed = dict(fixed or {})
    model_digest = _model_digest(source, to_onnx, fixed)

    def onnx_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {**fixed, **{to_onnx.get(k, k): v for k, v in feeds.items()}}

    def run_ref(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            import onnx
            from onnx.reference import ReferenceEvaluator

            ev = ReferenceEvaluator(onnx.load_from_string(source) if isinstance(source, bytes)
                                    else source, new_ops=spec_ops())
            values = ev.run(None, onnx_feeds(feeds))
        except Exception as exc:
            raise ReferenceUnavailable(f"onnx's ReferenceEvaluator cannot run it "
                                       f"({' '.join(str(exc).split())[:200]})") from None
        return dict(zip(ev.output_names, values))

    advice = Reference(run_ref, "onnx.reference", refuses=False, fork_safe=True,
                       identity=_identity("onnx", model_digest))
    ort = _onnxruntime()
    if ort is None:
        return advice, advice.name

    parsed = _parse(source)   # once for both questions
    as_written = _has_qdq(parsed if parsed is not None else source)
    exact = exact_integers(parsed if parsed is not None else source)
    session_source = exact if exact is not None else source

    def run_ort(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            opts = ort.SessionOptions()
            opts.log_severity_level = 4  # its errors come back in the exception
            # one thread: with more, ORT's DynamicQuantizeLSTM quantizes h per chunk of batch
            # rows, so its result would depend on the machine's core count
            opts.intra_op_num_threads = 1
            if as_written:
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            sess = ort.InferenceSession(session_source, opts,
                                        providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            run_opts = ort.RunOptions()
            run_opts.log_severity_level = 4
            values = sess.run(names, onnx_feeds(feeds), run_opts)
        except Exception as exc:
            raise ReferenceUnavailable(f"onnxruntime cannot run it "
                                       f"({' '.join(str(exc).split())[:200]})") from None
        return dict(zip(names, values))

    name = f"onnxruntime {ort.__version__}" + (" (the graph as written)" if as_written else "")
    if exact is not None:
        name += " (int8 weights of integer operators as uint8: exact on every CPU)"
    return Reference(run_ort, name, second=advice, fork_safe=True,
                     identity=_identity("onnxruntime", model_digest, name)), name


def spec_ops() -> list:
    """Two operators that onnx's ReferenceEvaluator (1.22) runs otherwise than the ONNX spec
    says, on inputs real models give, as the spec says; the rest is onnx's own. Without
    them it disagreed with ONNX Runtime and mlcpack on every Paddle model and every Keras
    (tf2onnx) model with a convolution, and its advice was a false alarm there:

    - ``Conv`` with ``auto_pad``: VALID is padded as SAME, and SAME takes its pads from the
      batch and channel dims instead of the spatial ones (MTCNN's P-Net: an 8x8 map where
      the model gives 3x3). The pads are computed here as the spec says, and Conv runs with
      them explicit.
    - ``BatchNormalization`` 9-14 with a ``momentum`` attribute (Paddle writes one on every
      node): run with the batch's own statistics, as in training, although a node with the
      one output Y is in test mode by the spec (PP-OCR's classifier: 0.73 where ONNX
      Runtime gives 0.06). A node with one output runs in test mode here; one in training
      mode is not run (no advice)."""
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops.op_batch_normalization import _batchnorm_test_mode
    from onnx.reference.ops_optimized.op_conv_optimized import Conv as _Conv

    class Conv(_Conv):
        def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None,  # noqa: N803
                 kernel_shape=None, pads=None, strides=None):
            if auto_pad in ("VALID", "SAME_UPPER", "SAME_LOWER"):
                n = X.ndim - 2
                kernel_shape = list(kernel_shape or W.shape[2:])
                strides, dilations = list(strides or [1] * n), list(dilations or [1] * n)
                head, tail = [0] * n, [0] * n
                for i in range(n if auto_pad != "VALID" else 0):
                    size = X.shape[2 + i]
                    span = (kernel_shape[i] - 1) * dilations[i] + 1
                    need = max(0, (-(-size // strides[i]) - 1) * strides[i] + span - size)
                    head[i] = need // 2 if auto_pad == "SAME_UPPER" else need - need // 2
                    tail[i] = need - head[i]
                auto_pad, pads = "NOTSET", head + tail
            return super()._run(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides)

    class BatchNormalization(OpRun):
        def _run(self, x, scale, bias, mean, var, **attrs):
            if len(self.onnx_node.output) == 1 and not attrs.get("training_mode"):
                epsilon = attrs.get("epsilon")
                return (_batchnorm_test_mode(x, scale, bias, mean, var,
                                             epsilon=1e-5 if epsilon is None else epsilon
                                             ).astype(x.dtype),)
            raise RuntimeError("BatchNormalization in training mode (several outputs)")

    return [Conv, BatchNormalization]


def _model_digest(source: str | bytes, to_onnx: Mapping[str, str],
                  fixed: Mapping[str, np.ndarray]) -> str | None:
    """SHA-256 of the model's bytes, the input names and the fixed feeds (None when the file
    cannot be read: then nothing is cached)."""
    import hashlib

    h = hashlib.sha256()
    try:
        if isinstance(source, bytes):
            h.update(source)
        else:
            with open(source, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    except OSError:
        return None
    h.update(repr(sorted(to_onnx.items())).encode())
    for name in sorted(fixed):
        value = np.ascontiguousarray(fixed[name])
        h.update(f"\0{name}\0{value.dtype}\0{value.shape}\0".encode() + value.tobytes())
    return h.hexdigest()


def _identity(engine: str, model_digest: str | None, name: str = "") -> str | None:
    """The engine's name and version, and the model's digest."""
    if model_digest is None:
        return None
    from importlib import metadata

    try:
        version = metadata.version(engine)
    except metadata.PackageNotFoundError:
        version = "?"
    return f"{engine} {version}; {name}; {model_digest}"


def _has_qdq(source: str | bytes | Any) -> bool:
    """Whether the model quantizes with QuantizeLinear/DequantizeLinear pairs. ONNX Runtime
    fuses those into its own integer kernels, and its u8 x s8 kernel on AVX2 without VNNI
    saturates int16 pair sums (255 * 127 * 2 > 32767): several quantization steps off the
    model as ONNX defines it, which mlcpack computes exactly. The reference then runs the
    graph as written (graph optimizations off), on every CPU alike. ``source`` may be the
    parsed ModelProto."""
    from .onnx import proto

    model = _parse(source, load_external_data=False)
    if model is None:
        return False
    graphs, ops = [model.graph], set()
    while graphs:
        g = graphs.pop()
        for node in g.node:
            ops.add(node.op_type)
            graphs.extend(a.g for a in node.attribute if a.type == proto.AttributeProto.GRAPH)
    return bool({"QuantizeLinear", "DequantizeLinear"} & ops)


def _parse(source: str | bytes | Any, load_external_data: bool = True) -> Any:
    """The ModelProto of a path or serialized bytes (``source`` itself when parsed already),
    read without ``import onnx`` (``onnx/proto.py``); None when it cannot be read (the import
    has read it already: no reason to refuse here)."""
    from .onnx import proto

    if isinstance(source, proto.ModelProto):
        return source
    try:
        return proto.load_model_from_string(source) if isinstance(source, bytes) else \
            proto.load_model(source, load_external_data=load_external_data)
    except Exception:  # noqa: BLE001
        return None


def _onnxruntime() -> Any:
    """The onnxruntime module, or None when it is not installed (or ``MLCPACK_NO_ORT=1``)."""
    if os.environ.get(NO_ORT_ENV, "") not in ("", "0"):
        return None
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def exact_integers(source: str | bytes | Any) -> bytes | None:
    """The model with the int8 weights of its u8 x s8 integer operators made uint8
    (``exact_reference.py``: ONNX Runtime's u8 x s8 kernel saturates on AVX2 without VNNI),
    serialized; None when it has none. ``source`` may be the parsed ModelProto."""
    from .onnx.exact_reference import exact_integer_copy, has_u8s8_candidates

    model = _parse(source)
    if model is None or not has_u8s8_candidates(model):
        return None
    exact = exact_integer_copy(model)
    return None if exact is None else exact.SerializeToString()
