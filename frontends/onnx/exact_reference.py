"""ONNX models rewritten so that ONNX Runtime computes their integers exactly, for the golden
check's reference. ONNX Runtime's u8 x s8 integer kernel on x86 CPUs with AVX2 and without VNNI
(``vpmaddubsw``) saturates the int16 sum of two products (255 * 127 * 2 > 32767), so on such a
CPU QLinearConv, QLinearMatMul, QGemm, ConvInteger and MatMulInteger with uint8 activations
and int8 weights differ from the ONNX definition (a QOperator copy of PP-OCR's classifier:
0.668 against the exact 0.398 on a real text line). Its u8 x u8 kernel is exact on every CPU,
and int8 weights stored as uint8 ``w + 128`` with zero point ``zp + 128`` give the same
products, so the copy below is the same model, run exactly.
"""

from __future__ import annotations

import numpy as np

# (domain, op) -> (weight input, weight zero point input, activation zero point input)
_U8S8_OPS = {("", "QLinearConv"): (3, 5, 2), ("", "QLinearMatMul"): (3, 5, 2),
             ("com.microsoft", "QGemm"): (3, 5, 2), ("", "ConvInteger"): (1, 3, 2),
             ("", "MatMulInteger"): (1, 3, 2)}


def has_u8s8_candidates(model) -> bool:
    """Whether ``model``'s top-level graph has an operator ``exact_integer_copy`` may change."""
    return any((n.domain if n.domain != "ai.onnx" else "", n.op_type) in _U8S8_OPS
               for n in model.graph.node)


def _u8s8_nodes(model) -> list[tuple[int, list[str], int, int]]:
    """(node index, its inputs padded to the weight zero point, weight input, weight zero point
    input) of every top-level operator with constant int8 weights and a constant uint8
    activation zero point: read from the initializers' data types, nothing decoded."""
    from .proto import TensorProto

    inits = {t.name: t for t in model.graph.initializer}
    found = []
    for k, node in enumerate(model.graph.node):
        where = _U8S8_OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if where is None:
            continue
        w_at, wz_at, xz_at = where
        inputs = list(node.input) + [""] * (wz_at + 1 - len(node.input))
        w, xz = inits.get(inputs[w_at]), inits.get(inputs[xz_at])
        if w is None or w.data_type != TensorProto.INT8 or xz is None \
                or xz.data_type != TensorProto.UINT8 or (inputs[wz_at]
                                                          and inputs[wz_at] not in inits):
            continue
        found.append((k, inputs, w_at, wz_at))
    return found


def _uint8_tensor(values: np.ndarray, name: str):
    """A raw-data uint8 TensorProto (``numpy_helper.from_array`` without importing onnx)."""
    from .proto import TensorProto

    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.UINT8
    t.dims.extend(values.shape)
    t.raw_data = np.ascontiguousarray(values, np.uint8).tobytes()
    return t


def exact_integer_copy(model):
    """``model`` with the constant int8 weights of its uint8 x int8 integer operators stored as
    uint8 (the same products), or None when no operator has them (then the model is neither
    copied nor decoded: a dynamically quantized model's uint8 weights need nothing)."""
    from .proto import to_array

    found = _u8s8_nodes(model)
    if not found:
        return None
    inits = {t.name: t for t in model.graph.initializer}
    out = type(model)()
    out.CopyFrom(model)
    added = []
    for k, inputs, w_at, wz_at in found:
        node = out.graph.node[k]
        w = inits[inputs[w_at]]
        wz = inits[inputs[wz_at]] if inputs[wz_at] else None
        shifted = to_array(w).astype(np.int16) + 128
        zero = to_array(wz).astype(np.int16) if wz is not None else np.zeros((), np.int16)
        base = f"{inputs[w_at]}_mlcpack_u8_{k}"
        added += [_uint8_tensor(shifted.astype(np.uint8), base),
                  _uint8_tensor((zero + 128).astype(np.uint8), f"{base}_zp")]
        inputs = list(inputs)
        inputs[w_at], inputs[wz_at] = base, f"{base}_zp"
        del node.input[:]
        node.input.extend(inputs)
    out.graph.initializer.extend(added)
    return out
