/* A strict msgpack reader for bundle headers: every length checked against the bytes left
 * before anything is allocated, nesting limited to MP_MAX_DEPTH, str must be valid UTF-8, map
 * keys must be str or bin, ext types refused (as the Python runtime's msgpack.Unpacker with
 * strict_map_key=True, raw=False, max_ext_len=0). A key given twice: the last one counts, as in
 * the Python dict msgpack-python builds. */
#include <string.h>

#include "internal.h"

typedef struct {
    const uint8_t *p, *end;
    mlc_alloc *alloc;
    mlc_error *err;
} reader;

static mlc_status bad(reader *r, const char *why)
{
    return mlc_fail(r->err, MLC_ERR_BUNDLE, "%s", why);
}

static int need(reader *r, uint64_t n)
{
    return (uint64_t)(r->end - r->p) >= n;
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static int utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i < (size_t)len)
            return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)
            || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += (size_t)len;
    }
    return 1;
}

static mlc_status parse(reader *r, mp_node *out, int depth);

static mlc_status container(reader *r, mp_node *out, uint8_t type, uint64_t n, int depth)
{
    if (depth >= MP_MAX_DEPTH)
        return bad(r, "header is corrupted (nested too deeply); the file is damaged or "
                      "truncated: export it again");
    uint64_t items = type == MP_MAP ? 2 * n : n;
    /* every item takes at least one byte: a count past the bytes left is damage */
    if (!need(r, items))
        return bad(r, "header is corrupted (a container runs past the end); the file is "
                      "damaged or truncated: export it again");
    out->type = type;
    out->len = (uint32_t)n;
    out->v.items = NULL;
    if (items) {
        out->v.items = mlc_zalloc(r->alloc, (size_t)items * sizeof(mp_node));
        if (!out->v.items)
            return mlc_fail(r->err, MLC_ERR_INTERNAL, "out of memory reading the header");
    }
    for (uint64_t i = 0; i < items; i++) {
        mlc_status s = parse(r, &out->v.items[i], depth + 1);
        if (s)
            return s;
        if (type == MP_MAP && i % 2 == 0 && out->v.items[i].type != MP_STR
            && out->v.items[i].type != MP_BIN)
            return bad(r, "header is corrupted (a map key is not a string); the file is "
                          "damaged: export it again");
    }
    return MLC_OK;
}

static mlc_status bytes(reader *r, mp_node *out, uint8_t type, uint64_t n)
{
    if (!need(r, n))
        return bad(r, "header is corrupted (a string runs past the end); the file is damaged "
                      "or truncated: export it again");
    if (type == MP_STR && !utf8_ok(r->p, (size_t)n))
        return bad(r, "header is corrupted (a string is not UTF-8); the file is damaged: "
                      "export it again");
    out->type = type;
    out->len = (uint32_t)n;
    out->v.p = r->p;
    r->p += n;
    return MLC_OK;
}

