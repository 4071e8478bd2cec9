"""mlcpack: compile ML models ahead of time into one ``.mlc`` bundle (``mlcpack.packager``,
``mlcpack.frontends``) and run bundles with numpy alone (``mlcpack.runtime``).

This file makes ``mlcpack.__version__`` available without importing numpy or the compiler;
``mlcpack.runtime.__version__`` and ``mlcpack.packager.__version__`` are the same release
(tests/runtime/test_session_api.py checks that they agree with pyproject.toml).
"""

__version__ = "0.1.0"


def export(model, path, options=None, **fields):
    """Export the model file ``model`` (``.onnx``, ``.pt2``, pickled weights) to the bundle
    ``path`` as ``mlcpack export`` does: ``options`` is a ``mlcpack.packager.api.Options``, or
    give its fields as keywords (``target="host"``, ``batch_sizes=[1, 8]``...). Returns the
    export's result (``mlcpack.packager.api.ExportResult``); see ``mlcpack.packager.api``."""
    from .packager import api

    if fields:
        import dataclasses

        options = dataclasses.replace(options or api.Options(), **fields)
    return api.export(model, path, options)


def export_torch(module, example_inputs, path, **options):
    """Export a ``torch.nn.Module`` to the bundle ``path``: ``torch.export.export(module,
    example_inputs)``, the PyTorch frontend, the compiler; the golden check runs the module
    itself as the reference. Returns the export report. Needs torch (``pip install
    'mlcpack[torch]'``); see ``mlcpack.packager.torch_export.export_torch`` for the options."""
    from .packager.torch_export import export_torch as export

    return export(module, example_inputs, path, **options)
