/* Reading a bundle: the file layout (runtime/bundle.py: magic, header map, digest, payload
 * area), the format version, the content digest and the signature (runtime/signing.py); the
 * dtype table. The header's records are records.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define FORMAT_MAJOR 1
#define FORMAT_MINOR 2
#define SYMBOLIC_MINOR 3
#define PAYLOAD64_MINOR 4
#define STORED_MINOR 5      /* a constant's "stored" record (8-bit integers) */
#define DYNAMIC_MINOR 6     /* the symbolic record's "dynamic" sizes (BIND_SIZE) */
#define BRANCH_MINOR 7      /* the vm record's "branches" (JUMP_UNLESS, JUMP, TRAP) */
#define VALUES_MINOR 6      /* the symbolic record's "values" (sizes from inputs' values) */
#define SCALES_MINOR 7      /* the symbolic record's "scales" (sizes from float scales) */
#define LOOP_MINOR 8        /* the vm record's "loops" (LOOP, NEXT) */
#define STORE_MINOR 9       /* the vm record's "stores" (STORE rows, APPEND, TRAP 2) */
#define GROW_MINOR 10       /* the vm record's "grows" (a Loop's carried values that grow) */
#define ALIGN 64
#define MAX_HEADER_BYTES (64u << 20)
#define MAX_DIM (1LL << 40)
#define MAX_PLANS 64
#define MIN_CHUNK (1u << 12)
#define MAX_CHUNK (1u << 30)

static const uint8_t MAGIC[9] = {0x83, 0xa7, 'm', 'l', 'c', 'p', 'a', 'c', 'k'};
static const uint8_t DIGEST_KEY[9] = {0xa6, 's', 'h', 'a', '2', '5', '6', 0xc4, 0x20};
static const uint8_t DATA_KEY[6] = {0xa4, 'd', 'a', 't', 'a', 0xc6};
#define TRAILER_BYTES (9 + 32 + 6 + 4)

static const char *const DTYPE_NAMES[MLC_DTYPE_COUNT] = {
    "float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "bool", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
    "float8_e5m2fnuz", "int4", "uint4", "int2", "uint2"};
static const uint8_t DTYPE_SIZES[MLC_DTYPE_COUNT] = {4, 8, 2, 1, 2, 4, 8, 1, 2, 4, 8, 1, 2,
                                                     1, 1, 1, 1, 1, 1, 1, 1};

const char *mlc_dtype_name(mlc_dtype d)
{
    return (unsigned)d < MLC_DTYPE_COUNT ? DTYPE_NAMES[d] : "?";
}

size_t mlc_dtype_size(mlc_dtype d)
{
    return (unsigned)d < MLC_DTYPE_COUNT ? DTYPE_SIZES[d] : 0;
}

mlc_dtype mlc_storage(mlc_dtype d)
{
    if (d == MLC_BFLOAT16)
        return MLC_UINT16;
    if (d >= MLC_FLOAT8_E4M3FN)
        return MLC_UINT8;
    return d;
}

mlc_status mlc_nbytes(const int64_t *shape, int ndim, mlc_dtype dtype, uint64_t *out)
{
    uint64_t n = mlc_dtype_size(dtype);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n))
            return MLC_ERR_BUNDLE;
    *out = n;
    return MLC_OK;
}

static int is_version(const mp_node *n)
{
    return n && n->type == MP_ARRAY && n->len == 2 && mp_is_int(&n->v.items[0])
           && mp_is_int(&n->v.items[1]);
}

/* ---- the file: layout, version, digest ---- */

