/* The ELF64 relocatable-object loader: runtime/elf.py in C. One anonymous mapping holds the
 * allocated sections (executable pages, then read-only pages, then writable pages), a GOT and
 * jump stubs for the externals (memcpy, memmove, memset: libc lies out of 32-bit reach); the
 * relocations of elf.py's table are applied, then each part made executable, read-only or
 * writable, never writable and executable at once. Every offset, size, index and relocation
 * result is checked; anything malformed is MLC_ERR_CODE. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#define SHT_PROGBITS 1
#define SHT_SYMTAB 2
#define SHT_STRTAB 3
#define SHT_RELA 4
#define SHT_NOBITS 8
#define SHT_REL 9
#define SHF_WRITE 0x1
#define SHF_ALLOC 0x2
#define SHF_EXECINSTR 0x4
#define SHF_TLS 0x400
#define SHN_LORESERVE 0xFF00
#define SHN_ABS 0xFFF1
#define SHN_COMMON 0xFFF2
#define MAX_ALIGN (1u << 16)
#define MAX_IMAGE (1u << 30)

enum { R_NONE, R_TEXT, R_RO, R_RW };
typedef struct {
    uint32_t name, type, link, info;
    uint64_t flags, offset, size, align, entsize;
    int region;
    uint64_t load;
    const char *sname;
} section;

typedef struct {
    uint32_t name;
    uint8_t info;
    uint16_t shndx;
    uint64_t value, size;
} symbol;

/* A relocation kind: target 'S' symbol, 'L' call target (stub for externals), 'G' GOT entry */
typedef enum { K_DATA, K_BRANCH26, K_PAGE21, K_LO12 } kind;
typedef struct {
    uint32_t type;
    const char *name;
    int width;
    char target;
    kind k;
    int pcrel;
    int bounded;
    int64_t lo, hi;    /* [lo, hi) when bounded (hi as uint64 for the U32 case) */
    int shift;
} reloc_kind;

#define I32 1, -(1LL << 31), (1LL << 31)
#define U32 1, 0, (1LL << 32)
#define I32U32 1, -(1LL << 31), (1LL << 32)
#define NOB 0, 0, 0
static const reloc_kind X86[] = {
    {1, "R_X86_64_64", 8, 'S', K_DATA, 0, NOB, 0},
    {2, "R_X86_64_PC32", 4, 'L', K_DATA, 1, I32, 0},
    {4, "R_X86_64_PLT32", 4, 'L', K_DATA, 1, I32, 0},
    {9, "R_X86_64_GOTPCREL", 4, 'G', K_DATA, 1, I32, 0},
    {10, "R_X86_64_32", 4, 'S', K_DATA, 0, U32, 0},
    {11, "R_X86_64_32S", 4, 'S', K_DATA, 0, I32, 0},
    {24, "R_X86_64_PC64", 8, 'S', K_DATA, 1, NOB, 0},
    {41, "R_X86_64_GOTPCRELX", 4, 'G', K_DATA, 1, I32, 0},
    {42, "R_X86_64_REX_GOTPCRELX", 4, 'G', K_DATA, 1, I32, 0},
};
static const reloc_kind A64[] = {
    {257, "R_AARCH64_ABS64", 8, 'S', K_DATA, 0, NOB, 0},
    {258, "R_AARCH64_ABS32", 4, 'S', K_DATA, 0, I32U32, 0},
    {260, "R_AARCH64_PREL64", 8, 'S', K_DATA, 1, NOB, 0},
    {261, "R_AARCH64_PREL32", 4, 'S', K_DATA, 1, I32U32, 0},
    {275, "R_AARCH64_ADR_PREL_PG_HI21", 4, 'S', K_PAGE21, 0, NOB, 0},
    {277, "R_AARCH64_ADD_ABS_LO12_NC", 4, 'S', K_LO12, 0, NOB, 0},
    {278, "R_AARCH64_LDST8_ABS_LO12_NC", 4, 'S', K_LO12, 0, NOB, 0},
    {282, "R_AARCH64_JUMP26", 4, 'L', K_BRANCH26, 0, NOB, 0},
    {283, "R_AARCH64_CALL26", 4, 'L', K_BRANCH26, 0, NOB, 0},
    {284, "R_AARCH64_LDST16_ABS_LO12_NC", 4, 'S', K_LO12, 0, NOB, 1},
    {285, "R_AARCH64_LDST32_ABS_LO12_NC", 4, 'S', K_LO12, 0, NOB, 2},
    {286, "R_AARCH64_LDST64_ABS_LO12_NC", 4, 'S', K_LO12, 0, NOB, 3},
    {299, "R_AARCH64_LDST128_ABS_LO12_NC", 4, 'S', K_LO12, 0, NOB, 4},
    {311, "R_AARCH64_ADR_GOT_PAGE", 4, 'G', K_PAGE21, 0, NOB, 0},
    {312, "R_AARCH64_LD64_GOT_LO12_NC", 4, 'G', K_LO12, 0, NOB, 3},
};

