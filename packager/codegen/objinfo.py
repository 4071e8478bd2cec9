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
