/* Small OS helpers (osutil.c), registered by cowfs_native.c. */
#ifndef COWFS_OSUTIL_H
#define COWFS_OSUTIL_H
#include <Python.h>

PyObject *name_thread(PyObject *self, PyObject *args);
PyObject *uninit_bytearray(PyObject *self, PyObject *args);
PyObject *populate(PyObject *self, PyObject *args);

#define NAME_THREAD_DOC \
    "name_thread(name) -> None\n" \
    "Give the calling OS thread a name (prctl PR_SET_NAME; at most 15 bytes are kept), so\n" \
    "that per-thread CPU in /proc/PID/task/*/comm says which pool used it."
#define UNINIT_BYTEARRAY_DOC \
    "uninit_bytearray(n) -> bytearray\n" \
    "A bytearray of n bytes whose contents are not set (no zeroing while the GIL is held):\n" \
    "for buffers that are filled before they are read, such as read windows."
#define POPULATE_DOC \
    "populate(buffer, write=False) -> None\n" \
    "Fault in the pages of a mapped buffer, with the GIL released (mmap.mmap's\n" \
    "MAP_POPULATE holds it): madvise(MADV_POPULATE_READ or _WRITE) where the kernel has\n" \
    "it (5.14), else one read per page. `write` needs a writable buffer."
#endif
