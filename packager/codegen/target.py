"""Code generation targets: a triple, an LLVM CPU and features, and the host flags they need.

The level table itself lives in the runtime (``mlcpack.runtime.cpu.LEVELS``) so both sides agree
on what a level means; the packager may import the runtime, never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...runtime import cpu


LEVEL_NAMES = tuple(lv.name for lv in cpu.LEVELS)


class TargetError(Exception):
    """The named target is unknown or this host cannot be described as one."""


@dataclass(frozen=True)
class Target:
    name: str            # the level name recorded in the bundle, e.g. "x86-64-v4"
    arch: str            # "x86_64" or "aarch64"
    triple: str
    llvm_cpu: str
    llvm_features: str
    required_flags: tuple[str, ...]   # host /proc/cpuinfo flags the code may use

    def to_record(self) -> dict:
        """The code variant's target as the bundle records it; ``features`` lists cpuinfo flags
        needed beyond the level's own (none for a plain level)."""
        return {"arch": self.arch, "level": self.name, "features": [], "triple": self.triple,
                "cpu": self.llvm_cpu, "llvm_features": self.llvm_features}


def _from_level(name: str) -> Target:
    level = cpu.level(name)
    return Target(name, level.arch, level.triple, level.llvm_cpu, level.llvm_features,
                  tuple(sorted(level.flags)))


# Levels whose code differs from the level below only under ``--precision bf16``
# (codegen/bf16dot.py): a portable export includes them for bf16 only, so an fp32 export on an
# avx512_bf16 host does not carry a second, identical x86-64-v4 variant.
BF16_LEVELS = frozenset({"x86-64-v4+bf16", "aarch64+bf16"})


def has_bf16_dot(targets) -> bool:
    """Whether a target set multiplies bf16 with a dot instruction: all x86-64 with
    x86-64-v4+bf16 among them (vdpbf16ps), or all aarch64 with aarch64+bf16 (bfdot). The
    bundle's other levels then widen the same pair-packed weights (codegen/bf16dot.py)."""
    names = {t.name for t in targets}
    return any(level in names and all(t.arch == cpu.level(level).arch for t in targets)
               for level in BF16_LEVELS)


def resolve_target(name: str | None, precision: str = "fp32") -> Target:
    """``None`` or "host": the best level this machine supports (a ``BF16_LEVELS`` one for
    ``precision`` "bf16" only); else a level name such as ``x86-64-v3`` or ``aarch64``."""
    if name in (None, "", "host"):
        best = cpu.best_level()
        if best in BF16_LEVELS and precision != "bf16":
            names = [lv.name for lv in cpu.LEVELS if lv.arch == cpu.host_arch()]
            best = names[names.index(best) - 1]
        if best is None:
            raise TargetError(f"this {cpu.host_arch()} CPU matches no known level; "
                              f"name one with --target ({', '.join(LEVEL_NAMES)})")
        return _from_level(best)
    aliases = {"x86_64": "x86-64", "arm64": "aarch64"}
    name = aliases.get(name, name)
    if name not in LEVEL_NAMES:
        raise TargetError(f"unknown target {name!r}; choose one of: portable, host, "
                          f"{', '.join(LEVEL_NAMES)}")
    return _from_level(name)


# Levels whose code differs from the level below only in the integer kernels (codegen/qgemm.py
# and qdepthwise.py: vpdpbusd): an export drops them where the level below is also a target and
# the model has no qmatmul / qconv2d / qdwconv2d (``drop_idle_levels``), so an fp32 export on a
# VNNI host does not carry a second, identical x86-64-v4 variant.
INT8_LEVELS = frozenset({"x86-64-v4+vnni"})


def drop_idle_levels(targets: list[Target], funcs) -> list[Target]:
    """``targets`` without the ``INT8_LEVELS`` ones whose level below is a target too, when
    none of the prim funcs ``funcs`` is an integer kernel."""
    from .qgemm import match_qgemm

    names = {t.name for t in targets}
    idle = [t for t in targets if t.name in INT8_LEVELS
            and LEVEL_NAMES[LEVEL_NAMES.index(t.name) - 1] in names]
    kinds = ("qmatmul", "qconv2d", "qdwconv2d")
    # sized: a kernel with run-time image sizes counts (open-dims int8 bundles); chain: one
    # with an elementwise chain fused after it (codegen/qchain.py)
    if not idle or any(match_qgemm(f, kinds, sized=True, chain=True) is not None
                       for f in funcs):
        return targets
    return [t for t in targets if t not in idle]


