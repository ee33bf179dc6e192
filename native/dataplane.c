/* The write path's per-chunk work over a whole batch, with the GIL released
 * (docs/design.md, section 3, "Native batches").
 *
 * A batch is a list of buffers taken in order (the carry of the previous batch, then the
 * bytes of the FUSE WRITEs); nothing joins them. cdc_hash_batch cuts the stream with
 * FastCDC (the same cuts as pyfastcdc's FastCDC with the parameters of cdc_config: the
 * tables and masks come from pyfastcdc itself) and gives each chunk's BLAKE3-256 id;
 * stage_records builds the log records of the chunks the caller picked (header, payload,
 * zero padding to 64 bytes; payload and header CRC-32 by ISA-L) in one new buffer, the
 * only copy of the bytes in user space, ready for one write to the head segment.
 *
 * Both take every buffer first (bytes, bytearray, memoryview: anything contiguous), then
 * work without the GIL, so the daemon's workers hash and stage on all the cores.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <isa-l/crc.h>

#include "blake3/blake3.h"
#include "dataplane.h"

#define RECORD_ALIGN 64
#define HEADER_SIZE 64
#define KIND_CHUNK 1
#define MAX_PAYLOAD (1u << 24)

/* ---- the FastCDC parameters, packed into a bytes object ---- */

typedef struct {
    uint64_t min_size, avg_size, max_size;
    uint64_t mask_s, mask_l, mask_s_ls, mask_l_ls;
    uint64_t gear[256], gear_ls[256];
} cdc_params;

PyObject *cdc_config(PyObject *self, PyObject *args)
{
    Py_buffer gear, gear_ls;
    unsigned long long mask_s, mask_l, min_size, avg_size, max_size;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*KKKKK", &gear, &gear_ls, &mask_s, &mask_l, &min_size, &avg_size,
                          &max_size))
        return NULL;
    PyObject *out = NULL;
    if (gear.len != 256 * 8 || gear_ls.len != 256 * 8) {
        PyErr_SetString(PyExc_ValueError, "cdc_config: each gear table must be 256 u64 (2048 bytes)");
    } else if (!(64 <= min_size && min_size <= avg_size && avg_size <= max_size && max_size <= MAX_PAYLOAD)) {
        PyErr_SetString(PyExc_ValueError, "cdc_config: sizes must satisfy 64 <= min <= avg <= max <= 16 MiB");
    } else {
        out = PyBytes_FromStringAndSize(NULL, sizeof(cdc_params));
        if (out) {
            cdc_params *p = (cdc_params *)PyBytes_AS_STRING(out);
            memset(p, 0, sizeof(*p));
            p->min_size = min_size;
            p->avg_size = avg_size;
            p->max_size = max_size;
            p->mask_s = mask_s;
            p->mask_l = mask_l;
            p->mask_s_ls = mask_s << 1;
            p->mask_l_ls = mask_l << 1;
            memcpy(p->gear, gear.buf, sizeof(p->gear));
            memcpy(p->gear_ls, gear_ls.buf, sizeof(p->gear_ls));
        }
    }
    PyBuffer_Release(&gear);
    PyBuffer_Release(&gear_ls);
    return out;
}

/* ---- a stream of buffers ---- */

typedef struct {
    Py_buffer *views;
    Py_ssize_t count;
    uint64_t total;
} stream;

static void stream_release(stream *s)
{
    for (Py_ssize_t i = 0; i < s->count; i++)
        PyBuffer_Release(&s->views[i]);
    PyMem_Free(s->views);
    s->views = NULL;
    s->count = 0;
}

/* Take a buffer of every item of `seq` (a list or tuple). */
static int stream_take(PyObject *seq, stream *s)
{
    s->views = NULL;
    s->count = 0;
    s->total = 0;
    PyObject *fast = PySequence_Fast(seq, "the pieces must be a list or tuple of buffers");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    s->views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    if (!s->views) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &s->views[i], PyBUF_SIMPLE) < 0) {
            stream_release(s);
            Py_DECREF(fast);
            return -1;
        }
        s->count = i + 1;
        s->total += (uint64_t)s->views[i].len;
    }
    Py_DECREF(fast);
    return 0;
}

/* A position in the stream: piece index and offset in it. */
typedef struct {
    Py_ssize_t piece;
    uint64_t off;
} cursor;

/* Move `c` forward by n bytes (n within the stream). */
static void cursor_skip(const stream *s, cursor *c, uint64_t n)
{
    while (n > 0) {
        uint64_t left = (uint64_t)s->views[c->piece].len - c->off;
        if (n < left) {
            c->off += n;
            return;
        }
        n -= left;
        c->piece++;
        c->off = 0;
    }
    while (c->piece < s->count && (uint64_t)s->views[c->piece].len == c->off) {
        c->piece++;
        c->off = 0;
    }
}

