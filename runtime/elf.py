"""Load relocatable ELF64 objects (LLVM, ``reloc="pic"``, ``codemodel="small"``) into memory.

The runtime has no linker: ``load_object`` validates the object, lays its allocated sections out
in ONE anonymous mapping (executable pages, then read-only pages, then writable pages), copies
them in, resolves symbols, builds a small GOT and jump stubs for externals (libc lies more than
2 GB away, out of reach of 32-bit PC-relative calls), applies the relocations with numpy, then
makes each part executable, read-only or writable. Memory is never writable and executable at
once. Every malformed input gives a ``CodeLoadError``; nothing else escapes.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import platform
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

import numpy as np

from .errors import CodeLoadError

MACHINES = {"x86_64": 62, "aarch64": 183}

_ET_REL = 1
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 1, 2, 3, 4, 8, 9
_SHF_WRITE, _SHF_ALLOC, _SHF_EXECINSTR, _SHF_TLS = 0x1, 0x2, 0x4, 0x400
_SHN_LORESERVE, _SHN_ABS, _SHN_COMMON = 0xFF00, 0xFFF1, 0xFFF2
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_STT_OBJECT, _STT_FUNC = 1, 2

_MAX_ALIGN = 1 << 16  # alignments above this are refused rather than over-allocated
_MAX_IMAGE = 1 << 30  # keeps every PC-relative distance inside the mapping well below 2 GB

_SHDR = np.dtype([
    ("name", "<u4"), ("type", "<u4"), ("flags", "<u8"), ("addr", "<u8"), ("offset", "<u8"),
    ("size", "<u8"), ("link", "<u4"), ("info", "<u4"), ("addralign", "<u8"), ("entsize", "<u8"),
])
_SYM = np.dtype([
    ("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
    ("value", "<u8"), ("size", "<u8"),
])
_RELA = np.dtype([("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")])
_BYTE_OFFSETS = {n: np.arange(n, dtype=np.int64) for n in (4, 8)}


# --- Relocation handlers: vectorized over every relocation of one type in one section.

class Relocation(NamedTuple):
    """How one relocation type is applied.

    ``target`` says which address the handler receives: "S" the symbol, "L" the call target (a
    jump stub for externals), "G" the symbol's GOT entry. ``apply(view, idx, place, target,
    addend)`` patches ``width`` bytes of ``view`` at each ``idx`` (int64 arrays) or raises.
    """

    name: str
    width: int
    target: str
    apply: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


def _check_range(name: str, value: np.ndarray, lo: int, hi: int) -> None:
    bad = (value < lo) | (value >= hi)
    if bad.any():
        v = int(value[int(np.argmax(bad))])
        raise CodeLoadError(f"relocation {name} overflows: {v:#x} is outside [{lo:#x}, {hi:#x})")


def _check_align(name: str, value: np.ndarray, align: int) -> None:
    bad = (value & (align - 1)) != 0
    if bad.any():
        v = int(value[int(np.argmax(bad))])
        raise CodeLoadError(f"relocation {name} needs a multiple of {align}, got {v:#x}")


def _put(view: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
    size = values.dtype.itemsize
    view[idx[:, None] + _BYTE_OFFSETS[size]] = values.view(np.uint8).reshape(-1, size)


def _get32(view: np.ndarray, idx: np.ndarray) -> np.ndarray:
    # Fancy indexing returns a fresh C-contiguous (n, 4) array, so the view is safe at any offset.
    return view[idx[:, None] + _BYTE_OFFSETS[4]].view("<u4").ravel().astype(np.int64)


def _data(name: str, width: int, target: str, pcrel: bool,
          bounds: tuple[int, int] | None) -> Relocation:
    """A relocation that stores ``target + addend [- place]`` as a 4- or 8-byte value."""
    fmt = {4: "<i4" if bounds is None or bounds[0] < 0 else "<u4", 8: "<i8"}[width]

    def apply(view: np.ndarray, idx: np.ndarray, place: np.ndarray, tgt: np.ndarray,
              addend: np.ndarray) -> None:
        value = tgt + addend - place if pcrel else tgt + addend
        if bounds is not None:
            _check_range(name, value, *bounds)
        # 64-bit fields wrap modulo 2**64 by definition, so int64 bits are the answer as-is.
        _put(view, idx, value.astype(fmt))

    return Relocation(name, width, target, apply)


_I32 = (-(1 << 31), 1 << 31)
_U32 = (0, 1 << 32)
_I32_OR_U32 = (-(1 << 31), 1 << 32)  # AArch64 ABS32/PREL32 accept either interpretation

# PC32/PLT32 to an external go through its jump stub: the code only calls externals, and
# libc lies out of 32-bit reach. GOTPCREL* entries are not relaxed, only pointed right.
_X86_64 = {
    1: _data("R_X86_64_64", 8, "S", False, None),
    2: _data("R_X86_64_PC32", 4, "L", True, _I32),
    4: _data("R_X86_64_PLT32", 4, "L", True, _I32),
    9: _data("R_X86_64_GOTPCREL", 4, "G", True, _I32),
    10: _data("R_X86_64_32", 4, "S", False, _U32),
    11: _data("R_X86_64_32S", 4, "S", False, _I32),
    24: _data("R_X86_64_PC64", 8, "S", True, None),
    41: _data("R_X86_64_GOTPCRELX", 4, "G", True, _I32),
    42: _data("R_X86_64_REX_GOTPCRELX", 4, "G", True, _I32),
}


def _a64_insn(name: str, target: str, kind: str, shift: int = 0) -> Relocation:
    """An AArch64 instruction patch: ``kind`` is "branch26", "page21" or "lo12"."""

    def apply(view: np.ndarray, idx: np.ndarray, place: np.ndarray, tgt: np.ndarray,
              addend: np.ndarray) -> None:
        insn = _get32(view, idx)
        if target == "G" and addend.any():
            raise CodeLoadError(f"relocation {name} with a nonzero addend is not supported")
        if kind == "branch26":
            value = tgt + addend - place
            _check_range(name, value, -(1 << 27), 1 << 27)
            _check_align(name, value, 4)
            insn = (insn & 0xFC000000) | ((value >> 2) & 0x03FFFFFF)
        elif kind == "page21":
            value = ((tgt + addend) & ~0xFFF) - (place & ~0xFFF)
            _check_range(name, value, -(1 << 32), 1 << 32)
            imm = value >> 12
            insn = (insn & 0x9F00001F) | ((imm & 0x3) << 29) | (((imm >> 2) & 0x7FFFF) << 5)
        else:
            value = (tgt + addend) & 0xFFF
            _check_align(name, value, 1 << shift)
            insn = (insn & ~(0xFFF << 10)) | ((value >> shift) << 10)
        _put(view, idx, insn.astype("<u4"))

    return Relocation(name, 4, target, apply)


_AARCH64 = {
    257: _data("R_AARCH64_ABS64", 8, "S", False, None),
    258: _data("R_AARCH64_ABS32", 4, "S", False, _I32_OR_U32),
    260: _data("R_AARCH64_PREL64", 8, "S", True, None),
    261: _data("R_AARCH64_PREL32", 4, "S", True, _I32_OR_U32),
    275: _a64_insn("R_AARCH64_ADR_PREL_PG_HI21", "S", "page21"),
    277: _a64_insn("R_AARCH64_ADD_ABS_LO12_NC", "S", "lo12"),
    278: _a64_insn("R_AARCH64_LDST8_ABS_LO12_NC", "S", "lo12", 0),
    282: _a64_insn("R_AARCH64_JUMP26", "L", "branch26"),
    283: _a64_insn("R_AARCH64_CALL26", "L", "branch26"),
    284: _a64_insn("R_AARCH64_LDST16_ABS_LO12_NC", "S", "lo12", 1),
    285: _a64_insn("R_AARCH64_LDST32_ABS_LO12_NC", "S", "lo12", 2),
    286: _a64_insn("R_AARCH64_LDST64_ABS_LO12_NC", "S", "lo12", 3),
    299: _a64_insn("R_AARCH64_LDST128_ABS_LO12_NC", "S", "lo12", 4),
    311: _a64_insn("R_AARCH64_ADR_GOT_PAGE", "G", "page21"),
    312: _a64_insn("R_AARCH64_LD64_GOT_LO12_NC", "G", "lo12", 3),
}

# {arch: {ELF relocation type: handler}}: a new type or architecture is a new row.
RELOCATIONS: dict[str, dict[int, Relocation]] = {"x86_64": _X86_64, "aarch64": _AARCH64}


def _x86_64_stub(stub: int, got_entry: int) -> bytes:
    # jmp *[rip+disp32], padded with int3 to 8 bytes.
    return b"\xff\x25" + struct.pack("<i", got_entry - (stub + 6)) + b"\xcc\xcc"


def _aarch64_stub(stub: int, got_entry: int) -> bytes:
    # adrp x16, entry; ldr x16, [x16, :lo12:entry]; br x16; brk #0
    imm = ((got_entry & ~0xFFF) - (stub & ~0xFFF)) >> 12
    adrp = 0x90000010 | ((imm & 0x3) << 29) | (((imm >> 2) & 0x7FFFF) << 5)
    ldr = 0xF9400210 | (((got_entry & 0xFFF) >> 3) << 10)
    return struct.pack("<IIII", adrp, ldr, 0xD61F0200, 0xD4200000)


_STUBS: dict[str, tuple[int, Callable[[int, int], bytes]]] = {
    "x86_64": (8, _x86_64_stub),
    "aarch64": (16, _aarch64_stub),
}


# --- Memory: one anonymous mapping through libc.

@functools.cache
def _libc() -> Any:
    # A private CDLL instance, so setting argtypes here cannot disturb anyone else's.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.restype = ctypes.c_int
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


@functools.cache
def _clear_cache() -> Any:
    fn = ctypes.CDLL("libgcc_s.so.1").__clear_cache
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return fn


def _os_error(what: str) -> CodeLoadError:
    err = ctypes.get_errno()
    return CodeLoadError(f"{what} failed: {os.strerror(err)} (errno {err})")


def _map(size: int) -> int:
    addr = _libc().mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        raise _os_error(f"mapping {size} bytes for object code")
    return addr


def _unmap(addr: int, size: int) -> None:
    _libc().munmap(addr, size)


def _protect(addr: int, size: int, prot: int) -> None:
    if size and _libc().mprotect(addr, size, prot) != 0:
        raise _os_error("changing the protection of object code")


def _real_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


# --- The loaded image.

class CodeImage:
    """Object code mapped into executable memory.

    Keep the image alive (or use ``function``, whose result holds it) while calling its code:
    closing it, or letting it be garbage-collected, unmaps the memory.
    """

    def __init__(self, mapping: tuple[int, int], base: int, size: int,
                 symbols: dict[str, int], code_size: int, arch: str) -> None:
        self.base = base
        self.size = size
        self.code_size = code_size
        self.arch = arch
        self._symbols = symbols
        self._finalizer = weakref.finalize(self, _unmap, *mapping)

    @property
    def symbols(self) -> dict[str, int]:
        """Defined global functions and objects: name -> absolute address."""
        return dict(self._symbols)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def address(self, name: str) -> int:
        """The absolute address of the defined global symbol ``name``."""
        if self.closed:
            raise CodeLoadError(f"cannot look up {name!r}: the code image is closed")
        try:
            return self._symbols[name]
        except KeyError:
            raise CodeLoadError(f"object code defines no global symbol {name!r}") from None

    def function(self, name: str, restype: Any, *argtypes: Any) -> Any:
        """A ctypes function for ``name``; it keeps this image mapped while it lives."""
        fn = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(name))
        fn._mlcpack_image = self  # the memory must outlive every callable pointing into it
        return fn

    def close(self) -> None:
        """Unmap the code; calling it again does nothing."""
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"at {self.base:#x}"
        return f"<CodeImage {self.arch} {len(self._symbols)} symbols, {self.size} bytes {state}>"


def default_externals() -> dict[str, int]:
    """Addresses of the libc functions LLVM-generated kernels may call (memcpy, memset...)."""
    libc = ctypes.CDLL(None)
    return {name: ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
            for name in ("memcpy", "memmove", "memset")}


# --- Parsing and validation.

@dataclass
class _Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entsize: int
    region: str = ""  # "text", "ro" or "rw" once chosen to be loaded
    load: int = -1  # offset inside the mapping


def _cstr(table: bytes, offset: int, what: str) -> str:
    if offset >= len(table):
        raise CodeLoadError(f"{what}: name offset {offset} lies outside its string table")
    end = table.find(b"\0", offset)
    if end < 0:
        raise CodeLoadError(f"{what}: name at offset {offset} is not NUL-terminated")
    name = table[offset:end].decode("utf-8", "backslashreplace")
    # Messages stay one line even when a corrupted name holds control characters.
    return name if name.isprintable() else name.encode("unicode_escape").decode("ascii")


def _parse_sections(mv: memoryview, arch: str) -> list[_Section]:
    n = len(mv)
    if n < 64:
        raise CodeLoadError(f"object code is truncated: {n} bytes, an ELF header alone needs 64")
    if bytes(mv[:4]) != b"\x7fELF":
        raise CodeLoadError("object code is not ELF (bad magic)")
    if mv[4] != 2 or mv[5] != 1:
        raise CodeLoadError("object code is not 64-bit little-endian ELF")
    head = struct.unpack_from("<HHIQQQIHHHHHH", mv, 16)
    e_type, e_machine, e_shoff, e_shentsize, e_shnum, e_shstrndx = (
        head[0], head[1], head[5], head[10], head[11], head[12])
    if e_type != _ET_REL:
        raise CodeLoadError(f"object code is ELF type {e_type}, not a relocatable object (1)")
    if e_machine != MACHINES[arch]:
        names = {v: k for k, v in MACHINES.items()}
        found = names.get(e_machine, f"machine {e_machine}")
        raise CodeLoadError(f"object code is for {found}, but {arch} code was expected")
    if e_shnum == 0 or e_shentsize != _SHDR.itemsize:
        raise CodeLoadError(f"object code has {e_shnum} section headers of {e_shentsize} bytes")
    if e_shoff + e_shnum * _SHDR.itemsize > n:
        raise CodeLoadError(f"section header table at {e_shoff} runs past the end ({n} bytes)")
    if e_shstrndx >= e_shnum:
        raise CodeLoadError(f"section name table index {e_shstrndx} is out of range")
    rows = np.frombuffer(mv, _SHDR, e_shnum, e_shoff).tolist()
    sections = []
    for i, (_name, typ, flags, _addr, off, size, link, info, align, entsize) in enumerate(rows):
        if typ != _SHT_NOBITS and off + size > n:
            raise CodeLoadError(f"section {i} ({off}+{size} bytes) runs past the end ({n} bytes)")
        if align & (align - 1) or align > _MAX_ALIGN:
            raise CodeLoadError(f"section {i} has unsupported alignment {align}")
        sections.append(_Section(i, "", typ, flags, off, size, link, info, max(align, 1), entsize))
    names = sections[e_shstrndx]
    if names.type != _SHT_STRTAB:
        raise CodeLoadError(f"section name table {e_shstrndx} is not a string table")
    table = bytes(mv[names.offset:names.offset + names.size])
    for sec, row in zip(sections, rows):
        sec.name = _cstr(table, row[0], f"section {sec.index}")
    return sections


def _is_loaded(sec: _Section) -> bool:
    # .eh_frame is allocated but only a debugger/unwinder reads it; we do not register it.
    return (bool(sec.flags & _SHF_ALLOC) and sec.type in (_SHT_PROGBITS, _SHT_NOBITS)
            and not sec.name.startswith(".eh_frame"))


def _region(sec: _Section) -> str:
    if sec.flags & _SHF_TLS:
        raise CodeLoadError(f"section {sec.name} uses thread-local storage, which is unsupported")
    if sec.flags & _SHF_EXECINSTR:
        if sec.flags & _SHF_WRITE:
            raise CodeLoadError(f"section {sec.name} is both writable and executable")
        return "text"
    if sec.name.startswith(".data.rel.ro"):
        return "ro"  # relocated here once, then read-only like a linker's RELRO
    return "rw" if sec.flags & _SHF_WRITE else "ro"


def _table(mv: memoryview, sec: _Section, dtype: np.dtype, what: str) -> np.ndarray:
    if sec.size % dtype.itemsize or sec.entsize not in (0, dtype.itemsize):
        raise CodeLoadError(f"{what} {sec.name} has entries of {sec.entsize} bytes, "
                            f"size {sec.size}; expected {dtype.itemsize}-byte entries")
    return np.frombuffer(mv, dtype, sec.size // dtype.itemsize, sec.offset)


class _RelocTable(NamedTuple):
    section: _Section  # the section being patched
    offset: np.ndarray
    rtype: np.ndarray
    sym: np.ndarray
    addend: np.ndarray
    types: list[int]  # the distinct relocation types present


def _parse_relocs(mv: memoryview, sections: list[_Section], symtab: int, nsyms: int,
                  handlers: dict[int, Relocation]) -> list[_RelocTable]:
    tables = []
    for sec in sections:
        if sec.type not in (_SHT_RELA, _SHT_REL):
            continue
        if sec.info >= len(sections):
            raise CodeLoadError(f"relocation section {sec.name} targets section {sec.info}, "
                                f"but there are {len(sections)}")
        target = sections[sec.info]
        if not _is_loaded(target):
            continue  # e.g. .rela.eh_frame, .rela.debug_*
        if sec.type == _SHT_REL:
            raise CodeLoadError(f"{sec.name}: REL relocations (implicit addends) are unsupported")
        if sec.link != symtab:
            raise CodeLoadError(f"relocation section {sec.name} links section {sec.link}, "
                                f"not the symbol table")
        rows = _table(mv, sec, _RELA, "relocation section")
        sym = rows["info"] >> np.uint64(32)
        rtype = rows["info"] & np.uint64(0xFFFFFFFF)
        offset = rows["offset"]
        if len(rows) and int(sym.max()) >= nsyms:
            raise CodeLoadError(f"{sec.name}: symbol index {int(sym.max())} is out of range "
                                f"({nsyms} symbols)")
        types = sorted(set(rtype.tolist()))  # np.unique's first call costs ~10 ms of imports
        for t in types:
            handler = handlers.get(t)
            if handler is None:
                raise CodeLoadError(f"{sec.name}: unsupported relocation type {t}")
            pos = offset[rtype == t]
            if target.size < handler.width or int(pos.max()) > target.size - handler.width:
                raise CodeLoadError(f"{sec.name}: {handler.name} at offset {int(pos.max())} lies "
                                    f"outside {target.name} ({target.size} bytes)")
        tables.append(_RelocTable(target, offset.astype(np.int64), rtype.astype(np.int64),
                                  sym.astype(np.intp), rows["addend"], types))
    return tables


# --- The loader.

def _align(value: int, align: int) -> int:
    return (value + align - 1) & -align


def load_object(data: bytes | bytearray | memoryview, externals: dict[str, int],
                arch: str | None = None) -> CodeImage:
    """Map relocatable ELF64 object code into executable memory and link it.

    ``externals`` maps the undefined symbols the code may use (memcpy...) to absolute
    addresses; ``arch`` ("x86_64" or "aarch64") defaults to this machine's real one
    (``MLCPACK_CPU_ARCH`` does not change it: mapping foreign code is opt-in). Returns a
    ``CodeImage``; raises ``CodeLoadError`` for anything malformed, unsupported or missing.
    """
    arch = arch or _real_arch()
    if arch not in MACHINES:
        raise CodeLoadError(f"cannot load object code for architecture {arch!r}; "
                            f"supported: {', '.join(MACHINES)}")
    try:
        mv = memoryview(data).cast("B")
    except (TypeError, ValueError) as exc:
        raise CodeLoadError(f"object code must be a contiguous byte buffer ({exc})") from None
    try:
        return _load(mv, externals, arch)
    except (IndexError, KeyError, ValueError, TypeError, OverflowError, struct.error) as exc:
        # A safety net only: every check above should have refused first (the fuzz test asserts).
        raise CodeLoadError(f"object code is malformed ({type(exc).__name__}: {exc})") from None


class _Symbols(NamedTuple):
    """The validated symbol table, with each symbol's section index and value as int64."""

    rows: np.ndarray
    strtab: bytes
    shndx: np.ndarray
    value: np.ndarray
    in_loaded: np.ndarray  # defined in a section we load
    external: dict[int, int]  # undefined symbol index -> address from ``externals``

    def name(self, i: int) -> str:
        return _cstr(self.strtab, int(self.rows["name"][i]), f"symbol {i}")


