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
