/* Unit drivers for the pytest suite (tests/test_c_runtime.py): the internal SHA-256 and msgpack
 * reader on a file's bytes, so Python checks them against hashlib and msgpack, and fuzzes the
 * reader under the sanitizers.
 *   test_units sha256 FILE        prints the hex digest (the SHA extensions where the CPU has
 *                                 them), then "accel" or "c"
 *   test_units sha256c FILE       the same with the portable C code
 *   test_units msgpack FILE       prints "ok <bytes used> <type>" or "error <status> <message>"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = malloc(size > 0 ? (size_t)size : 1);
    *n = data ? fread(data, 1, (size_t)(size > 0 ? size : 0), f) : 0;
    fclose(f);
    return data;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    size_t n;
    unsigned char *data = slurp(argv[2], &n);
    if (!data)
        return 2;
    int rc = 0;
    if (!strcmp(argv[1], "sha256") || !strcmp(argv[1], "sha256c")) {
        uint8_t out[32];
        mlc_sha256 s;
        mlc_sha256_start(&s, !strcmp(argv[1], "sha256") && mlc_sha256_accelerated());
        /* uneven pieces exercise the buffering */
        size_t at = 0, step = 1;
        while (at < n) {
            size_t take = n - at < step ? n - at : step;
            mlc_sha256_update(&s, data + at, take);
            at += take;
            step = step * 3 + 1;
        }
        mlc_sha256_final(&s, out);
        for (int i = 0; i < 32; i++)
            printf("%02x", out[i]);
        printf(" %s\n", s.accel ? "accel" : "c");
    } else if (!strcmp(argv[1], "msgpack")) {
        mlc_alloc a = {0};
        mp_node *root;
        size_t used;
        mlc_error err;
        if (mp_parse(data, n, &a, &root, &used, &err) == MLC_OK)
            printf("ok %zu %d\n", used, root->type);
        else
            printf("error %d %s\n", err.status, err.message);
        mlc_alloc_free(&a);
    } else {
        rc = 2;
    }
    free(data);
    return rc;
}
