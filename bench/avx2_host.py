"""Run a command as if on an AVX2 + FMA host (no AVX-512, no VNNI, no BF16), on an AVX-512 one.

    .venv/bin/python bench/avx2_host.py [--check] -- COMMAND [ARGS ...]
    e.g. .venv/bin/python bench/avx2_host.py -- .venv/bin/python bench/int8.py --no-models \\
             --corpus ppocr_cls

The development hosts alternate between AVX2-only and AVX-512 machines, and issue 33 has
targets for each. The peers choose their kernels by the ``cpuid`` instruction (ONNX Runtime's
MLAS, OpenVINO's oneDNN, numpy), so this runs COMMAND with:

- ``LD_PRELOAD`` of bench/cpuid_mask.c (compiled here with ``cc`` into
  ``~/.cache/mlcpack-bench/``): it turns on Linux CPUID faulting (``arch_prctl
  ARCH_SET_CPUID``; the host needs the ``cpuid_fault`` flag) and answers ``cpuid`` with the
  AVX-512, AVX-VNNI and AMX bits cleared (and the ZMM / opmask state bits of leaf 0xD);
- ``MLCPACK_CPU_FEATURES``: this host's /proc/cpuinfo flags without ``avx512*``, ``avx_vnni``
  and ``amx*`` (runtime/cpu.py), so ``--target host`` exports x86-64-v3 code and bundles run
  their v3 variant.

What it is not: an AVX2 machine. The core, its caches and clock are this one's (Zen 5 runs
256-bit code at its own rates), and glibc picked its string functions before the shim loaded.
Use it to see which kernels each engine picks without AVX-512 and to compare engines in one
process; numbers for an issue's AVX2 target say they were taken this way. The scripts' own
"host flags" lines read /proc/cpuinfo and still list AVX-512: this prints the emulated set
first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HIDDEN_PREFIXES = ("avx512", "avx_vnni", "amx")


def host_flags() -> list[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return line.split(":", 1)[1].split()
    return []


def build_shim() -> Path:
    src = HERE / "cpuid_mask.c"
    out = Path.home() / ".cache" / "mlcpack-bench" / "cpuid_mask.so"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="print what numpy and OpenVINO see under the mask, then exit")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    flags = host_flags()
    if "cpuid_fault" not in flags:
        print("error: this host has no cpuid_fault flag (Linux CPUID faulting), so cpuid "
              "cannot be masked here", file=sys.stderr)
        return 2
    kept = [f for f in flags if not f.startswith(HIDDEN_PREFIXES)]
    env = dict(os.environ, LD_PRELOAD=str(build_shim()), MLCPACK_CPU_FEATURES=",".join(kept))
    vector = sorted(f for f in kept if f in ("avx", "avx2", "fma", "f16c", "sse4_2"))
    print(f"emulated AVX2 host: cpuid without {sorted(f for f in flags if f.startswith(HIDDEN_PREFIXES))}; "
          f"vector flags left: {' '.join(vector)}", flush=True)
    if args.check or not command:
        probe = ("import numpy; from numpy._core._multiarray_umath import __cpu_features__ as f; "
                 "print('numpy AVX512F', f['AVX512F'], 'AVX2', f['AVX2']);\n"
                 "try:\n import openvino as ov; c = ov.Core(); "
                 "print('openvino', c.get_property('CPU', 'OPTIMIZATION_CAPABILITIES'), "
                 "c.get_property('CPU', 'INFERENCE_PRECISION_HINT'))\n"
                 "except ImportError: pass\n"
                 "from mlcpack.runtime import cpu; print('mlcpack best level', cpu.best_level())")
        command = [sys.executable, "-c", probe]
    return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