/* Gear-hash bytes [rel, end) of a chunk (rel counted from the chunk's start; `p` points at
 * byte rel) with pyfastcdc's two-byte step: bytes at even rel are shifted by two and use
 * the shifted table and mask, bytes at odd rel add the plain table. Returns the cut (the
 * chunk's length) or -1, with the hash carried in *hash. */
static inline int64_t gear_scan(const cdc_params *cp, const uint8_t *p, uint64_t rel, uint64_t end, uint64_t m,
                                uint64_t m_ls, uint64_t *hash)
{
    uint64_t h = *hash;
    if (rel < end && (rel & 1)) {
        h += cp->gear[*p];
        if (!(h & m)) {
            *hash = h;
            return (int64_t)rel;
        }
        p++;
        rel++;
    }
    for (; rel + 1 < end; rel += 2, p += 2) {
        h = (h << 2) + cp->gear_ls[p[0]];
        if (!(h & m_ls)) {
            *hash = h;
            return (int64_t)rel;
        }
        h += cp->gear[p[1]];
        if (!(h & m)) {
            *hash = h;
            return (int64_t)(rel + 1);
        }
    }
    if (rel < end) {
        h = (h << 2) + cp->gear_ls[*p];
        if (!(h & m_ls)) {
            *hash = h;
            return (int64_t)rel;
        }
    }
    *hash = h;
    return -1;
}

/* The length of the chunk that starts at `at`, with `remaining` bytes left in the stream:
 * pyfastcdc's _cut_gear, over pieces. */
static uint64_t cut_one(const cdc_params *cp, const stream *s, cursor at, uint64_t remaining)
{
    if (remaining <= cp->min_size)
        return remaining;
    uint64_t center = cp->avg_size;
    if (remaining > cp->max_size)
        remaining = cp->max_size;
    else if (remaining < center)
        center = remaining;
    uint64_t start_pos = cp->min_size / 2 * 2, mid_pos = center / 2 * 2, end_pos = remaining / 2 * 2;
    uint64_t hash = 0;
    cursor c = at;
    cursor_skip(s, &c, start_pos);
    uint64_t rel = start_pos;
    while (rel < end_pos) {
        const uint8_t *p = (const uint8_t *)s->views[c.piece].buf + c.off;
        uint64_t in_piece = (uint64_t)s->views[c.piece].len - c.off;
        uint64_t stop = rel + in_piece < end_pos ? rel + in_piece : end_pos;
        uint64_t r = rel;
        int64_t cut;
        if (r < mid_pos) { /* pairs below mid_pos: the stricter masks (mid_pos is even) */
            uint64_t small_stop = stop < mid_pos ? stop : mid_pos;
            cut = gear_scan(cp, p, r, small_stop, cp->mask_s, cp->mask_s_ls, &hash);
            if (cut >= 0)
                return (uint64_t)cut;
            p += small_stop - r;
            r = small_stop;
        }
        if (r < stop) {
            cut = gear_scan(cp, p, r, stop, cp->mask_l, cp->mask_l_ls, &hash);
            if (cut >= 0)
                return (uint64_t)cut;
        }
        cursor_skip(s, &c, stop - rel);
        rel = stop;
    }
    return remaining;
}

/* BLAKE3 of `len` bytes at `at`, across pieces. */
static void hash_span(const stream *s, cursor at, uint64_t len, uint8_t out[32])
{
    blake3_hasher h;
    blake3_hasher_init(&h);
    while (len > 0) {
        uint64_t in_piece = (uint64_t)s->views[at.piece].len - at.off;
        uint64_t n = len < in_piece ? len : in_piece;
        blake3_hasher_update(&h, (const uint8_t *)s->views[at.piece].buf + at.off, n);
        len -= n;
        at.piece++;
        at.off = 0;
    }
    blake3_hasher_finalize(&h, out, 32);
}

