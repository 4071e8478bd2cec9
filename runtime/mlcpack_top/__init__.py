"""mlcpack, as the runtime distribution installs it (``pip install ./runtime``: the
``mlcpack-runtime`` wheel puts this file at ``mlcpack/__init__.py``). It gives
``mlcpack.__version__``; the package holds ``mlcpack.runtime`` only, and the compiler
(``mlcpack.packager``, ``mlcpack.frontends``, ``export_torch``) comes with the ``mlcpack``
distribution, which ships its own ``mlcpack/__init__.py`` instead of this one.
"""

__version__ = "0.1.0"
