"""``mlcpack.export_torch``: a ``torch.nn.Module`` (or an ExportedProgram) to a bundle, with the
module itself (eager PyTorch) as the golden check's reference. The PyTorch frontend
(``frontends/torch``) builds the IR; this, the packager's side, compiles and writes it, so the
frontend never imports the export driver. Needs torch (``pip install 'mlcpack[torch]'``)."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from ..frontends.torch import require_torch
from .export import ExportOptions, export_batched, export_module


def export_torch(module: Any, example_inputs: Sequence[Any], path: str | os.PathLike, *,
                 dynamic_shapes: Any = None, input_names: Sequence[str] | None = None,
                 output_names: Sequence[str] | None = None,
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 batch_sizes: Sequence[int] | None = None, check: bool = True,
                 **options: Any) -> Any:
    """Capture ``module`` with ``torch.export.export(module, example_inputs)`` (in eval mode),
    convert it, compile it and write the bundle ``path``. ``module`` may also be an
    ExportedProgram (then ``example_inputs`` is unused). The golden check (on by default) runs
    the module itself, eagerly, as the reference.

    ``dynamic_shapes``: as torch.export's; symbolic dims are fixed at the example's sizes, or
    ``input_shapes``; ``batch_sizes`` compiles one plan per batch size for inputs whose first
    dim is symbolic (the bundle then runs any batch, as ``--batch-sizes``). ``options``: the
    fields of ``packager.export.ExportOptions`` (target, labels, preprocess, sign_key,
    check_inputs, check_rtol, check_atol, model_name...). Returns the ExportReport."""
    require_torch()
    import torch

    from ..frontends.torch.api import (batch_shapes, capture, eager_reference, eval_mode,
                                       import_program)

    with eval_mode(module):
        ep = capture(module, example_inputs, dynamic_shapes)
        is_module = isinstance(module, torch.nn.Module)
        name = type(module).__name__ if is_module else "model"
        source = name if is_module else None   # errors name the module's class
        if batch_sizes:
            mods = {}
            for b in sorted({int(b) for b in batch_sizes}):
                shapes = batch_shapes(ep, b, input_shapes, input_names)
                mods[b], info = import_program(ep, shapes, input_names, output_names, source)
        else:
            mod, info = import_program(ep, input_shapes, input_names, output_names, source)
        runner = module if is_module else ep.module()
        opts = ExportOptions(**{"model_name": name, "source": f"{name} (torch.export)",
                                **options})
        opts.check = check
        if check:
            opts.reference = eager_reference(runner, info.input_names, info.output_names)
            opts.reference_name = opts.reference.name
        if batch_sizes:
            return export_batched(mods, path, opts)
        return export_module(mod, path, opts)