def _read_symbols(mv: memoryview, sections: list[_Section], externals: dict[str, int]
                  ) -> tuple[int, _Symbols]:
    """Validate the symbol table and resolve undefined symbols; returns (its index, symbols)."""
    nsec = len(sections)
    symtabs = [s for s in sections if s.type == _SHT_SYMTAB]
    if len(symtabs) > 1:
        raise CodeLoadError(f"object code has {len(symtabs)} symbol tables")
    index, strtab, rows = -1, b"", np.zeros(0, _SYM)
    if symtabs:
        index = symtabs[0].index
        link = symtabs[0].link
        if link >= nsec or sections[link].type != _SHT_STRTAB:
            raise CodeLoadError(f"symbol table links section {link}, not a string table")
        strtab = bytes(mv[sections[link].offset:sections[link].offset + sections[link].size])
        rows = _table(mv, symtabs[0], _SYM, "symbol table")
    if len(rows) and int(rows["name"].max()) >= max(len(strtab), 1):
        raise CodeLoadError("a symbol name offset lies outside the string table")
    shndx = rows["shndx"].astype(np.int64)
    reserved = shndx >= _SHN_LORESERVE
    odd = reserved & (shndx != _SHN_ABS) & (shndx != _SHN_COMMON)
    if odd.any():
        i = int(np.argmax(odd))
        raise CodeLoadError(f"symbol {i} uses unsupported special section index {shndx[i]:#x}")
    normal = ~reserved & (shndx > 0)
    if (shndx[normal] >= nsec).any():
        raise CodeLoadError(f"a symbol refers to a section index beyond the {nsec} sections")
    sec_size = np.array([s.size for s in sections], dtype=np.uint64)
    sec_loaded = np.array([s.region != "" for s in sections], dtype=bool)
    in_loaded = normal & sec_loaded[np.where(normal, shndx, 0)]
    if (rows["value"][in_loaded] > sec_size[shndx[in_loaded]]).any():
        raise CodeLoadError("a symbol's value lies beyond the end of its section")
    symbols = _Symbols(rows, strtab, shndx, rows["value"].view(np.int64), in_loaded, {})
    for i in (np.flatnonzero(shndx[1:] == 0) + 1).tolist():  # symbol 0 is the null symbol
        name = symbols.name(i)
        if name not in externals:
            raise CodeLoadError(f"object code needs external symbol {name!r}, "
                                f"which the runtime does not provide")
        symbols.external[i] = int(externals[name])
    return index, symbols


