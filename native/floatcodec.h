/* Codec 4 ("fdelta", floatcodec.c): a float tensor piece as its difference from the same
 * piece of the newer checkpoint, context-modelled and rANS-coded. Registered by
 * cowfs_native.c; the byte layout is docs/format.md, section 3.2.1. */
#ifndef COWFS_FLOATCODEC_H
#define COWFS_FLOATCODEC_H
#include <Python.h>

PyObject *fdelta_encode(PyObject *self, PyObject *args);
PyObject *fdelta_decode(PyObject *self, PyObject *args);

#define FDELTA_ENCODE_DOC \
    "fdelta_encode(raw, base, elem_size, mant_bits, exp_bits, limit) -> bytes | None\n" \
    "The fdelta payload (without the base id) of `raw` against `base` (same length, a\n" \
    "multiple of elem_size, 2 or 4): floats whose exponent field of exp_bits bits starts\n" \
    "at bit mant_bits. None when it would take more than `limit` bytes. GIL released."
#define FDELTA_DECODE_DOC \
    "fdelta_decode(payload, base, out)\n" \
    "Decode an fdelta payload (without the base id) against `base` into `out` (both of the\n" \
    "piece's raw length). ValueError when the payload is malformed. GIL released."
#endif
