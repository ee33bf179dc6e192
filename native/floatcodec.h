/* Codecs 4 and 5 ("fdelta", floatcodec.c): a float tensor piece as its difference from the
 * same piece of the newer checkpoint, context-modelled and rANS-coded with 4 or 32 states. Registered by
 * cowfs_native.c; the byte layout is docs/format.md, section 3.2.1. */
#ifndef COWFS_FLOATCODEC_H
#define COWFS_FLOATCODEC_H
#include <Python.h>

PyObject *fdelta_encode(PyObject *self, PyObject *args);
PyObject *fdelta_decode(PyObject *self, PyObject *args);
PyObject *fdelta_simd(PyObject *self, PyObject *unused);

#define FDELTA_ENCODE_DOC \
    "fdelta_encode(raw, base, elem_size, mant_bits, exp_bits, limit, lanes=4) -> bytes | None\n" \
    "The fdelta payload (without the base id) of `raw` against `base` (same length, a\n" \
    "multiple of elem_size, 2 or 4): floats whose exponent field of exp_bits bits starts\n" \
    "at bit mant_bits, with `lanes` rANS states (4: codec 4, 32: codec 5). None when it\n" \
    "would take more than `limit` bytes. GIL released."
#define FDELTA_DECODE_DOC \
    "fdelta_decode(payload, base, out, lanes=4, simd=True)\n" \
    "Decode an fdelta payload (without the base id) of `lanes` states against `base` into\n" \
    "`out` (both of the piece's raw length); simd=False: the plain C steps even where the\n" \
    "CPU has vector ones. ValueError when the payload is malformed. GIL released."
#define FDELTA_SIMD_DOC \
    "fdelta_simd() -> bool\n" \
    "Whether this CPU decodes 32-lane payloads with vector steps (AVX2)."
#endif
