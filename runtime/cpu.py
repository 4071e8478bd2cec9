"""Host CPU architecture, features, and the instruction-set levels bundles are built for.

Feature names follow Linux ``/proc/cpuinfo`` ("avx512f", "sse4_2", "asimddp"). The compiler
side reads each level's LLVM triple, CPU name and feature string from ``LEVELS``; the runtime
compares a level's cpuinfo flags with the host's before any code is mapped, because code built
for a missing feature dies with "Illegal instruction" rather than a Python exception.

``MLCPACK_CPU_FEATURES`` (comma-separated flags) and ``MLCPACK_CPU_ARCH`` override detection,
so tests can simulate an older or foreign CPU.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

from .errors import BundleError, CpuFeatureError

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8": "aarch64"}

# LLVM / compiler spellings of a few flags, mapped to their /proc/cpuinfo names.
_FLAG_ALIASES = {
    "sse3": "pni", "lzcnt": "abm", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "bmi": "bmi1",
    "neon": "asimd", "dotprod": "asimddp", "fp-armv8": "fp",
}

TRIPLES = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu"}


@dataclass(frozen=True)
class Level:
    """One instruction-set level: what LLVM is told, and which cpuinfo flags a host needs."""

    name: str
    arch: str
    llvm_cpu: str
    llvm_features: str
    flags: frozenset[str]

    @property
    def triple(self) -> str:
        return TRIPLES[self.arch]


V4_FEATURES = "-prefer-256-bit,+prefer-no-scatter"
"""LLVM features of every x86-64-v4 level: 512-bit vectors in auto-vectorized loops, and no
scatters of the vectorizer's own (see the rows below)."""


def _levels() -> tuple[Level, ...]:
    # Each row adds flags to the row before it on the same architecture.
    rows = [
        ("x86-64", "x86_64", "x86-64", "", "fpu cx8 cmov fxsr mmx sse sse2"),
        ("x86-64-v2", "x86_64", "x86-64-v2", "", "cx16 lahf_lm popcnt sse4_1 sse4_2 ssse3 pni"),
        ("x86-64-v3", "x86_64", "x86-64-v3", "",
         "avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"),
        # LLVM's generic v4 tuning keeps auto-vectorized loops at 256 bits; the matmul kernels
        # use 512-bit vectors anyway, and the rest (GELU, softmax, norms) gain ~30% from them.
        # It also takes AVX-512's scatters as cheap, and vectorizes a strided copy (a Concat
        # or Split of 20x20 planes) across rows with vgatherdps + vscatterdps: 5x slower than
        # the row copy on Zen 4. No scatters (gathers stay: strided reductions and transposes
        # lose up to 1.8x without them; measured on YOLOv8n and Magika).
        ("x86-64-v4", "x86_64", "x86-64-v4", V4_FEATURES,
         "avx512f avx512bw avx512cd avx512dq avx512vl"),
        # v4 with AVX-512 VNNI (vpdpbusd): the integer kernels (codegen/qgemm.py) use it
        ("x86-64-v4+vnni", "x86_64", "x86-64-v4", V4_FEATURES + ",+avx512vnni", "avx512_vnni"),
        # v4 with vdpbf16ps: the bf16 matmul kernel (--precision bf16; codegen/bf16dot.py).
        # A portable export includes it for --precision bf16 only (codegen/target.py). Every
        # CPU with avx512_bf16 has avx512_vnni (Cooper Lake, Sapphire Rapids, Zen 4), so the
        # level follows v4+vnni and keeps its integer kernels.
        ("x86-64-v4+bf16", "x86_64", "x86-64-v4", V4_FEATURES + ",+avx512vnni,+avx512bf16",
         "avx512_bf16"),
        ("aarch64", "aarch64", "generic", "+neon", "asimd fp"),
        ("aarch64+dotprod", "aarch64", "generic", "+neon,+dotprod", "asimddp"),
        # FEAT_BF16 (HWCAP2_BF16: bfdot, bfmmla, bfcvt): the bf16 matmul and convolution
        # (--precision bf16; codegen/bf16dot.py, bf16conv.py). Every core with it (Neoverse
        # V1/N2/V2, Cortex-A510/A710 on, Apple M2 on) has dotprod too, so it follows that level.
        ("aarch64+bf16", "aarch64", "generic", "+neon,+dotprod,+bf16", "bf16"),
    ]
    levels: list[Level] = []
    for name, arch, cpu, features, flags in rows:
        before = [lv for lv in levels if lv.arch == arch]
        inherited = before[-1].flags if before else frozenset()
        levels.append(Level(name, arch, cpu, features, inherited | frozenset(flags.split())))
    return tuple(levels)


