/* The write path's batch functions (dataplane.c), registered by cowfs_native.c. */
#ifndef COWFS_DATAPLANE_H
#define COWFS_DATAPLANE_H
#include <Python.h>

PyObject *cdc_config(PyObject *self, PyObject *args);
PyObject *cdc_hash_batch(PyObject *self, PyObject *args);
PyObject *stage_records(PyObject *self, PyObject *args);

#define CDC_CONFIG_DOC \
    "cdc_config(gear, gear_ls, mask_s, mask_l, min_size, avg_size, max_size) -> bytes\n" \
    "FastCDC parameters for cdc_hash_batch: pyfastcdc's tables (256 u64 each) and masks."
#define CDC_HASH_BATCH_DOC \
    "cdc_hash_batch(params, pieces, final, with_ids=True, threads=1, fixed=None)\n" \
    "    -> (lengths, ids, consumed)\n" \
    "Cut the buffers in `pieces`, taken in order as one stream, into FastCDC chunks and\n" \
    "BLAKE3-256 each: lengths as u32 (native order), ids as 32 bytes each, and the bytes\n" \
    "they cover (ids empty without `with_ids`: the cuts alone). Without `final` the last\n" \
    "chunk is left out (the caller carries it). threads > 1: the gear hashing and the ids\n" \
    "spread over that many threads (the same cuts, a third more hashing in all).\n" \
    "fixed: u64 triples (start, end, step), stream offsets, sorted, not overlapping, step\n" \
    "1 to 2^24: regions cut at start, start + k * step and end, the bytes before each cut by\n" \
    "content up to its start; a region past the stream's end is cut up to the last step\n" \
    "boundary in it (to the end with `final`). GIL released."
#define STAGE_RECORDS_DOC \
    "stage_records(pieces, lengths, ids, picks, threads=1, into=None) -> bytearray | int\n" \
    "The raw chunk records (header, payload, zero padding to 64 bytes; CRC-32s) of the\n" \
    "chunks whose pick byte is not 0, back to back; the chunks lie in `pieces` one after\n" \
    "another with the given lengths (u32) and ids (32 bytes each); up to `threads` threads\n" \
    "copy and checksum them. With `into` (a writable buffer) they go to its start and the\n" \
    "call returns their size. GIL released."
#endif
