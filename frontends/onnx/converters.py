"""The one list of ONNX converter families. Importing this module registers every converter
(each family registers its own with ``@converter`` when imported); the importer and
``supported_ops`` both go through it, so they cannot disagree about what is supported."""

from __future__ import annotations

from . import (attention, dynamic, elementwise, index, logic, nn, quant, quant_ops, resize, rnn,
               sequences, shape, trees, windows)
from .registry import SupportedOp, registered_ops

FAMILIES = (elementwise, logic, nn, shape, index, dynamic, resize, attention, rnn, quant,
            quant_ops, trees, windows, sequences)


def supported_ops() -> list[SupportedOp]:
    """Every ONNX operator mlcpack converts, sorted by domain and name."""
    return registered_ops()