class _Layout(NamedTuple):
    """Where everything goes inside the mapping (offsets from its base)."""

    size: int
    max_align: int
    starts: dict[str, int]  # region -> first byte; regions are page-aligned
    stub_offset: int
    stub_syms: list[int]  # externals reached through a jump stub, in stub order
    got_offset: int
    got_syms: list[int]  # symbols with a GOT entry, in entry order
    commons: list[tuple[int, int]]  # (common symbol index, offset)


def _plan(loaded: list[_Section], symbols: _Symbols, relocs: list[_RelocTable],
          arch: str) -> _Layout:
    """Choose offsets: executable pages, then read-only pages, then writable pages."""
    handlers = RELOCATIONS[arch]
    got_types = [t for t, h in handlers.items() if h.target == "G"]
    call_types = [t for t, h in handlers.items() if h.target == "L"]
    is_external = np.zeros(len(symbols.rows), dtype=bool)
    is_external[list(symbols.external)] = True
    got_set: set[int] = set()
    stub_set: set[int] = set()
    for rel in relocs:
        got_set.update(rel.sym[np.isin(rel.rtype, got_types)].tolist())
        calls = rel.sym[np.isin(rel.rtype, call_types)]
        stub_set.update(calls[is_external[calls]].tolist())
    stub_syms = sorted(stub_set)
    got_syms = sorted(got_set | stub_set)  # every stub jumps through a GOT entry

    page = mmap.PAGESIZE
    max_align = max([page] + [s.align for s in loaded])
    starts: dict[str, int] = {}
    commons: list[tuple[int, int]] = []
    cursor = stub_offset = got_offset = 0
    for region in ("text", "ro", "rw"):
        cursor = _align(cursor, page)
        starts[region] = cursor
        for sec in loaded:
            if sec.region == region:
                cursor = _align(cursor, sec.align)
                sec.load = cursor
                cursor += sec.size
        if region == "text":
            cursor = _align(cursor, 16)
            stub_offset = cursor
            cursor += _STUBS[arch][0] * len(stub_syms)
        elif region == "ro":
            cursor = _align(cursor, 8)
            got_offset = cursor
            cursor += 8 * len(got_syms)
        else:
            for i in np.flatnonzero(symbols.shndx == _SHN_COMMON).tolist():
                align = int(symbols.rows["value"][i]) or 1  # a common symbol's value: its alignment
                if align & (align - 1) or align > _MAX_ALIGN:
                    raise CodeLoadError(f"common symbol {i} has unsupported alignment {align}")
                cursor = _align(cursor, align)
                commons.append((i, cursor))
                cursor += int(symbols.rows["size"][i])
                max_align = max(max_align, align)
        if cursor > _MAX_IMAGE:
            raise CodeLoadError(f"object code needs more than {_MAX_IMAGE} bytes of memory")
    starts["end"] = _align(max(cursor, 1), page)
    return _Layout(starts["end"], max_align, starts, stub_offset, stub_syms, got_offset,
                   got_syms, commons)


