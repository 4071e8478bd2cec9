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


def exact_integer_copy(model):
    """``model`` with the constant int8 weights of its uint8 x int8 integer operators stored as
    uint8 (the same products), or None when no operator has them."""
    from onnx import TensorProto, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    out = type(model)()
    out.CopyFrom(model)
    added = []
    for k, node in enumerate(out.graph.node):
        where = _U8S8_OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if where is None:
            continue
        w_at, wz_at, xz_at = where
        inputs = list(node.input) + [""] * (wz_at + 1 - len(node.input))
        w, xz = inits.get(inputs[w_at]), inits.get(inputs[xz_at])
        wz = inits.get(inputs[wz_at]) if inputs[wz_at] else None
        if w is None or w.data_type != TensorProto.INT8 or xz is None \
                or xz.data_type != TensorProto.UINT8 or (inputs[wz_at] and wz is None):
            continue
        shifted = numpy_helper.to_array(w).astype(np.int16) + 128
        zero = numpy_helper.to_array(wz).astype(np.int16) if wz is not None \
            else np.zeros((), np.int16)
        base = f"{inputs[w_at]}_mlcpack_u8_{k}"
        added += [numpy_helper.from_array(shifted.astype(np.uint8), base),
                  numpy_helper.from_array((zero + 128).astype(np.uint8), f"{base}_zp")]
        inputs[w_at], inputs[wz_at] = base, f"{base}_zp"
        del node.input[:]
        node.input.extend(inputs)
    if not added:
        return None
    out.graph.initializer.extend(added)
    return out
