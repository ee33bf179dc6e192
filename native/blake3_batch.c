/* BLAKE3-256 digests for cowfs._native: every span of a batch in one call (blake3_many),
 * hashed by the vendored upstream C library (native/blake3/, SIMD picked at run time) with
 * the GIL released. Each digest is the blake3 package's blake3(span).digest(), the chunk
 * id; for one buffer the project calls that package (chunking.chunk_id). */
#include "blake3_batch.h"

#include <stdint.h>
#include <string.h>

#include "blake3.h"

#define DIGEST_LEN BLAKE3_OUT_LEN /* 32 */

/* Below this many bytes the hashing takes less than releasing the GIL would. */
#define BLAKE3_RELEASE_GIL_FROM 4096

static void hash_span(const uint8_t *p, size_t len, uint8_t *out)
{
    blake3_hasher h;
    blake3_hasher_init(&h);
    blake3_hasher_update(&h, p, len);
    blake3_hasher_finalize(&h, out, DIGEST_LEN);
}

/* lengths as a buffer: one-dimensional, C-contiguous, items of 4-byte unsigned integers
 * in native byte order (array('I'), numpy uint32, memoryview.cast('I')). */
static int uint32_format(const Py_buffer *lv)
{
    const char *f = lv->format ? lv->format : "B";
    if (*f == '@' || *f == '=' || *f == (PY_LITTLE_ENDIAN ? '<' : '>') || (*f == '!' && !PY_LITTLE_ENDIAN))
        f++;
    return lv->itemsize == 4 && (f[0] == 'I' || f[0] == 'L') && f[1] == '\0';
}

/* The span lengths into a fresh array of *n sizes (PyMem_Free it), checked against the
 * buffer's size. Copied before the GIL is released, so a lengths object changed by
 * another thread meanwhile cannot move a span outside the buffer. NULL with an exception
 * set on error. */
static size_t *read_lengths(PyObject *lengths, Py_ssize_t buf_len, Py_ssize_t *n, Py_ssize_t *total)
{
    size_t *out = NULL;
    Py_ssize_t count, sum = 0;

    if (PyObject_CheckBuffer(lengths)) {
        Py_buffer lv;
        if (PyObject_GetBuffer(lengths, &lv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            return NULL;
        if (lv.ndim != 1 || !uint32_format(&lv)) {
            PyErr_Format(PyExc_TypeError,
                         "blake3_many: a lengths buffer must be a one-dimensional array of "
                         "uint32 (format 'I'), not format '%s' with %zd-byte items in %d dimensions; "
                         "or pass a sequence of ints",
                         lv.format ? lv.format : "B", lv.itemsize, lv.ndim);
            PyBuffer_Release(&lv);
            return NULL;
        }
        count = lv.len / 4;
        out = PyMem_Malloc((count ? count : 1) * sizeof *out);
        if (out == NULL) {
            PyBuffer_Release(&lv);
            PyErr_NoMemory();
            return NULL;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            uint32_t v;
            memcpy(&v, (const char *)lv.buf + 4 * i, 4);
            out[i] = v;
        }
        PyBuffer_Release(&lv);
    } else {
        PyObject *seq = PySequence_Fast(lengths, "blake3_many: lengths must be a sequence of ints "
                                                 "or a buffer of uint32");
        if (seq == NULL)
            return NULL;
        count = PySequence_Fast_GET_SIZE(seq);
        out = PyMem_Malloc((count ? count : 1) * sizeof *out);
        if (out == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return NULL;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_ssize_t v = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i), PyExc_OverflowError);
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                PyMem_Free(out);
                return NULL;
            }
            if (v < 0) {
                PyErr_Format(PyExc_ValueError, "blake3_many: lengths[%zd] is negative (%zd)", i, v);
                Py_DECREF(seq);
                PyMem_Free(out);
                return NULL;
            }
            out[i] = (size_t)v;
        }
        Py_DECREF(seq);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (out[i] > (size_t)(buf_len - sum)) {
            PyErr_Format(PyExc_ValueError,
                         "blake3_many: the lengths add up to more than the buffer's %zd bytes "
                         "(lengths[%zd] = %zu starts at byte %zd)",
                         buf_len, i, out[i], sum);
            PyMem_Free(out);
            return NULL;
        }
        sum += (Py_ssize_t)out[i];
    }
    if (count > PY_SSIZE_T_MAX / DIGEST_LEN) {
        PyMem_Free(out);
        PyErr_NoMemory();
        return NULL;
    }
    *n = count;
    *total = sum;
    return out;
}

const char cowfs_blake3_many_doc[] =
"blake3_many(buffer, lengths) -> bytes\n\n"
"Splits buffer (any C-contiguous buffer) into consecutive spans of the given lengths,\n"
"from its start, and returns the 32-byte BLAKE3 digests of the spans, concatenated\n"
"(32 * len(lengths) bytes). lengths: a sequence of non-negative ints, or a buffer of\n"
"uint32 such as array('I'); zero-length spans are allowed, and their sum may be less\n"
"than len(buffer) (the rest is not hashed), never more (ValueError). Hashes with the\n"
"GIL released.";

PyObject *cowfs_blake3_many(PyObject *self, PyObject *args)
{
    PyObject *data, *lengths;
    Py_buffer view;
    Py_ssize_t n = 0, total = 0;
    size_t *lens;
    PyObject *result;

    if (!PyArg_ParseTuple(args, "OO:blake3_many", &data, &lengths))
        return NULL;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    lens = read_lengths(lengths, view.len, &n, &total);
    if (lens == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    result = PyBytes_FromStringAndSize(NULL, n * DIGEST_LEN);
    if (result != NULL) {
        /* result is not visible to any other thread yet: filling it without the GIL is safe */
        const uint8_t *p = view.buf;
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
        PyThreadState *ts = total >= BLAKE3_RELEASE_GIL_FROM ? PyEval_SaveThread() : NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            hash_span(p, lens[i], out + i * DIGEST_LEN);
            p += lens[i];
        }
        if (ts != NULL)
            PyEval_RestoreThread(ts);
    }
    PyMem_Free(lens);
    PyBuffer_Release(&view);
    return result;
}