typedef struct {
    const uint8_t *d;
    size_t n;
    int a64;
    mlc_error *err;
} obj;

static uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static mlc_status bad(obj *o, const char *fmt, const char *a, long long x, long long y)
{
    char what[256];
    snprintf(what, sizeof what, fmt, a, x, y);
    return mlc_fail(o->err, MLC_ERR_CODE, "object code cannot be mapped: %s", what);
}

static const reloc_kind *find_kind(int a64, uint32_t t)
{
    const reloc_kind *table = a64 ? A64 : X86;
    size_t n = a64 ? sizeof A64 / sizeof A64[0] : sizeof X86 / sizeof X86[0];
    for (size_t i = 0; i < n; i++)
        if (table[i].type == t)
            return &table[i];
    return NULL;
}

/* A NUL-terminated name inside a string table section, or NULL. */
static const char *cstr(obj *o, const section *tab, uint64_t off)
{
    if (off >= tab->size)
        return NULL;
    const char *s = (const char *)o->d + tab->offset + off;
    if (!memchr(s, 0, tab->size - off))
        return NULL;
    return s;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

static int is_loaded(const section *s)
{
    return (s->flags & SHF_ALLOC) && (s->type == SHT_PROGBITS || s->type == SHT_NOBITS)
           && strncmp(s->sname, ".eh_frame", 9) != 0;
}

static const char *const EXTERNALS[] = {"memcpy", "memmove", "memset"};

static uintptr_t external(const char *name)
{
    if (!strcmp(name, "memcpy"))
        return (uintptr_t)&memcpy;
    if (!strcmp(name, "memmove"))
        return (uintptr_t)&memmove;
    if (!strcmp(name, "memset"))
        return (uintptr_t)&memset;
    return 0;
}

static void stub(int a64, uint8_t *at, uint64_t place, uint64_t got)
{
    if (!a64) {
        int32_t disp = (int32_t)(int64_t)(got - (place + 6));
        at[0] = 0xFF;
        at[1] = 0x25;
        memcpy(at + 2, &disp, 4);
        at[6] = at[7] = 0xCC;
        return;
    }
    int64_t imm = ((int64_t)(got & ~0xFFFull) - (int64_t)(place & ~0xFFFull)) >> 12;
    uint32_t w[4];
    w[0] = 0x90000010u | (uint32_t)((imm & 3) << 29) | (uint32_t)(((imm >> 2) & 0x7FFFF) << 5);
    w[1] = 0xF9400210u | (uint32_t)(((got & 0xFFF) >> 3) << 10);
    w[2] = 0xD61F0200u;
    w[3] = 0xD4200000u;
    memcpy(at, w, 16);
}

static mlc_status apply(obj *o, const reloc_kind *k, uint8_t *at, uint64_t place, uint64_t tgt,
                        int64_t addend, const char *secname)
{
    uint64_t value;
    char where[200];
    snprintf(where, sizeof where, "%s in section %s", k->name, secname);
    if (k->k == K_DATA) {
        value = tgt + (uint64_t)addend - (k->pcrel ? place : 0);
        if (k->bounded) {
            int64_t v = (int64_t)value;
            if (v < k->lo || v >= k->hi)
                return bad(o, "relocation %s overflows: %#llx is outside its range", where,
                           (long long)v, 0);
        }
        if (k->width == 8)
            memcpy(at, &value, 8);
        else {
            uint32_t v32 = (uint32_t)value;
            memcpy(at, &v32, 4);
        }
        return MLC_OK;
    }
    uint32_t insn = u32(at);
    if (k->target == 'G' && addend)
        return bad(o, "relocation %s with a nonzero addend is not supported", where, 0, 0);
    if (k->k == K_BRANCH26) {
        int64_t v = (int64_t)(tgt + (uint64_t)addend - place);
        if (v < -(1LL << 27) || v >= (1LL << 27))
            return bad(o, "relocation %s overflows: %#llx", where, (long long)v, 0);
        if (v & 3)
            return bad(o, "relocation %s needs a multiple of 4, got %#llx", where, (long long)v,
                       0);
        insn = (insn & 0xFC000000u) | (uint32_t)((v >> 2) & 0x03FFFFFF);
    } else if (k->k == K_PAGE21) {
        int64_t v = (int64_t)(((tgt + (uint64_t)addend) & ~0xFFFull) - (place & ~0xFFFull));
        if (v < -(1LL << 32) || v >= (1LL << 32))
            return bad(o, "relocation %s overflows: %#llx", where, (long long)v, 0);
        int64_t imm = v >> 12;
        insn = (insn & 0x9F00001Fu) | (uint32_t)((imm & 3) << 29)
               | (uint32_t)(((imm >> 2) & 0x7FFFF) << 5);
    } else {
        uint64_t v = (tgt + (uint64_t)addend) & 0xFFF;
        if (v & ((1u << k->shift) - 1))
            return bad(o, "relocation %s needs a multiple of %lld, got %#llx", where,
                       1LL << k->shift, (long long)v);
        insn = (insn & ~(0xFFFu << 10)) | (uint32_t)((v >> k->shift) << 10);
    }
    memcpy(at, &insn, 4);
    return MLC_OK;
}

mlc_status mlc_elf_load(const uint8_t *d, size_t n, const char *arch, mlc_alloc *a,
                        mlc_image *img, mlc_error *err)
{
    obj o = {d, n, 0, err};
    memset(img, 0, sizeof *img);
    if (!strcmp(arch, "aarch64"))
        o.a64 = 1;
    else if (strcmp(arch, "x86_64"))
        return mlc_fail(err, MLC_ERR_CODE, "cannot load object code for architecture '%s'; "
                        "supported: x86_64, aarch64", arch);
    if (strcmp(arch, mlc_real_arch()))
        return mlc_fail(err, MLC_ERR_CODE, "cannot map %s object code on this %s machine",
                        arch, mlc_real_arch());
    if (n < 64)
        return bad(&o, "object code is truncated: %s%lld bytes, an ELF header alone needs 64",
                   "", (long long)n, 0);
    if (memcmp(d, "\x7f" "ELF", 4))
        return bad(&o, "object code is not ELF (bad magic)%s", "", 0, 0);
    if (d[4] != 2 || d[5] != 1)
        return bad(&o, "object code is not 64-bit little-endian ELF%s", "", 0, 0);
    uint16_t e_type = u16(d + 16), e_machine = u16(d + 18);
    uint64_t shoff = u64(d + 40);
    uint16_t shentsize = u16(d + 58), shnum = u16(d + 60), shstrndx = u16(d + 62);
    if (e_type != 1)
        return bad(&o, "object code is ELF type %s%lld, not a relocatable object (1)", "",
                   e_type, 0);
    if (e_machine != (o.a64 ? 183 : 62))
        return bad(&o, "object code is for machine %s%lld, not the expected %lld", "", e_machine,
                   o.a64 ? 183 : 62);
    if (shnum == 0 || shentsize != 64)
        return bad(&o, "object code has %s%lld section headers of %lld bytes", "", shnum,
                   shentsize);
    if (shoff > n || (uint64_t)shnum * 64 > n - shoff)
        return bad(&o, "section header table at %s%lld runs past the end", "", (long long)shoff,
                   0);
    if (shstrndx >= shnum)
        return bad(&o, "section name table index %s%lld is out of range", "", shstrndx, 0);
    section *secs = mlc_zalloc(a, shnum * sizeof(section));
    if (!secs)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < shnum; i++) {
        const uint8_t *h = d + shoff + 64 * i;
        section *s = &secs[i];
        s->name = u32(h);
        s->type = u32(h + 4);
        s->flags = u64(h + 8);
        s->offset = u64(h + 24);
        s->size = u64(h + 32);
        s->link = u32(h + 40);
        s->info = u32(h + 44);
        s->align = u64(h + 48);
        s->entsize = u64(h + 56);
        if (s->type != SHT_NOBITS && (s->offset > n || s->size > n - s->offset))
            return bad(&o, "section %s%lld runs past the end (%lld bytes)", "", (long long)i,
                       (long long)n);
        if ((s->align & (s->align - 1)) || s->align > MAX_ALIGN)
            return bad(&o, "section %s%lld has unsupported alignment %lld", "", (long long)i,
                       (long long)s->align);
        if (!s->align)
            s->align = 1;
    }
    section *names = &secs[shstrndx];
    if (names->type != SHT_STRTAB)
        return bad(&o, "section name table %s%lld is not a string table", "", shstrndx, 0);
    for (size_t i = 0; i < shnum; i++) {
        secs[i].sname = cstr(&o, names, secs[i].name);
        if (!secs[i].sname)
            return bad(&o, "section %s%lld: its name lies outside its string table", "",
                       (long long)i, 0);
    }
    long symtab = -1;
    for (size_t i = 0; i < shnum; i++) {
        section *s = &secs[i];
        if (s->type == SHT_SYMTAB) {
            if (symtab >= 0)
                return bad(&o, "object code has more than one symbol table%s", "", 0, 0);
            symtab = (long)i;
        }
        if (!is_loaded(s))
            continue;
        if (s->flags & SHF_TLS)
            return bad(&o, "section %s uses thread-local storage, which is unsupported",
                       s->sname, 0, 0);
        if (s->flags & SHF_EXECINSTR) {
            if (s->flags & SHF_WRITE)
                return bad(&o, "section %s is both writable and executable", s->sname, 0, 0);
            s->region = R_TEXT;
        } else if (!strncmp(s->sname, ".data.rel.ro", 12)) {
            s->region = R_RO;
        } else {
            s->region = (s->flags & SHF_WRITE) ? R_RW : R_RO;
        }
    }
    /* symbols */
    size_t nsyms = 0;
    const section *strtab = NULL;
    const uint8_t *symrows = NULL;
    if (symtab >= 0) {
        section *st = &secs[symtab];
        if (st->link >= shnum || secs[st->link].type != SHT_STRTAB)
            return bad(&o, "symbol table links section %s%lld, not a string table", "",
                       st->link, 0);
        strtab = &secs[st->link];
        if (st->size % 24 || (st->entsize != 0 && st->entsize != 24))
            return bad(&o, "symbol table has entries of %s%lld bytes, size %lld", "",
                       (long long)st->entsize, (long long)st->size);
        nsyms = st->size / 24;
        symrows = d + st->offset;
    }
    symbol *syms = mlc_zalloc(a, (nsyms ? nsyms : 1) * sizeof(symbol));
    uint64_t *addr = mlc_zalloc(a, (nsyms ? nsyms : 1) * sizeof(uint64_t));
    uint8_t *flags = mlc_zalloc(a, nsyms ? nsyms : 1);   /* 1 loaded, 2 external, 4 resolved */
    if (!syms || !addr || !flags)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < nsyms; i++) {
        const uint8_t *r = symrows + 24 * i;
        symbol *s = &syms[i];
        s->name = u32(r);
        s->info = r[4];
        s->shndx = u16(r + 6);
        s->value = u64(r + 8);
        s->size = u64(r + 16);
        if (s->name >= (strtab->size ? strtab->size : 1))
            return bad(&o, "a symbol name offset lies outside the string table%s", "", 0, 0);
    }
    for (size_t i = 0; i < nsyms; i++) {
        symbol *s = &syms[i];
        if (s->shndx >= SHN_LORESERVE && s->shndx != SHN_ABS && s->shndx != SHN_COMMON)
            return bad(&o, "symbol %s%lld uses unsupported special section index %#llx", "",
                       (long long)i, s->shndx);
        if (s->shndx > 0 && s->shndx < SHN_LORESERVE) {
            if (s->shndx >= shnum)
                return bad(&o, "a symbol refers to a section index beyond the %s%lld sections",
                           "", shnum, 0);
            if (secs[s->shndx].region != R_NONE) {
                flags[i] |= 1;
                if (s->value > secs[s->shndx].size)
                    return bad(&o, "a symbol's value lies beyond the end of its section%s", "",
                               0, 0);
            }
        }
    }
    for (size_t i = 1; i < nsyms; i++) {
        if (syms[i].shndx != 0)
            continue;
        const char *name = cstr(&o, strtab, syms[i].name);
        if (!name)
            return bad(&o, "symbol %s%lld: its name is not NUL-terminated", "", (long long)i, 0);
        uintptr_t ext = external(name);
        if (!ext) {
            char shown[64];
            snprintf(shown, sizeof shown, "%s", name);
            return bad(&o, "object code needs external symbol '%s', which the runtime does not "
                       "provide", shown, 0, 0);
        }
        addr[i] = ext;
        flags[i] |= 2;
    }
    (void)EXTERNALS;
    /* relocation sections: validate, find the GOT and stub symbols */
    uint8_t *in_got = mlc_zalloc(a, nsyms ? nsyms : 1), *in_stub = mlc_zalloc(a, nsyms ? nsyms : 1);
    if (!in_got || !in_stub)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    for (size_t i = 0; i < shnum; i++) {
        section *s = &secs[i];
        if (s->type != SHT_RELA && s->type != SHT_REL)
            continue;
        if (s->info >= shnum)
            return bad(&o, "relocation section %s targets section %lld, but there are %lld",
                       s->sname, s->info, shnum);
        section *t = &secs[s->info];
        if (!is_loaded(t))
            continue;
        if (s->type == SHT_REL)
            return bad(&o, "%s: REL relocations (implicit addends) are unsupported", s->sname, 0,
                       0);
        if ((long)s->link != symtab)
            return bad(&o, "relocation section %s links section %lld, not the symbol table",
                       s->sname, s->link, 0);
        if (s->size % 24 || (s->entsize != 0 && s->entsize != 24))
            return bad(&o, "relocation section %s has entries of %lld bytes, size %lld",
                       s->sname, (long long)s->entsize, (long long)s->size);
        for (uint64_t r = 0; r < s->size / 24; r++) {
            const uint8_t *row = d + s->offset + 24 * r;
            uint64_t off = u64(row), info = u64(row + 8);
            uint64_t sym = info >> 32;
            uint32_t type = (uint32_t)info;
            if (sym >= nsyms)
                return bad(&o, "%s: symbol index %lld is out of range (%lld symbols)", s->sname,
                           (long long)sym, (long long)nsyms);
            const reloc_kind *k = find_kind(o.a64, type);
            if (!k)
                return bad(&o, "%s: unsupported relocation type %lld", s->sname, type, 0);
            if (t->size < (uint64_t)k->width || off > t->size - (uint64_t)k->width)
                return bad(&o, "%s: a relocation at offset %lld lies outside its section",
                           s->sname, (long long)off, 0);
            if (k->target == 'G')
                in_got[sym] = 1;
            if (k->target == 'L' && (flags[sym] & 2))
                in_stub[sym] = 1;
        }
    }
    /* layout */
    long pagesize = sysconf(_SC_PAGESIZE);
    uint64_t page = pagesize > 0 ? (uint64_t)pagesize : 4096;
    uint64_t max_align = page;
    for (size_t i = 0; i < shnum; i++)
        if (secs[i].region && secs[i].align > max_align)
            max_align = secs[i].align;
    size_t nstub = 0, ngot = 0;
    for (size_t i = 0; i < nsyms; i++) {
        nstub += in_stub[i];
        if (in_stub[i])
            in_got[i] = 1;   /* every stub jumps through a GOT entry */
        ngot += in_got[i];
    }
    uint64_t starts[4] = {0}, cursor = 0, stub_off = 0, got_off = 0;
    uint64_t *common_off = mlc_zalloc(a, (nsyms ? nsyms : 1) * sizeof(uint64_t));
    if (!common_off)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    const int stub_size = o.a64 ? 16 : 8;
    for (int region = R_TEXT; region <= R_RW; region++) {
        cursor = align_up(cursor, page);
        starts[region - 1] = cursor;
        for (size_t i = 0; i < shnum; i++)
            if (secs[i].region == region) {
                cursor = align_up(cursor, secs[i].align);
                secs[i].load = cursor;
                if (secs[i].size > MAX_IMAGE)
                    return bad(&o, "object code needs more than %s%lld bytes of memory", "",
                               MAX_IMAGE, 0);
                cursor += secs[i].size;
            }
        if (region == R_TEXT) {
            cursor = align_up(cursor, 16);
            stub_off = cursor;
            cursor += (uint64_t)stub_size * nstub;
        } else if (region == R_RO) {
            cursor = align_up(cursor, 8);
            got_off = cursor;
            cursor += 8 * ngot;
        } else {
            for (size_t i = 0; i < nsyms; i++) {
                if (syms[i].shndx != SHN_COMMON)
                    continue;
                uint64_t al = syms[i].value ? syms[i].value : 1;
                if ((al & (al - 1)) || al > MAX_ALIGN)
                    return bad(&o, "common symbol %s%lld has unsupported alignment %lld", "",
                               (long long)i, (long long)al);
                if (syms[i].size > MAX_IMAGE)
                    return bad(&o, "object code needs more than %s%lld bytes of memory", "",
                               MAX_IMAGE, 0);
                cursor = align_up(cursor, al);
                common_off[i] = cursor;
                cursor += syms[i].size;
                if (al > max_align)
                    max_align = al;
            }
        }
        if (cursor > MAX_IMAGE)
            return bad(&o, "object code needs more than %s%lld bytes of memory", "", MAX_IMAGE,
                       0);
    }
    uint64_t total = align_up(cursor ? cursor : 1, page);
    size_t mapped = (size_t)(total + max_align - page);
    void *raw = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return mlc_fail(err, MLC_ERR_CODE, "mapping %zu bytes for object code failed", mapped);
    uint8_t *base = (uint8_t *)(((uintptr_t)raw + max_align - 1) & ~(uintptr_t)(max_align - 1));
    img->raw = raw;
    img->mapped = mapped;
    img->base = base;
    img->size = (size_t)total;
    mlc_status st = MLC_OK;
    for (size_t i = 0; i < shnum; i++)
        if (secs[i].region && secs[i].type == SHT_PROGBITS)
            memcpy(base + secs[i].load, d + secs[i].offset, secs[i].size);
    for (size_t i = 0; i < nsyms; i++) {
        if (flags[i] & 1)
            addr[i] = (uint64_t)(uintptr_t)(base + secs[syms[i].shndx].load) + syms[i].value;
        else if (syms[i].shndx == SHN_ABS)
            addr[i] = syms[i].value;
        else if (syms[i].shndx == SHN_COMMON)
            addr[i] = (uint64_t)(uintptr_t)(base + common_off[i]);
        if ((flags[i] & 1) || syms[i].shndx == SHN_ABS || syms[i].shndx == SHN_COMMON
            || syms[i].shndx == 0)
            flags[i] |= 4;
    }
    uint64_t *got = mlc_zalloc(a, (nsyms ? nsyms : 1) * sizeof(uint64_t));
    uint64_t *call = mlc_zalloc(a, (nsyms ? nsyms : 1) * sizeof(uint64_t));
    if (!got || !call) {
        st = mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
        goto fail;
    }
    size_t gi = 0, si = 0;
    for (size_t i = 0; i < nsyms; i++) {
        call[i] = addr[i];
        if (in_got[i]) {
            got[i] = (uint64_t)(uintptr_t)(base + got_off + 8 * gi);
            memcpy(base + got_off + 8 * gi, &addr[i], 8);
            gi++;
        }
    }
    for (size_t i = 0; i < nsyms; i++)
        if (in_stub[i]) {
            uint64_t at = stub_off + (uint64_t)stub_size * si++;
            call[i] = (uint64_t)(uintptr_t)(base + at);
            stub(o.a64, base + at, call[i], got[i]);
        }
    for (size_t i = 0; i < shnum && !st; i++) {
        section *s = &secs[i];
        if (s->type != SHT_RELA)
            continue;
        section *t = &secs[s->info];
        if (!is_loaded(t))
            continue;
        for (uint64_t r = 0; r < s->size / 24; r++) {
            const uint8_t *row = d + s->offset + 24 * r;
            uint64_t off = u64(row), info = u64(row + 8);
            int64_t addend = (int64_t)u64(row + 16);
            uint64_t sym = info >> 32;
            const reloc_kind *k = find_kind(o.a64, (uint32_t)info);
            if (!(flags[sym] & 4)) {
                st = bad(&o, "relocation in %s refers to symbol %lld in a section that is not "
                         "loaded", t->sname, (long long)sym, 0);
                break;
            }
            uint64_t tgt = k->target == 'S' ? addr[sym] : k->target == 'L' ? call[sym] : got[sym];
            uint64_t place = (uint64_t)(uintptr_t)(base + t->load) + off;
            st = apply(&o, k, base + t->load + off, place, tgt, addend, t->sname);
            if (st)
                break;
        }
    }
    if (st)
        goto fail;
    /* exports: global/weak/unique functions and objects */
    size_t nexp = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < nsyms; i++) {
            int bind = syms[i].info >> 4, type = syms[i].info & 0xF;
            if (!((flags[i] & 1) || syms[i].shndx == SHN_COMMON))
                continue;
            if (!(bind == 1 || bind == 2 || bind == 10) || !(type == 1 || type == 2))
                continue;
            if (pass == 1) {
                const char *name = cstr(&o, strtab, syms[i].name);
                if (!name) {
                    st = bad(&o, "symbol %s%lld: its name is not NUL-terminated", "",
                             (long long)i, 0);
                    goto fail;
                }
                img->sym_names[img->nsyms] = name;
                img->sym_addrs[img->nsyms++] = (uintptr_t)addr[i];
            } else {
                nexp++;
            }
        }
        if (pass == 0) {
            img->sym_names = mlc_zalloc(a, (nexp ? nexp : 1) * sizeof(char *));
            img->sym_addrs = mlc_zalloc(a, (nexp ? nexp : 1) * sizeof(uintptr_t));
            if (!img->sym_names || !img->sym_addrs) {
                st = mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
                goto fail;
            }
        }
    }
    for (size_t i = 0; i < shnum; i++)
        if (secs[i].region == R_TEXT)
            img->code_size += secs[i].size;
    if (starts[1] > starts[0]
        && mprotect(base + starts[0], starts[1] - starts[0], PROT_READ | PROT_EXEC) != 0) {
        st = mlc_fail(err, MLC_ERR_CODE, "changing the protection of object code failed");
        goto fail;
    }
    if (starts[2] > starts[1] && mprotect(base + starts[1], starts[2] - starts[1], PROT_READ)) {
        st = mlc_fail(err, MLC_ERR_CODE, "changing the protection of object code failed");
        goto fail;
    }
#if defined(__aarch64__)
    __builtin___clear_cache((char *)base + starts[0], (char *)base + starts[1]);
#endif
    return MLC_OK;
fail:
    munmap(raw, mapped);
    memset(img, 0, sizeof *img);
    return st;
}

uintptr_t mlc_image_symbol(const mlc_image *img, const char *name)
{
    /* the symbol names point into the bundle, which stays mapped while the model is open */
    for (size_t i = 0; i < img->nsyms; i++)
        if (!strcmp(img->sym_names[i], name))
            return img->sym_addrs[i];
    return 0;
}

void mlc_elf_unload(mlc_image *img)
{
    if (img->raw)
        munmap(img->raw, img->mapped);
    memset(img, 0, sizeof *img);
}