static mlc_status check_version(mlc_model *m, mlc_error *err)
{
    const mp_node *h = m->header, *fmt = mp_get(h, "format");
    if (!is_version(fmt))
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s: header has no valid format version", m->name);
    int64_t major = fmt->v.items[0].v.i, minor = fmt->v.items[1].v.i;
    const mp_node *ver = mp_get(mp_get(h, "compiler"), "version");
    char made_by[64] = "?";
    if (ver && ver->type == MP_STR)
        snprintf(made_by, sizeof made_by, "%.*s", (int)(ver->len < 40 ? ver->len : 40),
                 (const char *)ver->v.p);
    if (major != FORMAT_MAJOR)
        return mlc_fail(err, MLC_ERR_FORMAT, "%s has bundle format %lld.%lld (mlcpack %s); "
                        "this runtime reads format %d.x: %s", m->name, (long long)major,
                        (long long)minor, made_by, FORMAT_MAJOR,
                        major > FORMAT_MAJOR ? "upgrade the runtime" : "export the model again");
    int64_t reads = FORMAT_MINOR;
    if (mp_get(h, "symbolic"))
        reads = SYMBOLIC_MINOR;
    if (mp_get(h, "payload"))
        reads = PAYLOAD64_MINOR;
    const mp_node *consts = mp_get(h, "constants");
    for (uint32_t i = 0; consts && consts->type == MP_ARRAY && i < consts->len; i++)
        if (consts->v.items[i].type == MP_MAP && mp_get(&consts->v.items[i], "stored"))
            reads = STORED_MINOR;
    const mp_node *symrec = mp_get(h, "symbolic");
    if (symrec && symrec->type == MP_MAP && mp_get(symrec, "dynamic"))
        reads = DYNAMIC_MINOR;
    if (symrec && symrec->type == MP_MAP && mp_get(symrec, "values"))
        reads = VALUES_MINOR;
    if (symrec && symrec->type == MP_MAP && mp_get(symrec, "scales"))
        reads = SCALES_MINOR;
    const mp_node *vmrec = mp_get(h, "vm");
    if (vmrec && vmrec->type == MP_MAP && mp_get(vmrec, "branches"))
        reads = BRANCH_MINOR;
    if (vmrec && vmrec->type == MP_MAP && mp_get(vmrec, "loops"))
        reads = LOOP_MINOR;
    if (vmrec && vmrec->type == MP_MAP && mp_get(vmrec, "stores"))
        reads = STORE_MINOR;
    if (vmrec && vmrec->type == MP_MAP && mp_get(vmrec, "grows"))
        reads = GROW_MINOR;
    if (minor > reads) {
        const mp_node *need = mp_get(h, "min_reader");
        if (!need)
            need = fmt;
        if (!is_version(need) || need->v.items[0].v.i > FORMAT_MAJOR
            || (need->v.items[0].v.i == FORMAT_MAJOR && need->v.items[1].v.i > reads))
            return mlc_fail(err, MLC_ERR_FORMAT, "%s has bundle format %lld.%lld and needs a "
                            "newer runtime; this one reads %d.%d: upgrade the runtime", m->name,
                            (long long)major, (long long)minor, FORMAT_MAJOR, FORMAT_MINOR);
    }
    m->fmt_major = (int)major;
    m->fmt_minor = (int)minor;
    return MLC_OK;
}

static mlc_status digest_chunk(mlc_model *m, uint64_t *chunk, mlc_error *err)
{
    const mp_node *rec = mp_get(m->header, "digest");
    *chunk = 0;
    if (!rec)
        return MLC_OK;
    const mp_node *alg = mp_get(rec, "alg"), *c = mp_get(rec, "chunk");
    if (rec->type != MP_MAP || rec->len != 2 || !mp_str_eq(alg, "sha256-tree") || !mp_is_int(c)
        || c->v.i < MIN_CHUNK || c->v.i > MAX_CHUNK || (c->v.i & (c->v.i - 1)))
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s: header has an invalid digest record "
                        "(expected alg 'sha256-tree' and a power-of-two chunk of %u to %u "
                        "bytes); export it again", m->name, MIN_CHUNK, MAX_CHUNK);
    *chunk = (uint64_t)c->v.i;
    return MLC_OK;
}

