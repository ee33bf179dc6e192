/* cowfs._native: small Linux/x86-64 helpers for durable checkpoint storage.
 *
 * Plain CPython C API. Cache-line write-back instructions are used through
 * per-function target attributes, so this compiles on any x86-64 gcc/clang
 * without -m flags and picks the best instruction at run time via cpuid.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/falloc.h>
#include <isa-l/crc.h>

#include "blake3_batch.h"
#include "dataplane.h"
#include "floatcodec.h"
#include "osutil.h"

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

enum flush_kind { FLUSH_CLFLUSH, FLUSH_CLFLUSHOPT, FLUSH_CLWB };

static enum flush_kind best_flush = FLUSH_CLFLUSH;
static uintptr_t line_size = 64;

static void detect_cpu(void)
{
    unsigned int a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        unsigned int sz = ((b >> 8) & 0xff) * 8; /* CLFLUSH line size */
        if (sz >= 32 && (sz & (sz - 1)) == 0)
            line_size = sz;
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        if (b & (1u << 24))
            best_flush = FLUSH_CLWB;
        else if (b & (1u << 23))
            best_flush = FLUSH_CLFLUSHOPT;
    }
}

__attribute__((target("clwb")))
static void flush_clwb(char *p, char *end)
{
    for (; p < end; p += line_size)
        _mm_clwb(p);
}

__attribute__((target("clflushopt")))
static void flush_clflushopt(char *p, char *end)
{
    for (; p < end; p += line_size)
        _mm_clflushopt(p);
}

static void flush_clflush(char *p, char *end)
{
    for (; p < end; p += line_size)
        _mm_clflush(p);
}

static void flush_range(char *start, Py_ssize_t length)
{
    char *p = (char *)((uintptr_t)start & ~(line_size - 1));
    char *end = start + length;
    switch (best_flush) {
    case FLUSH_CLWB:       flush_clwb(p, end); break;
    case FLUSH_CLFLUSHOPT: flush_clflushopt(p, end); break;
    default:               flush_clflush(p, end); break;
    }
    _mm_sfence();
}

static const char *flush_name(void)
{
    static const char *names[] = {"clflush", "clflushopt", "clwb"};
    return names[best_flush];
}
#else /* !__x86_64__ */
static void detect_cpu(void) {}
static void flush_range(char *start, Py_ssize_t length)
{
    (void)start; (void)length;
    __sync_synchronize();
}
static const char *flush_name(void) { return "none"; }
#endif

PyDoc_STRVAR(cpu_flush_instruction_doc,
"cpu_flush_instruction() -> str\n\n"
"Name of the cache-line write-back instruction persist() uses on this CPU,\n"
"detected with cpuid: 'clwb', else 'clflushopt', else 'clflush'\n"
"('none' on non-x86-64 builds, which only issue a memory barrier).");

static PyObject *cpu_flush_instruction(PyObject *self, PyObject *noargs)
{
    return PyUnicode_FromString(flush_name());
}

PyDoc_STRVAR(persist_doc,
"persist(buffer, offset, length) -> None\n\n"
"Write back every CPU cache line covering buffer[offset:offset+length]\n"
"(a writable buffer such as an mmap.mmap), then sfence. Raises ValueError\n"
"if the range is not inside the buffer. The GIL is released meanwhile.");

