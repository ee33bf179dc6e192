/* BLAKE3-256 chunk ids for cowfs._native (blake3_batch.c), by the vendored upstream C
 * library in native/blake3/. cowfs_native.c lists these in its method table. */
#ifndef COWFS_BLAKE3_BATCH_H
#define COWFS_BLAKE3_BATCH_H

#ifndef PY_SSIZE_T_CLEAN
#define PY_SSIZE_T_CLEAN
#endif
#include <Python.h>

extern const char cowfs_blake3_many_doc[];

/* blake3_many(buffer, lengths) -> bytes: METH_VARARGS */
PyObject *cowfs_blake3_many(PyObject *self, PyObject *args);

#endif
