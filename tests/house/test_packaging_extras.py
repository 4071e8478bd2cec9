"""The optional extras install what the README says: ``mlcpack[torch]`` pins the torch release
the frontend is tested with (the ``test`` extra's pin), and the README names that release and
how the CPU build is chosen on each platform (PyPI's Linux wheel is the CUDA build)."""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _pin(requirements: list[str], name: str) -> str:
    (req,) = [r for r in requirements if re.match(rf"{name}\b", r)]
    match = re.fullmatch(rf"{name}==(\d+(\.\d+)*)", req.replace(" ", ""))
    assert match, f"{req!r}: pin one release (==), the one the tests run"
    return match.group(1)


def test_torch_extra_pins_the_tested_release_and_the_readme_says_how_to_get_the_cpu_build():
    extras = _extras()
    version = _pin(extras["torch"], "torch")
    assert _pin(extras["test"], "torch") == version
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### From PyTorch"):]
    # the release, and the CPU build from PyTorch's index on Linux, in a command to copy
    assert f"pip install torch=={version} --index-url {CPU_INDEX}" in section
    assert f"torch {version}, the release it is tested with" in section
    assert "on macOS and Windows PyPI's wheel is the CPU build" in section
    assert "on Linux it\nis the CUDA build" in section
    row = next(line for line in readme.splitlines() if line.startswith("| torch ("))
    assert row.startswith(f"| torch ({version}, CPU) |") and f"`.[torch]`, torch {version}" in row
    assert CPU_INDEX in row


def test_every_package_folder_is_installed_by_a_plain_pip_install():
    """``pip install .`` (not editable) installs only the packages pyproject.toml lists: a new
    subpackage (codegen/contraction/ when gemm.py was split) missing there imports in an editable
    checkout and fails on a user's install."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in setuptools["package-dir"].items():
        if package == "mlcpack":
            continue
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            parts = init.parent.relative_to(ROOT / folder).parts
            if parts and parts[0] == "mlcpack_top":   # the runtime distribution's own top
                continue
            found.add(".".join([package, *parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