static PyObject *persist(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t offset, length;
    Py_buffer view;

    if (!PyArg_ParseTuple(args, "Onn:persist", &obj, &offset, &length))
        return NULL;
    if (PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE) < 0)
        return NULL;
    if (offset < 0 || length < 0 || offset > view.len ||
        length > view.len - offset) {
        PyErr_Format(PyExc_ValueError,
                     "range [%zd, %zd+%zd) is outside the buffer of %zd bytes",
                     offset, offset, length, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    if (length > 0) {
        Py_BEGIN_ALLOW_THREADS
        flush_range((char *)view.buf + offset, length);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(map_sync_supported_doc,
"map_sync_supported(fd, length) -> bool\n\n"
"True if fd can be mapped with MAP_SHARED_VALIDATE|MAP_SYNC (a DAX file on\n"
"persistent memory, where persist() alone makes stores durable); False if\n"
"the kernel refuses with EOPNOTSUPP or EINVAL. Other errors raise OSError.\n"
"fd must be open read-write; length must be positive.");

static PyObject *map_sync_supported(PyObject *self, PyObject *args)
{
    int fd, err = 0;
    Py_ssize_t length;
    void *p;

    if (!PyArg_ParseTuple(args, "in:map_sync_supported", &fd, &length))
        return NULL;
    if (length <= 0) {
        PyErr_SetString(PyExc_ValueError, "length must be positive");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    p = mmap(NULL, (size_t)length, PROT_READ | PROT_WRITE,
             MAP_SHARED_VALIDATE | MAP_SYNC, fd, 0);
    if (p == MAP_FAILED)
        err = errno;
    else
        munmap(p, (size_t)length);
    Py_END_ALLOW_THREADS
    if (!err)
        Py_RETURN_TRUE;
    if (err == EOPNOTSUPP || err == EINVAL)
        Py_RETURN_FALSE;
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

PyDoc_STRVAR(punch_hole_doc,
"punch_hole(fd, offset, length) -> None\n\n"
"Deallocate [offset, offset+length) of the file with\n"
"fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE): the range reads\n"
"back as zeros and the file size is unchanged. Raises OSError on failure.");

static PyObject *punch_hole(PyObject *self, PyObject *args)
{
    int fd, rc;
    long long offset, length;

    if (!PyArg_ParseTuple(args, "iLL:punch_hole", &fd, &offset, &length))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                   (off_t)offset, (off_t)length);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(bytearray_exported_doc,
"bytearray_exported(b) -> bool\n\n"
"True while some buffer (a memoryview, or a slice of one) still refers to\n"
"the bytearray b: its bytes must not be reused yet.");

static PyObject *bytearray_exported(PyObject *self, PyObject *arg)
{
    if (!PyByteArray_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "bytearray_exported() needs a bytearray");
        return NULL;
    }
    return PyBool_FromLong(((PyByteArrayObject *)arg)->ob_exports > 0);
}

/* ---- element-wise deltas for the checkpoint codecs (cowfs/store/codecs.py) ----
 *
 * Elements are little-endian signed integers of 1, 2, 4 or 8 bytes (the bit images of
 * floats). sub_zigzag: out = zigzag(a - b), wrapping; add_unzigzag: z = b + unzigzag(z),
 * in place. zigzag(d) = (d << 1) ^ (d >> (bits - 1)) maps small differences of either sign
 * to small unsigned values. Both release the GIL; the loops are plain C that the compiler
 * vectorises. */

#define ZIGZAG_LOOPS(T, U)                                                        \
    static void sub_##T(const char *a, const char *b, char *out, Py_ssize_t n)    \
    {                                                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                                      \
            U x, y, d;                                                            \
            memcpy(&x, a + i * sizeof(U), sizeof(U));                             \
            memcpy(&y, b + i * sizeof(U), sizeof(U));                             \
            d = (U)(x - y);                                                       \
            d = (U)((U)(d << 1) ^ (U)(-(U)(d >> (8 * sizeof(U) - 1))));           \
            memcpy(out + i * sizeof(U), &d, sizeof(U));                           \
        }                                                                         \
    }                                                                             \
    static void add_##T(char *z, const char *b, Py_ssize_t n)                     \
    {                                                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                                      \
            U u, y, d;                                                            \
            memcpy(&u, z + i * sizeof(U), sizeof(U));                             \
            memcpy(&y, b + i * sizeof(U), sizeof(U));                             \
            d = (U)((U)(u >> 1) ^ (U)(-(U)(u & 1)));                              \
            d = (U)(d + y);                                                       \
            memcpy(z + i * sizeof(U), &d, sizeof(U));                             \
        }                                                                         \
    }

ZIGZAG_LOOPS(i8, uint8_t)
ZIGZAG_LOOPS(i16, uint16_t)
ZIGZAG_LOOPS(i32, uint32_t)
ZIGZAG_LOOPS(i64, uint64_t)

static int delta_args(Py_buffer *bufs, int count, int elem, const char *name)
{
    if (elem != 1 && elem != 2 && elem != 4 && elem != 8) {
        PyErr_Format(PyExc_ValueError, "%s: element size %d is not 1, 2, 4 or 8", name, elem);
        return -1;
    }
    for (int k = 1; k < count; k++)
        if (bufs[k].len != bufs[0].len) {
            PyErr_Format(PyExc_ValueError, "%s: buffers of %zd and %zd bytes", name, bufs[0].len, bufs[k].len);
            return -1;
        }
    if (bufs[0].len % elem != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a multiple of %d", name, bufs[0].len, elem);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(sub_zigzag_doc,
"sub_zigzag(a, b, out, elem_size)\n\n"
"out = zigzag(a - b) per element: signed little-endian integers of elem_size\n"
"(1, 2, 4 or 8) bytes, wrapping. a, b and out have the same length.");

static PyObject *sub_zigzag(PyObject *self, PyObject *args)
{
    Py_buffer bufs[3];
    int elem, rc;

    if (!PyArg_ParseTuple(args, "y*y*w*i:sub_zigzag", &bufs[0], &bufs[1], &bufs[2], &elem))
        return NULL;
    rc = delta_args(bufs, 3, elem, "sub_zigzag");
    if (rc == 0) {
        Py_ssize_t n = bufs[0].len / elem;
        const char *a = bufs[0].buf, *b = bufs[1].buf;
        char *out = bufs[2].buf;
        Py_BEGIN_ALLOW_THREADS
        switch (elem) {
        case 1: sub_i8(a, b, out, n); break;
        case 2: sub_i16(a, b, out, n); break;
        case 4: sub_i32(a, b, out, n); break;
        default: sub_i64(a, b, out, n); break;
        }
        Py_END_ALLOW_THREADS
    }
    for (int k = 0; k < 3; k++)
        PyBuffer_Release(&bufs[k]);
    if (rc != 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(add_unzigzag_doc,
"add_unzigzag(z, b, elem_size)\n\n"
"The inverse of sub_zigzag, in place: z = b + unzigzag(z) per element.");

static PyObject *add_unzigzag(PyObject *self, PyObject *args)
{
    Py_buffer bufs[2];
    int elem, rc;

    if (!PyArg_ParseTuple(args, "w*y*i:add_unzigzag", &bufs[0], &bufs[1], &elem))
        return NULL;
    rc = delta_args(bufs, 2, elem, "add_unzigzag");
    if (rc == 0) {
        Py_ssize_t n = bufs[0].len / elem;
        char *z = bufs[0].buf;
        const char *b = bufs[1].buf;
        Py_BEGIN_ALLOW_THREADS
        switch (elem) {
        case 1: add_i8(z, b, n); break;
        case 2: add_i16(z, b, n); break;
        case 4: add_i32(z, b, n); break;
        default: add_i64(z, b, n); break;
        }
        Py_END_ALLOW_THREADS
    }
    for (int k = 0; k < 2; k++)
        PyBuffer_Release(&bufs[k]);
    if (rc != 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- payload CRC32s (cowfs/store/records.py, reader.py, remote/) ----
 *
 * The CRC32 in each record header is zlib's (reflected IEEE 802.3, the gzip one). zlib
 * 1.2.13 computes it at 3-6 GB/s; ISA-L's crc32_gzip_refl gives the same value with
 * carry-less multiplication (PCLMULQDQ, VPCLMULQDQ on AVX-512) at ~30 GB/s on the same
 * core (docs/benchmarks-history.md, "CRC-32 by ISA-L"). Both functions release the GIL for
 * anything larger than a record header. */

#define CRC_RELEASE_GIL_FROM 4096

static uint32_t crc32_of(uint32_t crc, const unsigned char *p, uint64_t len)
{
    return crc32_gzip_refl(crc, p, len);
}

PyDoc_STRVAR(crc32_doc,
"crc32(data, value=0) -> int\n\n"
"The CRC32 of data (equal to zlib.crc32(data, value)), by ISA-L. Releases the GIL\n"
"for inputs of 4 KiB or more.");

static PyObject *crc32_py(PyObject *self, PyObject *args)
{
    Py_buffer data;
    unsigned int value = 0;
    uint32_t crc;

    if (!PyArg_ParseTuple(args, "y*|I:crc32", &data, &value))
        return NULL;
    if (data.len >= CRC_RELEASE_GIL_FROM) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc32_of(value, data.buf, (uint64_t)data.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc32_of(value, data.buf, (uint64_t)data.len);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* A window's raw payloads are checked against their records' CRC32s in one call with the
 * GIL released, so the thread that loads a window needs the GIL once for all of its chunks
 * instead of once per chunk. */

PyDoc_STRVAR(crc32_mismatch_doc,
"crc32_mismatch(buf, table) -> int\n\n"
"table packs (u64 offset, u64 length, u32 crc32, u32 0) per span of buf, native\n"
"byte order. Returns the index of the first span whose CRC32 (zlib's) is not its crc32,\n"
"or -1 when every span matches. Runs with the GIL released.");

typedef struct {
    uint64_t offset;
    uint64_t length;
    uint32_t crc;
    uint32_t zero;
} crc_span;

static PyObject *crc32_mismatch(PyObject *self, PyObject *args)
{
    Py_buffer data, table;
    Py_ssize_t bad = -1, n;
    int invalid = 0;

    if (!PyArg_ParseTuple(args, "y*y*:crc32_mismatch", &data, &table))
        return NULL;
    if (table.len % sizeof(crc_span) != 0) {
        PyErr_SetString(PyExc_ValueError, "crc32_mismatch: the table is not a whole number of 24-byte spans");
        PyBuffer_Release(&data);
        PyBuffer_Release(&table);
        return NULL;
    }
    n = table.len / (Py_ssize_t)sizeof(crc_span);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        crc_span s;
        memcpy(&s, (const char *)table.buf + i * sizeof(crc_span), sizeof s);
        if (s.offset > (uint64_t)data.len || s.length > (uint64_t)data.len - s.offset) {
            invalid = 1;
            bad = i;
            break;
        }
        if (crc32_of(0, (const unsigned char *)data.buf + s.offset, s.length) != s.crc) {
            bad = i;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&table);
    if (invalid) {
        PyErr_Format(PyExc_ValueError, "crc32_mismatch: span %zd lies outside the buffer", bad);
        return NULL;
    }
    return PyLong_FromSsize_t(bad);
}

static PyMethodDef native_methods[] = {
    {"crc32", crc32_py, METH_VARARGS, crc32_doc},
    {"crc32_mismatch", crc32_mismatch, METH_VARARGS, crc32_mismatch_doc},
    {"add_unzigzag", add_unzigzag, METH_VARARGS, add_unzigzag_doc},
    {"sub_zigzag", sub_zigzag, METH_VARARGS, sub_zigzag_doc},
    {"bytearray_exported", bytearray_exported, METH_O, bytearray_exported_doc},
    {"cpu_flush_instruction", cpu_flush_instruction, METH_NOARGS,
     cpu_flush_instruction_doc},
    {"persist", persist, METH_VARARGS, persist_doc},
    {"map_sync_supported", map_sync_supported, METH_VARARGS,
     map_sync_supported_doc},
    {"punch_hole", punch_hole, METH_VARARGS, punch_hole_doc},
    /* osutil.c */
    {"name_thread", name_thread, METH_VARARGS, NAME_THREAD_DOC},
    {"uninit_bytearray", uninit_bytearray, METH_VARARGS, UNINIT_BYTEARRAY_DOC},
    {"populate", populate, METH_VARARGS, POPULATE_DOC},
    /* blake3_batch.c */
    {"blake3_many", cowfs_blake3_many, METH_VARARGS, cowfs_blake3_many_doc},
    /* dataplane.c */
    {"cdc_config", cdc_config, METH_VARARGS, CDC_CONFIG_DOC},
    {"cdc_hash_batch", cdc_hash_batch, METH_VARARGS, CDC_HASH_BATCH_DOC},
    {"stage_records", stage_records, METH_VARARGS, STAGE_RECORDS_DOC},
    /* floatcodec.c */
    {"fdelta_encode", fdelta_encode, METH_VARARGS, FDELTA_ENCODE_DOC},
    {"fdelta_decode", fdelta_decode, METH_VARARGS, FDELTA_DECODE_DOC},
    {"fdelta_simd", fdelta_simd, METH_NOARGS, FDELTA_SIMD_DOC},
    {NULL, NULL, 0, NULL}
};

PyDoc_STRVAR(module_doc,
"Native helpers for cowfs: cache-line write-back for memory-mapped files\n"
"(persist, cpu_flush_instruction), MAP_SYNC detection for DAX files\n"
"(map_sync_supported), hole punching (punch_hole), thread names (name_thread), buffers made without the GIL\n"
"(uninit_bytearray, populate), and for the read path a\n"
"check that no view still refers to a bytearray (bytearray_exported), and the\n"
"element-wise deltas of the checkpoint codecs (sub_zigzag, add_unzigzag), and the\n"
"payload CRC32s by ISA-L (crc32) and the read-time check of a window's payloads\n"
"(crc32_mismatch), and the BLAKE3-256 chunk ids of every span of a batch in one\n"
"call (blake3_many; native/blake3_batch.c), and the write\n"
"path's batches: FastCDC cuts with ids, and staged records (native/dataplane.c), and\n"
"the context-modelled float delta codec (fdelta_encode, fdelta_decode, fdelta_simd; native/floatcodec.c).\n"
"Linux only.");

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "cowfs._native", module_doc, -1, native_methods,
    NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__native(void)
{
    detect_cpu();
    return PyModule_Create(&native_module);
}