/* The content digest (runtime/bundle.content_digest) with `head` in place of the file's bytes
 * before "sha256". */
void mlc_content_digest(const mlc_model *m, const uint8_t *head, uint64_t chunk, uint8_t out[32])
{
    mlc_sha256 s;
    mlc_sha256_init(&s);
    mlc_sha256_update(&s, head, m->header_end);
    const uint8_t *area = m->data + m->data_start;
    if (!chunk) {
        mlc_sha256_update(&s, area, m->data_size);
    } else {
        for (uint64_t at = 0; at < m->data_size; at += chunk) {
            uint8_t leaf[32];
            uint64_t len = m->data_size - at < chunk ? m->data_size - at : chunk;
            mlc_sha256 one;
            mlc_sha256_start(&one, s.accel);
            mlc_sha256_update(&one, area + at, (size_t)len);
            mlc_sha256_final(&one, leaf);
            mlc_sha256_update(&s, leaf, 32);
        }
    }
    mlc_sha256_final(&s, out);
}

mlc_status mlc_read_file_layout(mlc_model *m, int verify, mlc_error *err)
{
    const uint8_t *d = m->data;
    size_t size = m->size;
    if (size < sizeof MAGIC + TRAILER_BYTES)
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s is too small to be an mlcpack bundle (%zu "
                        "bytes)", m->name, size);
    if (memcmp(d, MAGIC, sizeof MAGIC))
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s is not an mlcpack bundle (bad magic); export "
                        "one with `mlcpack export`", m->name);
    size_t limit = size < MAX_HEADER_BYTES ? size : MAX_HEADER_BYTES;
    size_t used = 0;
    mlc_error perr;
    if (mp_parse(d + sizeof MAGIC, limit - sizeof MAGIC, &m->alloc, &m->header, &used, &perr)) {
        if (perr.status == MLC_ERR_INTERNAL)
            return mlc_fail(err, perr.status, "%s", perr.message);
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s: %s", m->name, perr.message);
    }
    if (m->header->type != MP_MAP)
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s: header is not a map", m->name);
    m->header_end = sizeof MAGIC + used;
    mlc_status s = check_version(m, err);
    if (s)
        return s;
    const uint8_t *t = d + m->header_end;
    if (size - m->header_end < TRAILER_BYTES || memcmp(t, DIGEST_KEY, sizeof DIGEST_KEY)
        || memcmp(t + sizeof DIGEST_KEY + 32, DATA_KEY, sizeof DATA_KEY))
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s is truncated or damaged after its header; "
                        "export it again", m->name);
    const uint8_t *stored = t + sizeof DIGEST_KEY;
    const uint8_t *len = t + TRAILER_BYTES - 4;
    uint64_t data_size = (uint64_t)len[0] << 24 | (uint64_t)len[1] << 16 | (uint64_t)len[2] << 8
                         | len[3];
    size_t data_start = m->header_end + TRAILER_BYTES;
    const mp_node *area = mp_get(m->header, "payload");
    if (area) {
        const mp_node *off = mp_get(area, "offset"), *sz = mp_get(area, "size");
        if (area->type != MP_MAP || area->len != 2 || !mp_is_int(off) || !mp_is_int(sz)
            || off->v.i < 0 || sz->v.i < 0 || data_size != 0 || (uint64_t)off->v.i != data_start)
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s: header has an invalid payload area "
                            "record; export it again", m->name);
        data_size = (uint64_t)sz->v.i;
    }
    if (data_size > size - data_start)
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s is truncated or has trailing bytes (payload "
                        "area says %llu bytes, file has %zu); export it again", m->name,
                        (unsigned long long)data_size, size - data_start);
    if (data_start + data_size != size)
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s is truncated or has trailing bytes (payload "
                        "area says %llu bytes, file has %zu); export it again", m->name,
                        (unsigned long long)data_size, size - data_start);
    if (data_start % ALIGN)
        return mlc_fail(err, MLC_ERR_BUNDLE, "%s: payload area is not aligned", m->name);
    m->data_start = data_start;
    m->data_size = (size_t)data_size;
    uint64_t chunk;
    s = digest_chunk(m, &chunk, err);
    if (s)
        return s;
    if (verify) {
        uint8_t got[32];
        mlc_content_digest(m, d, chunk, got);
        if (memcmp(got, stored, 32))
            return mlc_fail(err, MLC_ERR_BUNDLE, "%s failed its content check (SHA-256 "
                            "mismatch): the file is corrupted; copy or export it again", m->name);
    }
    return MLC_OK;
}

