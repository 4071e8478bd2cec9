"""Facts about an emitted object file that ``mlcpack inspect`` shows (code size per kernel)."""

from __future__ import annotations

import struct

_SHT_SYMTAB = 2
_STT_FUNC = 2


def function_sizes(obj: bytes) -> dict[str, int]:
    """Size in bytes of every function symbol in an ELF64 little-endian relocatable object."""
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    sizes: dict[str, int] = {}
    for sh in sections:
        if sh[1] != _SHT_SYMTAB:
            continue
        strtab = sections[sh[6]]
        for off in range(sh[4], sh[4] + sh[5], 24):
            name_off, info, _, _, _, size = struct.unpack_from("<IBBHQQ", obj, off)
            if info & 0xF != _STT_FUNC:
                continue
            start = strtab[4] + name_off
            name = obj[start:obj.index(b"\0", start)].decode()
            sizes[name] = size
    return sizes


def undefined_symbols(obj: bytes) -> set[str]:
    """Names of the symbols an ELF64 little-endian relocatable object imports (section 0).

    The backend can turn an instruction into a libm call (``frem`` -> ``fmodf``, ``floor``
    without SSE4.1 -> ``floorf``) after the IR looked clean, so the object itself is checked.
    """
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    names: set[str] = set()
    for sh in sections:
        if sh[1] != _SHT_SYMTAB:
            continue
        strtab = sections[sh[6]]
        for off in range(sh[4] + 24, sh[4] + sh[5], 24):  # entry 0 is the null symbol
            name_off, _, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", obj, off)
            if shndx != 0 or name_off == 0:
                continue
            start = strtab[4] + name_off
            names.add(obj[start:obj.index(b"\0", start)].decode())
    return names
