/* Reading and writing .npy files (format 1.0-3.0, C order, little-endian) for mlcrun. */
#ifndef MLC_NPY_H
#define MLC_NPY_H
#include "mlcrt.h"

/* Reads `path` into t (data malloc'ed, owned by the caller). Returns 0, or -1 with `why` set. */
int npy_read(const char *path, mlc_tensor *t, char *why, size_t why_size);
/* Writes t to `path` through a temporary file and a rename (nothing half-written). */
int npy_write(const char *path, const mlc_tensor *t, char *why, size_t why_size);
#endif