def quad_arch(targets, emulate: bool = False) -> str:
    """The architecture whose quad int8 kernel (codegen/qgemm.py: ``vpdpbusd`` where the LLVM
    features have +avx512vnni, ``sdot`` where they have +dotprod) every target runs, "" when
    some target does not or they are of two architectures. ``emulate``
    (``CompileOptions.vnni_emulate``): every x86 target runs the quad kernel."""
    arches = {t.arch for t in targets}
    if len(arches) != 1:
        return ""
    arch = arches.pop()
    need = "+avx512vnni" if arch == "x86_64" else "+dotprod"
    runs = all(need in t.llvm_features.split(",") for t in targets)
    return arch if runs or (emulate and arch == "x86_64") else ""


def has_int8_dot(targets) -> bool:
    """Whether some target of the set multiplies int8 quads with a dot instruction
    (``vpdpbusd``: +avx512vnni; ``sdot``: +dotprod), where its integer convolutions beat fp32."""
    return any(("+avx512vnni" if t.arch == "x86_64" else "+dotprod") in t.llvm_features.split(",")
               for t in targets)


# The oldest level a portable bundle covers on each architecture: x86-64-v2 (SSE4.2, 2009 on)
# runs on every x86-64 machine still in service; the v1 baseline would only slow the common case.
PORTABLE_BASELINE = {"x86_64": "x86-64-v2", "aarch64": "aarch64"}


def portable_levels(arch: str | None = None, best: str | None = None,
                    precision: str = "fp32") -> list[str]:
    """The levels of the default, portable bundle: every level of ``arch`` from its baseline up
    to ``best`` (defaults: this host's architecture and best level), so a bundle built on an
    AVX-512 workstation still runs on an AVX2 laptop or an SSE4.2 server, each at its own best
    level. Raises ``TargetError`` when the host matches no level."""
    arch = arch or cpu.host_arch()
    best = best or cpu.best_level(arch)
    if best is None:
        raise TargetError(f"this {arch} CPU matches no known level; name one with --target "
                          f"({', '.join(LEVEL_NAMES)})")
    names = [lv.name for lv in cpu.LEVELS if lv.arch == arch]
    start = names.index(PORTABLE_BASELINE.get(arch, names[0]))
    stop = names.index(best)
    return [n for n in names[min(start, stop):stop + 1]
            if precision == "bf16" or n not in BF16_LEVELS]


def runs_on(targets: list[Target]) -> str:
    """Which CPUs run a bundle with these code variants, in words for the export summary."""
    by_arch: dict[str, list[str]] = {}
    for t in targets:
        by_arch.setdefault(t.arch, []).append(t.name)
    parts = []
    for names in by_arch.values():
        lowest = min(names, key=lambda n: LEVEL_NAMES.index(n))
        what = {"x86-64": "any x86-64 CPU", "x86-64-v2": "x86-64 CPUs with SSE4.2 (x86-64-v2)",
                "x86-64-v3": "x86-64 CPUs with AVX2 (x86-64-v3)",
                "x86-64-v4": "x86-64 CPUs with AVX-512 (x86-64-v4)",
                "x86-64-v4+vnni": "x86-64 CPUs with AVX-512 VNNI (x86-64-v4+vnni)",
                "x86-64-v4+bf16": "x86-64 CPUs with AVX-512 and avx512_bf16 (x86-64-v4+bf16)",
                "aarch64": "any aarch64 CPU",
                "aarch64+dotprod": "aarch64 CPUs with dotprod",
                "aarch64+bf16": "aarch64 CPUs with bf16 (aarch64+bf16)"}.get(lowest, lowest)
        parts.append(what + (" and up" if lowest not in ("x86-64", "aarch64") else ""))
    return " or ".join(parts)


def resolve_targets(spec: str | None, precision: str = "fp32") -> list[Target]:
    """Targets for a comma-separated ``spec`` ("x86-64-v2,x86-64-v3,aarch64"), in order and
    without repeats; "host" is this machine's best level, and ``None`` or "portable" (the
    default) the levels from the architecture's baseline up to the host's (``portable_levels``).
    A bundle carries one code variant per target, and the runtime picks the best its host
    supports."""
    names = [n.strip() for n in (spec or "portable").split(",")]
    if not all(names):
        raise TargetError(f"--target {spec!r} has an empty entry; write e.g. x86-64-v2,x86-64-v3")
    targets: list[Target] = []
    for name in names:
        expanded = portable_levels(precision=precision) if name == "portable" else [name]
        for target in (resolve_target(n, precision) for n in expanded):
            if target not in targets:
                targets.append(target)
    return targets