PyObject *cdc_hash_batch(PyObject *self, PyObject *args)
{
    Py_buffer params;
    PyObject *pieces;
    int final, with_ids = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Op|p", &params, &pieces, &final, &with_ids))
        return NULL;
    if (params.len != (Py_ssize_t)sizeof(cdc_params)) {
        PyBuffer_Release(&params);
        PyErr_SetString(PyExc_ValueError, "cdc_hash_batch: the parameters are not cdc_config's");
        return NULL;
    }
    cdc_params local; /* a copy: the caller's buffer need not be aligned for u64 */
    memcpy(&local, params.buf, sizeof local);
    PyBuffer_Release(&params);
    const cdc_params *cp = &local;
    stream s;
    if (stream_take(pieces, &s) < 0)
        return NULL;
    /* at most one chunk per min_size bytes, plus the last */
    uint64_t cap = s.total / cp->min_size + 2;
    uint32_t *lengths = PyMem_Malloc(cap * sizeof(uint32_t));
    uint8_t *ids = PyMem_Malloc(cap * 32);
    PyObject *out = NULL;
    if (!lengths || !ids) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t n = 0, consumed = 0;
    Py_BEGIN_ALLOW_THREADS
    cursor c = {0, 0};
    cursor_skip(&s, &c, 0);
    uint64_t pos = 0;
    while (pos < s.total) {
        uint64_t len = cut_one(cp, &s, c, s.total - pos);
        if (!final && pos + len == s.total)
            break; /* the last chunk is not certain: the caller carries it */
        if (with_ids)
            hash_span(&s, c, len, ids + n * 32);
        lengths[n++] = (uint32_t)len;
        pos += len;
        cursor_skip(&s, &c, len);
    }
    consumed = pos;
    Py_END_ALLOW_THREADS
    out = Py_BuildValue("(y#y#K)", (const char *)lengths, (Py_ssize_t)(n * sizeof(uint32_t)), (const char *)ids,
                        (Py_ssize_t)(with_ids ? n * 32 : 0), (unsigned long long)consumed);
done:
    PyMem_Free(lengths);
    PyMem_Free(ids);
    stream_release(&s);
    return out;
}

static uint32_t get_u32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v); /* the lengths buffer need not be aligned */
    return v;
}

static uint64_t record_span(uint64_t stored)
{
    return (HEADER_SIZE + stored + RECORD_ALIGN - 1) / RECORD_ALIGN * RECORD_ALIGN;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

PyObject *stage_records(PyObject *self, PyObject *args)
{
    PyObject *pieces;
    Py_buffer lengths_buf, ids_buf, pick_buf;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy*y*y*", &pieces, &lengths_buf, &ids_buf, &pick_buf))
        return NULL;
    PyObject *out = NULL, *staged = NULL;
    stream s = {NULL, 0, 0};
    Py_ssize_t n = lengths_buf.len / (Py_ssize_t)sizeof(uint32_t);
    if (lengths_buf.len % sizeof(uint32_t) || ids_buf.len != n * 32 || pick_buf.len != n) {
        PyErr_SetString(PyExc_ValueError,
                        "stage_records: lengths (u32 each), ids (32 bytes each) and picks (1 byte each) disagree");
        goto done;
    }
    if (stream_take(pieces, &s) < 0)
        goto done;
    const uint8_t *lengths = lengths_buf.buf;
    const uint8_t *pick = pick_buf.buf;
    uint64_t sum = 0, size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (get_u32(lengths + 4 * i) > MAX_PAYLOAD) {
            PyErr_SetString(PyExc_ValueError, "stage_records: a chunk is longer than a record's payload may be");
            goto done;
        }
        sum += get_u32(lengths + 4 * i);
        if (pick[i])
            size += record_span(get_u32(lengths + 4 * i));
    }
    if (sum > s.total) {
        PyErr_SetString(PyExc_ValueError, "stage_records: the lengths add up to more than the pieces hold");
        goto done;
    }
    staged = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!staged)
        goto done;
    uint8_t *dst = (uint8_t *)PyByteArray_AS_STRING(staged);
    const uint8_t *ids = ids_buf.buf;
    Py_BEGIN_ALLOW_THREADS
    cursor c = {0, 0};
    cursor_skip(&s, &c, 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t len = get_u32(lengths + 4 * i);
        if (pick[i]) {
            uint8_t *head = dst, *payload = dst + HEADER_SIZE;
            uint64_t left = len;
            cursor at = c;
            uint8_t *w = payload;
            while (left > 0) {
                uint64_t in_piece = (uint64_t)s.views[at.piece].len - at.off;
                uint64_t k = left < in_piece ? left : in_piece;
                memcpy(w, (const uint8_t *)s.views[at.piece].buf + at.off, k);
                w += k;
                left -= k;
                at.piece++;
                at.off = 0;
            }
            uint64_t span = record_span(len);
            memset(payload + len, 0, span - HEADER_SIZE - len);
            memset(head, 0, HEADER_SIZE);
            memcpy(head, "CWFR", 4);
            head[4] = KIND_CHUNK;
            head[5] = 0; /* raw */
            put_u32(head + 8, len);
            put_u32(head + 12, len);
            memcpy(head + 16, ids + (uint64_t)i * 32, 32);
            put_u32(head + 48, crc32_gzip_refl(0, payload, len));
            put_u32(head + 60, crc32_gzip_refl(0, head, 60));
            dst += span;
        }
        cursor_skip(&s, &c, len);
    }
    Py_END_ALLOW_THREADS
    out = staged;
    staged = NULL;
done:
    Py_XDECREF(staged);
    stream_release(&s);
    PyBuffer_Release(&lengths_buf);
    PyBuffer_Release(&ids_buf);
    PyBuffer_Release(&pick_buf);
    return out;
}
