/* Small OS helpers for the daemon (osutil.h): thread names for per-thread CPU, and
 * buffers made without the GIL held (no zeroing, pages faulted in outside it). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "osutil.h"

PyObject *name_thread(PyObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s:name_thread", &name))
        return NULL;
    char shortname[16];
    strncpy(shortname, name, sizeof shortname - 1);
    shortname[sizeof shortname - 1] = 0;
    if (prctl(PR_SET_NAME, shortname, 0, 0, 0) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

PyObject *uninit_bytearray(PyObject *self, PyObject *args)
{
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n:uninit_bytearray", &n))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "uninit_bytearray: a negative size");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, n);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

PyObject *populate(PyObject *self, PyObject *args)
{
    PyObject *obj;
    Py_buffer view;
    int for_write = 0;
    if (!PyArg_ParseTuple(args, "O|p:populate", &obj, &for_write))
        return NULL;
    if (PyObject_GetBuffer(obj, &view, for_write ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0)
        return NULL;
    long page = sysconf(_SC_PAGESIZE);
    Py_BEGIN_ALLOW_THREADS
    if (view.len > 0) {
        uintptr_t start = (uintptr_t)view.buf & ~(uintptr_t)(page - 1);
        uintptr_t end = (uintptr_t)view.buf + (uintptr_t)view.len;
        if (madvise((void *)start, end - start, for_write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) != 0) {
            /* an older kernel: one access per page (a read also makes a shared mapping's page) */
            volatile const char *p = view.buf;
            unsigned char sink = 0;
            for (Py_ssize_t off = 0; off < view.len; off += page)
                sink ^= (unsigned char)p[off];
            sink ^= (unsigned char)p[view.len - 1];
            (void)sink;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}
