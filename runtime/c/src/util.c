/* Errors and the load-time allocator. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

mlc_status mlc_fail(mlc_error *err, mlc_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        /* one line: control characters from a damaged file never break it */
        for (char *c = err->message; *c; c++)
            if ((unsigned char)*c < 0x20)
                *c = '?';
        err->status = status;
    }
    return status;
}

struct mlc_pool_block {
    mlc_pool_block *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define BLOCK_BYTES (64 * 1024)

void *mlc_zalloc(mlc_alloc *a, size_t size)
{
    if (size > SIZE_MAX / 2)
        return NULL;
    size = (size + 15) & ~(size_t)15;
    mlc_pool_block *b = a->head;
    if (!b || b->size - b->used < size) {
        size_t cap = size > BLOCK_BYTES / 4 ? size : BLOCK_BYTES;
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->size = cap;
        b->used = 0;
        if (cap == size && a->head) {   /* a large one: keep the current block for small ones */
            b->next = a->head->next;
            a->head->next = b;
        } else {
            b->next = a->head;
            a->head = b;
        }
    }
    void *p = b->data + b->used;
    b->used += size;
    memset(p, 0, size);
    return p;
}

void mlc_alloc_free(mlc_alloc *a)
{
    mlc_pool_block *b = a->head;
    while (b) {
        mlc_pool_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}
