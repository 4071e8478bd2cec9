"""The IR: graph functions with dataflow blocks, and primitive functions in tensor expressions."""

from . import te
from .builder import BlockBuilder, BuilderError, prim_func
from .graph import (Binding, Call, CallLibrary, CallTIR, Constant, DataflowBlock, Function,
                    IRModule, PrimFunc, Source, TensorType, Var)
from .printer import module_text
from .invariants import VerifyError, verify_module

__all__ = ["BlockBuilder", "BuilderError", "Binding", "Call", "CallLibrary", "CallTIR", "Constant",
           "DataflowBlock", "Function", "IRModule", "PrimFunc", "Source", "TensorType", "Var",
           "VerifyError", "module_text", "prim_func", "te", "verify_module"]
