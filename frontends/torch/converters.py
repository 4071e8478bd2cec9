"""The one list of PyTorch (ATen) converter families. Importing this module registers every
converter (each family registers its own with ``@converter`` when imported); the importer and
``supported_ops`` both go through it. The families import no torch."""

from __future__ import annotations

from . import attention, elementwise, nn, rnn, shape
from .registry import registered_ops

FAMILIES = (elementwise, nn, shape, attention, rnn)


def supported_ops() -> list[str]:
    """Every ATen overload mlcpack converts, sorted."""
    return registered_ops()