static mlc_status parse(reader *r, mp_node *out, int depth)
{
    if (!need(r, 1))
        return bad(r, "header is corrupted (it ends early); the file is damaged or truncated: "
                      "export it again");
    uint8_t c = *r->p++;
    static const uint8_t widths[4] = {1, 2, 4, 8};
    if (c <= 0x7F) {
        out->type = MP_INT;
        out->v.i = c;
        return MLC_OK;
    }
    if (c >= 0xE0) {
        out->type = MP_INT;
        out->v.i = (int8_t)c;
        return MLC_OK;
    }
    if ((c & 0xF0) == 0x80)
        return container(r, out, MP_MAP, c & 0x0F, depth);
    if ((c & 0xF0) == 0x90)
        return container(r, out, MP_ARRAY, c & 0x0F, depth);
    if ((c & 0xE0) == 0xA0)
        return bytes(r, out, MP_STR, c & 0x1F);
    switch (c) {
    case 0xC0:
        out->type = MP_NIL;
        return MLC_OK;
    case 0xC2:
    case 0xC3:
        out->type = MP_BOOL;
        out->v.i = c == 0xC3;
        return MLC_OK;
    case 0xC4: case 0xC5: case 0xC6:
    case 0xD9: case 0xDA: case 0xDB: {
        int w = (c >= 0xD9) ? widths[c - 0xD9] : widths[c - 0xC4];
        if (!need(r, (uint64_t)w))
            return bad(r, "header is corrupted (it ends early); the file is damaged or "
                          "truncated: export it again");
        uint64_t n = be(r->p, w);
        r->p += w;
        return bytes(r, out, c >= 0xD9 ? MP_STR : MP_BIN, n);
    }
    case 0xCA:
    case 0xCB: {
        int w = c == 0xCA ? 4 : 8;
        if (!need(r, (uint64_t)w))
            return bad(r, "header is corrupted (it ends early); the file is damaged or "
                          "truncated: export it again");
        uint64_t bits = be(r->p, w);
        r->p += w;
        out->type = MP_FLOAT;
        if (w == 4) {
            uint32_t b32 = (uint32_t)bits;
            float f;
            memcpy(&f, &b32, 4);
            out->v.f = f;
        } else {
            memcpy(&out->v.f, &bits, 8);
        }
        return MLC_OK;
    }
    case 0xCC: case 0xCD: case 0xCE: case 0xCF:
    case 0xD0: case 0xD1: case 0xD2: case 0xD3: {
        int sign = c >= 0xD0;
        int w = widths[(c - 0xCC) & 3];
        if (!need(r, (uint64_t)w))
            return bad(r, "header is corrupted (it ends early); the file is damaged or "
                          "truncated: export it again");
        uint64_t v = be(r->p, w);
        r->p += w;
        if (sign) {
            int shift = 64 - 8 * w;
            out->type = MP_INT;
            out->v.i = shift ? (int64_t)(v << shift) >> shift : (int64_t)v;
        } else if (v > (uint64_t)INT64_MAX) {
            out->type = MP_UINT;
            out->v.u = v;
        } else {
            out->type = MP_INT;
            out->v.i = (int64_t)v;
        }
        return MLC_OK;
    }
    case 0xDC: case 0xDD: case 0xDE: case 0xDF: {
        int w = (c == 0xDC || c == 0xDE) ? 2 : 4;
        if (!need(r, (uint64_t)w))
            return bad(r, "header is corrupted (it ends early); the file is damaged or "
                          "truncated: export it again");
        uint64_t n = be(r->p, w);
        r->p += w;
        return container(r, out, c <= 0xDD ? MP_ARRAY : MP_MAP, n, depth);
    }
    default:   /* 0xC1 (never used), ext types */
        return bad(r, "header is corrupted (an unsupported msgpack type); the file is damaged: "
                      "export it again");
    }
}

mlc_status mp_parse(const uint8_t *data, size_t size, mlc_alloc *alloc, mp_node **root,
                    size_t *used, mlc_error *err)
{
    reader r = {data, data + size, alloc, err};
    mp_node *node = mlc_zalloc(alloc, sizeof(mp_node));
    if (!node)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory reading the header");
    mlc_status s = parse(&r, node, 0);
    if (s)
        return s;
    *root = node;
    *used = (size_t)(r.p - data);
    return MLC_OK;
}

int mp_str_eq(const mp_node *n, const char *s)
{
    size_t len = strlen(s);
    return n && n->type == MP_STR && n->len == len && memcmp(n->v.p, s, len) == 0;
}

const mp_node *mp_get(const mp_node *map, const char *key)
{
    if (!map || map->type != MP_MAP)
        return NULL;
    const mp_node *found = NULL;
    for (uint32_t i = 0; i < map->len; i++)
        if (mp_str_eq(&map->v.items[2 * i], key))
            found = &map->v.items[2 * i + 1];
    return found;
}

int mp_is_int(const mp_node *n)
{
    return n && n->type == MP_INT;
}

char *mp_strdup(mlc_alloc *a, const mp_node *n)
{
    if (!n || n->type != MP_STR)
        return NULL;
    char *s = mlc_zalloc(a, (size_t)n->len + 1);
    if (s)
        memcpy(s, n->v.p, n->len);
    return s;
}