LEVELS: tuple[Level, ...] = _levels()
"""Instruction-set levels, lowest first within each architecture."""

_BY_NAME = {lv.name: lv for lv in LEVELS}


def level(name: str) -> Level:
    """The level called ``name`` ("x86-64-v3"...); raises ``KeyError`` for an unknown name."""
    return _BY_NAME[name]


def _normalize_arch(machine: str) -> str:
    machine = machine.strip().lower()
    return _ARCH_ALIASES.get(machine, machine)


def _normalize_flags(flags: object) -> frozenset[str]:
    names = (str(f).strip().lower() for f in flags)  # type: ignore[attr-defined]
    return frozenset(_FLAG_ALIASES.get(n, n) for n in names if n)


def host_arch() -> str:
    """This machine's architecture, "x86_64" or "aarch64" (``MLCPACK_CPU_ARCH`` overrides)."""
    override = os.environ.get("MLCPACK_CPU_ARCH")
    if override is not None:
        return _normalize_arch(override)
    return _normalize_arch(platform.machine())


# AArch64 Linux hwcap bits (asm/hwcap.h) in cpuinfo naming: AT_HWCAP, then AT_HWCAP2.
_HWCAP = {0: "fp", 1: "asimd", 3: "aes", 4: "pmull", 5: "sha1", 6: "sha2", 7: "crc32",
          8: "atomics", 9: "fphp", 10: "asimdhp", 12: "asimdrdm", 13: "jscvt", 14: "fcma",
          15: "lrcpc", 17: "sha3", 20: "asimddp", 21: "sha512", 22: "sve", 23: "asimdfhm"}
_HWCAP2 = {1: "sve2", 13: "i8mm", 14: "bf16"}
_AT_HWCAP, _AT_HWCAP2 = 16, 26


def _aarch64_hwcaps() -> frozenset[str]:
    """Features from the kernel's auxiliary vector: what AArch64 code should trust (Android may
    hide /proc/cpuinfo, and qemu-user shows the host's file but emulates the hwcaps)."""
    import ctypes

    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return frozenset()
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    found = set()
    for at, table in ((_AT_HWCAP, _HWCAP), (_AT_HWCAP2, _HWCAP2)):
        bits = getauxval(at)
        found.update(name for bit, name in table.items() if bits >> bit & 1)
    return frozenset(found)


@functools.cache
def _detected_features() -> frozenset[str]:
    if _normalize_arch(platform.machine()) == "aarch64":
        hwcaps = _aarch64_hwcaps()
        if hwcaps:
            return hwcaps
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return frozenset()  # not Linux: nothing is known, so only the baseline is assumed
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return _normalize_flags(rest.split())
    return frozenset()


def host_features() -> frozenset[str]:
    """This CPU's feature flags in cpuinfo naming (``MLCPACK_CPU_FEATURES`` overrides)."""
    override = os.environ.get("MLCPACK_CPU_FEATURES")
    if override is not None:
        return _normalize_flags(override.replace(",", " ").split())
    return _detected_features()


def best_level(arch: str | None = None, features: frozenset[str] | set[str] | None = None
               ) -> str | None:
    """The highest level of ``arch`` whose flags ``features`` all has (defaults: this host)."""
    arch = _normalize_arch(arch) if arch else host_arch()
    have = host_features() if features is None else _normalize_flags(features)
    best = None
    for lv in LEVELS:
        if lv.arch == arch and lv.flags <= have:
            best = lv.name
    return best


