#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npy.h"

static const struct { const char *descr; mlc_dtype dtype; } DESCRS[] = {
    {"<f4", MLC_FLOAT32}, {"<f8", MLC_FLOAT64}, {"<f2", MLC_FLOAT16}, {"|i1", MLC_INT8},
    {"<i2", MLC_INT16}, {"<i4", MLC_INT32}, {"<i8", MLC_INT64}, {"|u1", MLC_UINT8},
    {"<u2", MLC_UINT16}, {"<u4", MLC_UINT32}, {"<u8", MLC_UINT64}, {"|b1", MLC_BOOL},
    {"i1", MLC_INT8}, {"u1", MLC_UINT8}, {"b1", MLC_BOOL}, {"|i1", MLC_INT8}};

static int fail(char *why, size_t size, const char *path, const char *what)
{
    snprintf(why, size, "%s: %s", path, what);
    return -1;
}

int npy_read(const char *path, mlc_tensor *t, char *why, size_t why_size)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(why, why_size, path, errno == ENOENT ? "no such file" : strerror(errno));
    unsigned char head[12];
    if (fread(head, 1, 10, f) != 10 || memcmp(head, "\x93NUMPY", 6)) {
        fclose(f);
        return fail(why, why_size, path, "not a .npy file (bad magic)");
    }
    size_t hlen = head[8] | (size_t)head[9] << 8;
    if (head[6] >= 2) {
        if (fread(head + 10, 1, 2, f) != 2) {
            fclose(f);
            return fail(why, why_size, path, "truncated .npy header");
        }
        hlen |= (size_t)head[10] << 16 | (size_t)head[11] << 24;
    }
    if (hlen > 1 << 20) {
        fclose(f);
        return fail(why, why_size, path, ".npy header is too large");
    }
    char *h = calloc(1, hlen + 1);
    if (!h || fread(h, 1, hlen, f) != hlen) {
        free(h);
        fclose(f);
        return fail(why, why_size, path, "truncated .npy header");
    }
    const char *d = strstr(h, "'descr':"), *fo = strstr(h, "'fortran_order':"),
               *sh = strstr(h, "'shape':");
    char descr[16] = "";
    if (!d || !fo || !sh || sscanf(d + 8, " '%15[^']'", descr) != 1) {
        free(h);
        fclose(f);
        return fail(why, why_size, path, "malformed .npy header");
    }
    int found = 0;
    for (size_t i = 0; i < sizeof DESCRS / sizeof DESCRS[0]; i++)
        if (!strcmp(descr, DESCRS[i].descr)) {
            t->dtype = DESCRS[i].dtype;
            found = 1;
        }
    if (!found || strncmp(fo + 16, " False", 6)) {
        char what[96];
        snprintf(what, sizeof what, found ? "Fortran-ordered arrays are not supported"
                                          : "unsupported .npy dtype %s", descr);
        free(h);
        fclose(f);
        return fail(why, why_size, path, what);
    }
    const char *p = strchr(sh, '(');
    t->ndim = 0;
    size_t count = 1;
    if (p) {
        p++;
        for (;;) {
            while (*p == ' ' || *p == ',')
                p++;
            if (*p == ')')
                break;
            char *end;
            long long v = strtoll(p, &end, 10);
            if (end == p || v < 0 || t->ndim >= MLC_MAX_DIMS) {
                free(h);
                fclose(f);
                return fail(why, why_size, path, "malformed .npy shape");
            }
            t->dims[t->ndim++] = v;
            if (v && count > SIZE_MAX / (size_t)v) {
                free(h);
                fclose(f);
                return fail(why, why_size, path, "the array is too large");
            }
            count *= (size_t)v;
            p = end;
        }
    }
    free(h);
    size_t item = mlc_dtype_size(t->dtype);
    if (count > SIZE_MAX / item) {
        fclose(f);
        return fail(why, why_size, path, "the array is too large");
    }
    t->nbytes = count * item;
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    if (!t->data || fread(t->data, 1, t->nbytes, f) != t->nbytes) {
        free(t->data);
        t->data = NULL;
        fclose(f);
        return fail(why, why_size, path, "the array data is truncated");
    }
    fclose(f);
    return 0;
}

int npy_write(const char *path, const mlc_tensor *t, char *why, size_t why_size)
{
    const char *descr = NULL;
    mlc_dtype store = t->dtype == MLC_BFLOAT16 ? MLC_UINT16
                      : t->dtype >= MLC_FLOAT8_E4M3FN ? MLC_UINT8 : t->dtype;
    for (size_t i = 0; i < 12; i++)
        if (DESCRS[i].dtype == store)
            descr = DESCRS[i].descr;
    char dims[400] = "";
    size_t len = 0;
    for (int i = 0; i < t->ndim && len < sizeof dims; i++)
        len += (size_t)snprintf(dims + len, sizeof dims - len, "%lld,%s", (long long)t->dims[i],
                                i + 1 < t->ndim ? " " : "");
    if (t->ndim > 1 && len)
        dims[len - 1] = 0;   /* (a, b) without the trailing comma; (a,) keeps it */
    char header[600];
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': "
                     "(%s), }", descr, dims);
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    memset(header + n, ' ', (size_t)pad);
    header[n + pad] = '\n';
    int hlen = n + pad + 1;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return fail(why, why_size, path, strerror(errno));
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xFF),
                             (unsigned char)(hlen >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, (size_t)hlen, f) == (size_t)hlen
             && fwrite(t->data, 1, t->nbytes, f) == t->nbytes;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return fail(why, why_size, path, "cannot be written");
    }
    return 0;
}
