"""bench/avx2_host.py: the peers see an AVX2 + FMA CPU (cpuid masked), mlcpack picks x86-64-v3."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(sys.platform != "linux" or "avx2" not in _flags()
                    or "cpuid_fault" not in _flags() or shutil.which("cc") is None,
                    reason="needs an x86-64 Linux host with AVX2, CPUID faulting (cpuid_fault) "
                           "and a C compiler")
def test_cpuid_mask_hides_avx512_from_numpy_and_picks_v3():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "avx2_host.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "numpy AVX512F False AVX2 True" in out.stdout
    assert "mlcpack best level x86-64-v3" in out.stdout
    if "openvino" in out.stdout:
        assert "BF16" not in out.stdout.split("openvino", 1)[1]
