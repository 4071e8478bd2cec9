"""mlcpack: compile ML models ahead of time into one ``.mlc`` bundle (``mlcpack.packager``,
``mlcpack.frontends``) and run bundles with numpy alone (``mlcpack.runtime``).

This file makes ``mlcpack.__version__`` available without importing numpy or the compiler;
``mlcpack.runtime.__version__`` and ``mlcpack.packager.__version__`` are the same release
(tests/test_session_api.py checks that they agree with pyproject.toml).
"""

__version__ = "0.1.0"