def _load(mv: memoryview, externals: dict[str, int], arch: str) -> CodeImage:
    sections = _parse_sections(mv, arch)
    loaded = [s for s in sections if _is_loaded(s)]
    for sec in loaded:
        sec.region = _region(sec)
    symtab, symbols = _read_symbols(mv, sections, externals)
    relocs = _parse_relocs(mv, sections, symtab, len(symbols.rows), RELOCATIONS[arch])
    layout = _plan(loaded, symbols, relocs, arch)

    starts = layout.starts
    mapped = layout.size + layout.max_align - mmap.PAGESIZE  # slack to honour big alignments
    raw = _map(mapped)
    try:
        base = _align(raw, layout.max_align)
        exports = _link(mv, base, arch, sections, symbols, relocs, layout)
        _protect(base + starts["text"], starts["ro"] - starts["text"],
                 mmap.PROT_READ | mmap.PROT_EXEC)
        _protect(base + starts["ro"], starts["rw"] - starts["ro"], mmap.PROT_READ)
        if arch == "aarch64" and _real_arch() == "aarch64":
            _clear_cache()(base + starts["text"], base + starts["ro"])
    except BaseException:
        _unmap(raw, mapped)
        raise
    code_size = sum(s.size for s in loaded if s.region == "text")
    return CodeImage((raw, mapped), base, layout.size, exports, code_size, arch)


