"""The PyTorch frontend: ``torch.export`` -> IR, as the course's integration chapter builds an
IRModule from a PyTorch model (graph capture, one converter per node, parameters bound as
constants), reading the ``ExportedProgram`` that ``torch.export.export`` makes.

- ``import_torch(ep_or_path)`` -> (IRModule, TorchImportInfo)
- exporting a module to a bundle is the packager's: ``mlcpack.export_torch`` (in
  ``packager/torch_export.py``; frontends never import the export driver)
- ``load_program("model.pt2")``: a file written by ``torch.export.save``
- ``supported_ops()``: the ATen overloads with a converter (needs no torch)

torch is optional (``pip install 'mlcpack[torch]'``): only this package imports it, and only
when one of these functions runs.
"""

from __future__ import annotations

from ...packager.errors import ExportError
from .converters import supported_ops

TORCH_EXTRA = "pip install 'mlcpack[torch]'"


def require_torch() -> None:
    """Raise a one-line ExportError when torch is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ExportError(f"the PyTorch frontend needs torch, which is not installed: "
                          f"{TORCH_EXTRA}") from None


def import_torch(program, input_shapes=None, input_names=None, output_names=None):
    """An ExportedProgram (or the path of a ``.pt2`` file) -> (IRModule, TorchImportInfo); see
    ``importer.import_exported``."""
    require_torch()
    from .api import import_program
    return import_program(program, input_shapes, input_names, output_names)


def load_program(path):
    """The ExportedProgram saved in ``path`` by ``torch.export.save``."""
    require_torch()
    from .api import load_program as load
    return load(path)


def modules_from_file(path, shapes_by_batch, check=True):
    """``mlcpack export model.pt2``'s modules and reference; see ``api.modules_from_file``."""
    require_torch()
    from .api import modules_from_file as build
    return build(path, shapes_by_batch, check)


__all__ = ["TORCH_EXTRA", "import_torch", "load_program", "modules_from_file",
           "require_torch", "supported_ops"]