/* ---- the signature (runtime/signing.py) ---- */

mlc_status mlc_check_signature(mlc_model *m, const mlc_options *o, mlc_error *err)
{
    const mp_node *rec = mp_get(m->header, "signature");
    if (!rec) {
        if (o && o->require_signature)
            return mlc_fail(err, MLC_ERR_SIGNATURE, "%s is not signed, and this application "
                            "only runs bundles signed by its trusted keys: export it with --sign "
                            "KEY", m->name);
        return MLC_OK;
    }
    m->signed_bundle = 1;
    if (!o || !o->require_signature)
        return MLC_OK;
    const mp_node *alg = mp_get(rec, "alg"), *key = mp_get(rec, "key"), *sig = mp_get(rec, "sig");
    if (rec->type != MP_MAP || !mp_str_eq(alg, "ed25519") || !key || key->type != MP_BIN
        || key->len != 32 || !sig || sig->type != MP_BIN || sig->len != 64)
        return mlc_fail(err, MLC_ERR_SIGNATURE, "%s has a malformed signature record (expected "
                        "alg 'ed25519', a 32-byte key and a 64-byte sig): export it again with "
                        "--sign", m->name);
    uint8_t fp[32];
    mlc_sha256_once(key->v.p, 32, fp);
    char finger[17];
    for (int i = 0; i < 8; i++)
        snprintf(finger + 2 * i, 3, "%02x", fp[i]);
    int trusted = 0;
    for (size_t i = 0; i < o->trusted_key_count; i++)
        if (!memcmp(o->trusted_keys[i], key->v.p, 32))
            trusted = 1;
    if (!trusted)
        return mlc_fail(err, MLC_ERR_SIGNATURE, "%s is signed by key %s, which is not one of "
                        "the trusted keys: export it with a trusted key", m->name, finger);
    /* locate "sig" (fixstr, bin8 64) followed by the signature, exactly once, in the head */
    static const uint8_t field[6] = {0xa3, 's', 'i', 'g', 0xc4, 0x40};
    size_t at = SIZE_MAX, hits = 0;
    for (size_t i = 0; i + 70 <= m->header_end; i++)
        if (!memcmp(m->data + i, field, 6) && !memcmp(m->data + i + 6, sig->v.p, 64)) {
            at = i + 6;
            hits++;
        }
    if (hits != 1)
        return mlc_fail(err, MLC_ERR_SIGNATURE, "%s: the signature cannot be located in the "
                        "header; the bundle is malformed: export it again with --sign", m->name);
    uint8_t *head = malloc(m->header_end);
    if (!head)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    memcpy(head, m->data, m->header_end);
    memset(head + at, 0, 64);
    uint64_t chunk = 0;
    digest_chunk(m, &chunk, NULL);
    uint8_t msg[28 + 32];
    memcpy(msg, "mlcpack-bundle-signature-v1", 28);   /* with its NUL */
    mlc_content_digest(m, head, chunk, msg + 28);
    free(head);
    if (!mlc_ed25519_verify(sig->v.p, key->v.p, msg, sizeof msg))
        return mlc_fail(err, MLC_ERR_SIGNATURE, "%s: its signature by key %s does not verify: "
                        "the bundle was changed after signing; do not run it", m->name, finger);
    return MLC_OK;
}