def _link(mv: memoryview, base: int, arch: str, sections: list[_Section], symbols: _Symbols,
          relocs: list[_RelocTable], layout: _Layout) -> dict[str, int]:
    """Copy sections in, resolve symbols, write GOT and stubs, relocate; return the exports."""
    view = np.frombuffer((ctypes.c_uint8 * layout.size).from_address(base), np.uint8)
    src = np.frombuffer(mv, np.uint8)
    for sec in sections:
        if sec.region and sec.type == _SHT_PROGBITS:
            view[sec.load:sec.load + sec.size] = src[sec.offset:sec.offset + sec.size]

    # Symbol addresses; symbols in sections we did not load stay unresolved.
    shndx, in_loaded = symbols.shndx, symbols.in_loaded
    sec_addr = np.array([base + s.load if s.region else 0 for s in sections], dtype=np.int64)
    addr = np.zeros(len(symbols.rows), dtype=np.int64)
    addr[in_loaded] = sec_addr[shndx[in_loaded]] + symbols.value[in_loaded]
    is_abs = shndx == _SHN_ABS
    addr[is_abs] = symbols.value[is_abs]
    for i, offset in layout.commons:
        addr[i] = base + offset
    for i, a in symbols.external.items():
        addr[i] = a
    resolved = in_loaded | is_abs | (shndx == _SHN_COMMON) | (shndx == 0)

    # GOT entries hold symbol addresses; stubs jump through them.
    got = np.full(len(addr), -1, dtype=np.int64)
    got_syms, got_offset = layout.got_syms, layout.got_offset
    if got_syms:
        got[got_syms] = base + got_offset + 8 * np.arange(len(got_syms), dtype=np.int64)
        view[got_offset:got_offset + 8 * len(got_syms)] = addr[got_syms].view(np.uint8)
    call = addr.copy()
    stub_size, make_stub = _STUBS[arch]
    for n, i in enumerate(layout.stub_syms):
        at = layout.stub_offset + n * stub_size
        call[i] = base + at
        view[at:at + stub_size] = np.frombuffer(make_stub(base + at, int(got[i])), np.uint8)

    targets = {"S": addr, "L": call, "G": got}
    handlers = RELOCATIONS[arch]
    for rel in relocs:
        sec = rel.section
        ok = resolved[rel.sym]
        if not ok.all():
            bad = int(rel.sym[np.argmin(ok)])
            raise CodeLoadError(f"relocation in {sec.name} refers to symbol {bad} in section "
                                f"{sections[int(shndx[bad])].name}, which is not loaded")
        for t in rel.types:
            sel = rel.rtype == t
            handler = handlers[t]
            pos = rel.offset[sel]
            try:
                handler.apply(view, sec.load + pos, sec_addr[sec.index] + pos,
                              targets[handler.target][rel.sym[sel]], rel.addend[sel])
            except CodeLoadError as exc:
                raise CodeLoadError(f"{exc} in section {sec.name}") from None

    bind = symbols.rows["info"] >> 4
    stype = symbols.rows["info"] & 0xF
    exported = np.flatnonzero(
        (in_loaded | (shndx == _SHN_COMMON))
        & np.isin(bind, [_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE])
        & np.isin(stype, [_STT_OBJECT, _STT_FUNC]))
    return {symbols.name(i): int(addr[i]) for i in exported.tolist()}
