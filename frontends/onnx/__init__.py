"""The ONNX frontend: ``import_onnx(path)`` -> (IRModule, ImportInfo).

One converter per ONNX operator, chosen by the model's opset (``registry``); converters are
grouped by family in the modules ``converters.FAMILIES`` lists (``elementwise``, ``nn``,
``shape``...), and share helpers through ``common``.
"""

from .converters import supported_ops
from .importer import ImportInfo, check_supported, import_onnx
from .registry import NodeContext, SupportedOp, converter

__all__ = ["ImportInfo", "NodeContext", "SupportedOp", "check_supported", "converter",
           "import_onnx", "supported_ops"]
