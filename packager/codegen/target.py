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


def resolve_target(name: str | None) -> Target:
    """``None`` or "host": the best level this machine supports; else a level name such as
    ``x86-64-v3`` or ``aarch64``."""
    if name in (None, "", "host"):
        best = cpu.best_level()
        if best is None:
            raise TargetError(f"this {cpu.host_arch()} CPU matches no known level; "
                              f"name one with --target ({', '.join(LEVEL_NAMES)})")
        return _from_level(best)
    aliases = {"x86_64": "x86-64", "arm64": "aarch64"}
    name = aliases.get(name, name)
    if name not in LEVEL_NAMES:
        raise TargetError(f"unknown target {name!r}; choose one of: host, {', '.join(LEVEL_NAMES)}")
    return _from_level(name)


def resolve_targets(spec: str | None) -> list[Target]:
    """Targets for a comma-separated ``spec`` ("x86-64-v2,x86-64-v3,aarch64"), in order and
    without repeats; ``None`` or "host" is this machine's best level. A bundle carries one code
    variant per target, and the runtime picks the best its host supports."""
    names = [n.strip() for n in (spec or "host").split(",")]
    if not all(names):
        raise TargetError(f"--target {spec!r} has an empty entry; write e.g. x86-64-v2,x86-64-v3")
    targets: list[Target] = []
    for name in names:
        target = resolve_target(name)
        if target not in targets:
            targets.append(target)
    return targets
