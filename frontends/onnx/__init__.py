"""The ONNX frontend: ``import_onnx(path)`` -> (IRModule, ImportInfo).

One converter per ONNX operator, chosen by the model's opset (``registry``); converters are
grouped by family in ``elementwise``, ``nn`` and ``shape``.
"""

from .importer import ImportInfo, check_supported, import_onnx
from .registry import NodeContext, SupportedOp, converter, supported_ops

__all__ = ["ImportInfo", "NodeContext", "SupportedOp", "check_supported", "converter",
           "import_onnx", "supported_ops"]