def _needs(arch: str, level_name: str, features: list[str]) -> frozenset[str] | None:
    """Every flag a variant needs, or None when its level is unknown and it lists no flags."""
    extra = _normalize_flags(features)
    lv = _BY_NAME.get(level_name)
    if lv is None or lv.arch != arch:
        return extra or None
    return lv.flags | extra


def _advice(host: str, same_arch: bool = True) -> str:
    """The fix for a refused bundle: a target this host has (never a level it lacks); the
    default portable target only when the bundle was made for this architecture (exported on a
    machine of another one, the default would target that one again)."""
    best = best_level(host)
    if best is None:
        return f"this {host} CPU cannot run mlcpack code"
    if not same_arch:
        return f"export again with --target {best}"
    return f"export again with --target {best} or the default portable target"


def _host_description(host: str) -> str:
    best = best_level(host)
    return f"this CPU is {best}" if best else f"this {host} CPU lacks even the baseline level"


def check_supported(required_arch: str, required_level: str, required_features: list[str],
                    bundle_name: str) -> None:
    """Raise ``CpuFeatureError`` unless this host can run code built for the given target.

    ``required_features`` are cpuinfo flags beyond the level's own. The message is one line
    naming what is missing and the fix.
    """
    host = host_arch()
    arch = _normalize_arch(required_arch)
    if arch != host:
        raise CpuFeatureError(f"{bundle_name} holds code for {arch}; this machine is {host}: "
                              f"{_advice(host, same_arch=False)}")
    needs = _needs(arch, required_level, list(required_features))
    if needs is None:
        raise CpuFeatureError(f"{bundle_name} was built for unknown instruction-set level "
                              f"{required_level!r}; this runtime cannot check it: update mlcpack "
                              f"or {_advice(host)}")
    missing = needs - host_features()
    if missing:
        raise CpuFeatureError(f"{bundle_name} was built for {required_level} (needs "
                              f"{', '.join(sorted(missing))}); {_host_description(host)}: "
                              f"{_advice(host)}")


def _rank(arch: str, level_name: str) -> int:
    lv = _BY_NAME.get(level_name)
    return LEVELS.index(lv) if lv is not None and lv.arch == arch else -1


def pick_variant(variants: list[dict], bundle_name: str = "the bundle") -> int:
    """Index of the best code variant this host runs: the one needing the most features.

    Each variant has "arch", "level" and "features" (cpuinfo flags beyond the level's). Raises
    ``CpuFeatureError`` naming what each variant needs when none runs here, and
    ``BundleError`` for a malformed variant.
    """
    host, have = host_arch(), host_features()
    best: tuple[int, int, int] | None = None  # (feature count, level rank, -index)
    reasons = []
    for i, var in enumerate(variants):
        if not isinstance(var, dict) or not isinstance(var.get("arch"), str) \
                or not isinstance(var.get("level"), str) \
                or not isinstance(var.get("features", []), (list, tuple)):
            raise BundleError(f"{bundle_name}: code variant {i} is malformed "
                              f"(needs arch, level, features): export it again")
        arch, level_name = _normalize_arch(var["arch"]), var["level"]
        if arch != host:
            reasons.append(f"{level_name} is for {arch} machines")
            continue
        needs = _needs(arch, level_name, list(var.get("features", [])))
        if needs is None:
            reasons.append(f"{level_name} is unknown to this runtime")
            continue
        missing = needs - have
        if missing:
            reasons.append(f"{level_name} needs {', '.join(sorted(missing))}")
            continue
        key = (len(needs), _rank(arch, level_name), -i)
        if best is None or key > best:
            best = key
    if best is None:
        what = "; ".join(reasons) if reasons else "it has no code variants"
        same_arch = any(isinstance(v, dict) and _normalize_arch(str(v.get("arch"))) == host
                        for v in variants)
        raise CpuFeatureError(f"no code in {bundle_name} runs on this {host} CPU ({what}); "
                              f"{_host_description(host)}: {_advice(host, same_arch)}")
    return -best[2]
