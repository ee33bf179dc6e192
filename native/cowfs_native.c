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

static PyMethodDef native_methods[] = {
    {"bytearray_exported", bytearray_exported, METH_O, bytearray_exported_doc},
    {"cpu_flush_instruction", cpu_flush_instruction, METH_NOARGS,
     cpu_flush_instruction_doc},
    {"persist", persist, METH_VARARGS, persist_doc},
    {"map_sync_supported", map_sync_supported, METH_VARARGS,
     map_sync_supported_doc},
    {"punch_hole", punch_hole, METH_VARARGS, punch_hole_doc},
    {NULL, NULL, 0, NULL}
};

PyDoc_STRVAR(module_doc,
"Native helpers for cowfs: cache-line write-back for memory-mapped files\n"
"(persist, cpu_flush_instruction), MAP_SYNC detection for DAX files\n"
"(map_sync_supported), hole punching (punch_hole), and for the read path a\n"
"check that no view still refers to a bytearray (bytearray_exported).\n"
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
