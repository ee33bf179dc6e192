/* Codec 4, "fdelta": a float tensor piece stored as its difference from the same piece of the
 * next newer checkpoint, each element's difference coded by a context model and rANS.
 * docs/format.md, section 3.2.1, has the payload byte by byte; docs/design.md (section 15,
 * "The float delta") why this model and what it gains.
 *
 * Per element i (x the piece's integer image, y the base's, W = 8 * elem_size bits):
 *   z = zigzag((x - y) mod 2^W), s = the bit length of z (0..W), the symbol;
 *   the s-1 bits of z below its leading one go to a raw bit stream as they are;
 *   the context of s is the exponent bucket of y: a step of training moves a weight by
 *   about the same amount whatever its size, so its difference in units of the last place
 *   shrinks as its exponent grows. (The symbol of the lane's previous element was tried as
 *   context too: it gained nothing over the exponent on the Trainer series and made every
 *   decoding step wait on the one before; docs/benchmarks.md.) The encoder merges buckets
 *   where a smaller table pays (a small piece).
 * The symbols are coded by rANS (31-bit states, 16-bit words, 12-bit frequencies, four
 * states interleaved: element i uses state i % 4) with a static table per context, sent
 * in the payload. The encoder runs two passes over the whole piece; the decoder one.
 * Everything releases the GIL; malformed payloads are refused, never read out of bounds.
 *
 * This file is the Python side; the codec is fdelta_encode.c and fdelta_decode.c.
 */
#include "floatcodec.h"

#include <stdlib.h>

#include "fdelta.h"

PyObject *fdelta_encode(PyObject *self, PyObject *args)
{
    Py_buffer raw, base;
    int elem, mant, ebits, lanes = 4;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "y*y*iiin|i:fdelta_encode", &raw, &base, &elem, &mant, &ebits, &limit, &lanes))
        return NULL;
    PyObject *res = NULL;
    uint8_t *out = NULL;
    if (lanes != 4 && lanes != MAX_LANES) {
        PyErr_Format(PyExc_ValueError, "fdelta_encode: %d lanes, not 4 or %d", lanes, MAX_LANES);
        goto done;
    }
    if (elem != 2 && elem != 4) {
        PyErr_Format(PyExc_ValueError, "fdelta_encode: element size %d is not 2 or 4", elem);
        goto done;
    }
    if (ebits < 1 || ebits > 11 || mant < 0 || mant + ebits > 8 * elem) {
        PyErr_Format(PyExc_ValueError, "fdelta_encode: no exponent of %d bits at bit %d in %d bytes", ebits, mant, elem);
        goto done;
    }
    if (raw.len != base.len || raw.len % elem || raw.len / elem > 0xffffffffll) {
        PyErr_Format(PyExc_ValueError, "fdelta_encode: %zd bytes against %zd, element size %d", raw.len, base.len, elem);
        goto done;
    }
    size_t n = (size_t)(raw.len / elem);
    size_t cap = fd_encode_bound(n, elem);
    out = malloc(cap);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    fd_format f = {elem, mant, ebits, 0, 8 * elem + 1, 0};
    long long got;
    Py_BEGIN_ALLOW_THREADS
    got = fd_encode(raw.buf, base.buf, n, f, lanes, out, limit < 0 ? 0 : (size_t)limit);
    Py_END_ALLOW_THREADS
    if (got < 0)
        PyErr_NoMemory();
    else if (got == 0)
        res = Py_NewRef(Py_None);
    else
        res = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)got);
done:
    free(out);
    PyBuffer_Release(&raw);
    PyBuffer_Release(&base);
    return res;
}

PyObject *fdelta_decode(PyObject *self, PyObject *args)
{
    Py_buffer payload, base, out;
    int lanes = 4, simd = 1;
    if (!PyArg_ParseTuple(args, "y*y*w*|ip:fdelta_decode", &payload, &base, &out, &lanes, &simd))
        return NULL;
    const char *err = NULL;
    if (lanes != 4 && lanes != MAX_LANES) {
        err = "lanes not 4 or 32";
    } else if (base.len != out.len) {
        err = "base and output lengths differ";
    } else {
        Py_BEGIN_ALLOW_THREADS
        err = fd_decode(payload.buf, (size_t)payload.len, base.buf, out.buf, (size_t)out.len, lanes, simd);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&payload);
    PyBuffer_Release(&base);
    PyBuffer_Release(&out);
    if (err) {
        PyErr_Format(PyExc_ValueError, "fdelta payload: %s", err);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *fdelta_simd(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(fd_decode_simd());
}
