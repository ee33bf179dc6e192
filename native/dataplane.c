/* The write path's per-chunk work over a whole batch, with the GIL released
 * (docs/design.md, section 3, "Native batches").
 *
 * A batch is a list of buffers taken in order (the carry of the previous batch, then the
 * bytes of the FUSE WRITEs); nothing joins them. cdc_hash_batch cuts the stream with
 * FastCDC (cdc.c: the same cuts as pyfastcdc's FastCDC with the parameters of cdc_config,
 * whose tables and masks come from pyfastcdc itself) and gives each chunk's BLAKE3-256 id;
 * stage_records builds the log records of the chunks the caller picked (header, payload,
 * zero padding to 64 bytes; payload and header CRC-32 by ISA-L) in one new buffer, the
 * only copy of the bytes in user space, ready for one write to the head segment.
 *
 * Both take every buffer first (bytes, bytearray, memoryview: anything contiguous), then
 * work without the GIL, the batch split among `threads` threads (fanout.c): the gear
 * hashing by stream ranges, the ids and the records by runs of chunks of about equal bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <isa-l/crc.h>

#include "blake3/blake3.h"
#include "cdc.h"
#include "dataplane.h"
#include "fanout.h"

#define RECORD_ALIGN 64
#define HEADER_SIZE 64
#define KIND_CHUNK 1
#define MAX_PAYLOAD (1u << 24)
#define MIN_BYTES_PER_THREAD (256u << 10) /* ids and records: fewer threads for a smaller batch */

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
    } else if ((mask_s | mask_l) >> 63) {
        /* cdc.c tests a position without knowing its parity in the chunk: exact without bit 63 */
        PyErr_SetString(PyExc_ValueError, "cdc_config: the masks must leave bit 63 clear");
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
    cdc_piece *pieces;
    Py_ssize_t count;
    cdc_stream cs;
} stream;

static void stream_release(stream *s)
{
    for (Py_ssize_t i = 0; i < s->count; i++)
        PyBuffer_Release(&s->views[i]);
    PyMem_Free(s->views);
    PyMem_Free(s->pieces);
    s->views = NULL;
    s->pieces = NULL;
    s->count = 0;
}

/* Take a buffer of every item of `seq` (a list or tuple). */
static int stream_take(PyObject *seq, stream *s)
{
    memset(s, 0, sizeof *s);
    PyObject *fast = PySequence_Fast(seq, "the pieces must be a list or tuple of buffers");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    s->views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    s->pieces = PyMem_Calloc(n ? n : 1, sizeof(cdc_piece));
    if (!s->views || !s->pieces) {
        stream_release(s);
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), &s->views[i], PyBUF_SIMPLE) < 0) {
            stream_release(s);
            Py_DECREF(fast);
            return -1;
        }
        s->count = i + 1;
        s->pieces[i] = (cdc_piece){(const uint8_t *)s->views[i].buf, (uint64_t)s->views[i].len, total};
        total += (uint64_t)s->views[i].len;
    }
    Py_DECREF(fast);
    s->cs = (cdc_stream){s->pieces, (size_t)s->count, total};
    return 0;
}

/* How many threads share `bytes` of work, at most `asked` (1 for a small batch). */
static int threads_for(int asked, uint64_t bytes)
{
    uint64_t most = bytes / MIN_BYTES_PER_THREAD + 1;
    if (asked < 1)
        return 1;
    return (uint64_t)asked > most ? (int)most : asked;
}

/* The first of chunks [a, n) whose start is at or after `at` (n if none). */
static int64_t first_from(const uint64_t *starts, int64_t a, int64_t n, uint64_t at)
{
    int64_t b = n;
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        if (starts[m] < at)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

/* Chunks [first, end) of `starts` (their stream offsets, and the end at [n]) split into
 * `parts` runs of about equal bytes: the run of part `part`. */
static void chunk_run(const uint64_t *starts, int64_t n, int part, int parts, int64_t *first, int64_t *end)
{
    uint64_t total = starts[n] - starts[0];
    uint64_t lo = starts[0] + total * (uint64_t)part / (uint64_t)parts;
    uint64_t hi = starts[0] + total * (uint64_t)(part + 1) / (uint64_t)parts;
    *first = first_from(starts, 0, n, lo);
    *end = part == parts - 1 ? n : first_from(starts, *first, n, hi);
}

/* ---- cuts and ids ---- */

typedef struct {
    const cdc_stream *s;
    const uint64_t *starts; /* n + 1 stream offsets */
    int64_t n;
    uint8_t *ids;
} hash_job;

/* BLAKE3-256 of `len` stream bytes at `at`, into out. */
static void hash_span(const cdc_stream *s, uint64_t at, uint64_t len, uint8_t *out)
{
    blake3_hasher h;
    blake3_hasher_init(&h);
    size_t i = len ? cdc_piece_at(s, at) : 0;
    uint64_t off = len ? at - s->pieces[i].start : 0;
    while (len > 0) {
        uint64_t k = s->pieces[i].len - off;
        if (k > len)
            k = len;
        blake3_hasher_update(&h, s->pieces[i].data + off, k);
        len -= k;
        i++;
        off = 0;
    }
    blake3_hasher_finalize(&h, out, 32);
}

static void hash_part(void *arg, int part, int parts)
{
    const hash_job *job = arg;
    int64_t first, end;
    chunk_run(job->starts, job->n, part, parts, &first, &end);
    for (int64_t c = first; c < end; c++)
        hash_span(job->s, job->starts[c], job->starts[c + 1] - job->starts[c], job->ids + c * 32);
}


/* Stream bytes [a, b) of s as a stream of their own (offsets from a), in `tmp` (room for
 * s->count pieces). */
static cdc_stream sub_stream(const cdc_stream *s, uint64_t a, uint64_t b, cdc_piece *tmp)
{
    size_t k = 0;
    if (a < b && a < s->total) {
        for (size_t i = cdc_piece_at(s, a); i < s->count && s->pieces[i].start < b; i++) {
            const cdc_piece *p = &s->pieces[i];
            uint64_t lo = p->start > a ? p->start : a;
            uint64_t hi = p->start + p->len < b ? p->start + p->len : b;
            if (hi > lo)
                tmp[k++] = (cdc_piece){p->data + (lo - p->start), hi - lo, lo - a};
        }
    }
    return (cdc_stream){tmp, k, b > a ? b - a : 0};
}

/* cdc_cut over [a, b) of s, the lengths from lengths[*n] on; returns the bytes cut or -1. */
static int64_t cut_content(const cdc_params *cp, const cdc_stream *s, uint64_t a, uint64_t b, int final,
                           int threads, cdc_piece *tmp, uint32_t *lengths, int64_t *n)
{
    cdc_stream g = sub_stream(s, a, b, tmp);
    uint64_t used = 0;
    int64_t k = cdc_cut(cp, &g, final, threads, lengths + *n, &used);
    if (k < 0)
        return -1;
    *n += k;
    return (int64_t)used;
}

/* The cuts with fixed regions (cdc_hash_batch's `fixed`, checked by the caller); returns
 * how many lengths, or -1 when memory ran out. */
static int64_t cut_fixed(const cdc_params *cp, const cdc_stream *s, const uint64_t *fixed, size_t regions,
                         int final, int threads, cdc_piece *tmp, uint32_t *lengths, uint64_t *consumed)
{
    uint64_t pos = 0, total = s->total;
    int64_t n = 0;
    for (size_t r = 0; r < regions; r++) {
        uint64_t start = fixed[3 * r], end = fixed[3 * r + 1], step = fixed[3 * r + 2];
        if (start >= total)
            break;
        if (start > pos) { /* the bytes before the region end at its start */
            if (cut_content(cp, s, pos, start, 1, threads, tmp, lengths, &n) < 0)
                return -1;
            pos = start;
        }
        uint64_t stop = end < total ? end : total;
        while (pos + step <= stop) {
            lengths[n++] = (uint32_t)step;
            pos += step;
        }
        if (end <= total) {
            if (pos < end) {
                lengths[n++] = (uint32_t)(end - pos);
                pos = end;
            }
        } else { /* the region goes on in the next batch */
            if (final && pos < total) {
                lengths[n++] = (uint32_t)(total - pos);
                pos = total;
            }
            *consumed = pos;
            return n;
        }
    }
    if (pos < total) {
        int64_t used = cut_content(cp, s, pos, total, final, threads, tmp, lengths, &n);
        if (used < 0)
            return -1;
        pos += (uint64_t)used;
    }
    *consumed = pos;
    return n;
}

/* Check `fixed` (see the doc) and count the lengths it may add: *extra. */
static int check_fixed(const Py_buffer *fixed, uint64_t total, uint64_t *extra)
{
    if (fixed->len % 24) {
        PyErr_SetString(PyExc_ValueError, "cdc_hash_batch: fixed must be u64 triples (start, end, step)");
        return -1;
    }
    size_t regions = (size_t)fixed->len / 24;
    uint64_t prev_end = 0;
    *extra = 0;
    for (size_t r = 0; r < regions; r++) {
        uint64_t t[3];
        memcpy(t, (const char *)fixed->buf + 24 * r, sizeof t);
        if (t[0] < prev_end || t[1] < t[0] || t[2] < 1 || t[2] > MAX_PAYLOAD) {
            PyErr_Format(PyExc_ValueError, "cdc_hash_batch: fixed region %zu is out of order, reversed or has a step "
                         "outside 1..%u", r, MAX_PAYLOAD);
            return -1;
        }
        prev_end = t[1];
        uint64_t a = t[0] < total ? t[0] : total, b = t[1] < total ? t[1] : total;
        *extra += (b - a) / t[2] + 4; /* its pieces, its last, the content cut before it ends early */
    }
    return 0;
}

PyObject *cdc_hash_batch(PyObject *self, PyObject *args)
{
    Py_buffer params, fixed = {0};
    PyObject *pieces, *fixed_obj = Py_None;
    int final, with_ids = 1, threads = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*Op|piO", &params, &pieces, &final, &with_ids, &threads, &fixed_obj))
        return NULL;
    if (fixed_obj != Py_None && PyObject_GetBuffer(fixed_obj, &fixed, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&params);
        return NULL;
    }
    if (params.len != (Py_ssize_t)sizeof(cdc_params)) {
        PyBuffer_Release(&params);
        if (fixed.obj)
            PyBuffer_Release(&fixed);
        PyErr_SetString(PyExc_ValueError, "cdc_hash_batch: the parameters are not cdc_config's");
        return NULL;
    }
    if (threads < 1 || threads > FANOUT_MAX) {
        PyBuffer_Release(&params);
        if (fixed.obj)
            PyBuffer_Release(&fixed);
        PyErr_Format(PyExc_ValueError, "cdc_hash_batch: threads must be between 1 and %d", FANOUT_MAX);
        return NULL;
    }
    cdc_params local; /* a copy: the caller's buffer need not be aligned for u64 */
    memcpy(&local, params.buf, sizeof local);
    PyBuffer_Release(&params);
    stream s;
    if (stream_take(pieces, &s) < 0) {
        if (fixed.obj)
            PyBuffer_Release(&fixed);
        return NULL;
    }
    /* at most one chunk per min_size bytes, plus the last; with fixed regions, what they add */
    uint64_t cap = s.cs.total / local.min_size + 2, extra = 0;
    size_t regions = fixed.obj ? (size_t)fixed.len / 24 : 0;
    uint64_t *fixed_copy = NULL; /* aligned, and unchanged while the GIL is released */
    cdc_piece *tmp = NULL;
    uint32_t *lengths = NULL;
    uint64_t *starts = NULL;
    uint8_t *ids = NULL;
    PyObject *out = NULL;
    if (fixed.obj) {
        if (check_fixed(&fixed, s.cs.total, &extra) < 0)
            goto done;
        cap += extra;
        fixed_copy = PyMem_Malloc(regions ? regions * 24 : 1);
        tmp = PyMem_Malloc((s.cs.count ? s.cs.count : 1) * sizeof(cdc_piece));
        if (!fixed_copy || !tmp) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(fixed_copy, fixed.buf, regions * 24);
    }
    lengths = PyMem_Malloc(cap * sizeof(uint32_t));
    starts = PyMem_Malloc((cap + 1) * sizeof(uint64_t));
    ids = PyMem_Malloc(cap * 32);
    if (!lengths || !starts || !ids) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t n;
    uint64_t consumed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (fixed_copy)
        n = cut_fixed(&local, &s.cs, fixed_copy, regions, final, threads, tmp, lengths, &consumed);
    else
        n = cdc_cut(&local, &s.cs, final, threads, lengths, &consumed);
    if (n > 0 && with_ids) {
        starts[0] = 0;
        for (int64_t i = 0; i < n; i++)
            starts[i + 1] = starts[i] + lengths[i];
        hash_job job = {&s.cs, starts, n, ids};
        fanout(hash_part, &job, threads_for(threads, consumed));
    }
    Py_END_ALLOW_THREADS
    if (n < 0) {
        PyErr_NoMemory();
        goto done;
    }
    out = Py_BuildValue("(y#y#K)", (const char *)lengths, (Py_ssize_t)(n * sizeof(uint32_t)), (const char *)ids,
                        (Py_ssize_t)(with_ids ? n * 32 : 0), (unsigned long long)consumed);
done:
    PyMem_Free(lengths);
    PyMem_Free(starts);
    PyMem_Free(ids);
    PyMem_Free(fixed_copy);
    PyMem_Free(tmp);
    if (fixed.obj)
        PyBuffer_Release(&fixed);
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

typedef struct {
    const cdc_stream *s;
    const uint64_t *starts; /* n + 1 stream offsets */
    int64_t n;
    const uint8_t *ids, *pick;
    const uint64_t *dst_at; /* where each picked chunk's record goes in dst */
    uint8_t *dst;
} stage_job;

/* One record: header, payload copied from the stream, zero padding; CRC-32s by ISA-L. */
static void stage_one(const stage_job *job, int64_t i)
{
    uint64_t at = job->starts[i], len = job->starts[i + 1] - at, span = record_span(len);
    uint8_t *head = job->dst + job->dst_at[i], *payload = head + HEADER_SIZE;
    cdc_stream_copy(job->s, at, len, payload);
    memset(payload + len, 0, span - HEADER_SIZE - len);
    memset(head, 0, HEADER_SIZE);
    memcpy(head, "CWFR", 4);
    head[4] = KIND_CHUNK;
    head[5] = 0; /* raw */
    put_u32(head + 8, (uint32_t)len);
    put_u32(head + 12, (uint32_t)len);
    memcpy(head + 16, job->ids + (uint64_t)i * 32, 32);
    put_u32(head + 48, crc32_gzip_refl(0, payload, len));
    put_u32(head + 60, crc32_gzip_refl(0, head, 60));
}

static void stage_part(void *arg, int part, int parts)
{
    const stage_job *job = arg;
    int64_t first, end;
    chunk_run(job->starts, job->n, part, parts, &first, &end);
    for (int64_t i = first; i < end; i++)
        if (job->pick[i])
            stage_one(job, i);
}

PyObject *stage_records(PyObject *self, PyObject *args)
{
    PyObject *pieces;
    Py_buffer lengths_buf, ids_buf, pick_buf, into_buf;
    PyObject *into = Py_None;
    int threads = 1, have_into = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oy*y*y*|iO", &pieces, &lengths_buf, &ids_buf, &pick_buf, &threads, &into))
        return NULL;
    PyObject *out = NULL, *staged = NULL;
    stream s;
    memset(&s, 0, sizeof s);
    uint64_t *starts = NULL, *dst_at = NULL;
    Py_ssize_t n = lengths_buf.len / (Py_ssize_t)sizeof(uint32_t);
    if (lengths_buf.len % sizeof(uint32_t) || ids_buf.len != n * 32 || pick_buf.len != n) {
        PyErr_SetString(PyExc_ValueError,
                        "stage_records: lengths (u32 each), ids (32 bytes each) and picks (1 byte each) disagree");
        goto done;
    }
    if (threads < 1 || threads > FANOUT_MAX) {
        PyErr_Format(PyExc_ValueError, "stage_records: threads must be between 1 and %d", FANOUT_MAX);
        goto done;
    }
    if (stream_take(pieces, &s) < 0)
        goto done;
    starts = PyMem_Malloc((size_t)(n + 1) * sizeof(uint64_t));
    dst_at = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (!starts || !dst_at) {
        PyErr_NoMemory();
        goto done;
    }
    const uint8_t *lengths = lengths_buf.buf;
    const uint8_t *pick = pick_buf.buf;
    uint64_t size = 0, picked = 0;
    starts[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t len = get_u32(lengths + 4 * i);
        if (len > MAX_PAYLOAD) {
            PyErr_SetString(PyExc_ValueError, "stage_records: a chunk is longer than a record's payload may be");
            goto done;
        }
        starts[i + 1] = starts[i] + len;
        dst_at[i] = size;
        if (pick[i]) {
            size += record_span(len);
            picked += len;
        }
    }
    if (starts[n] > s.cs.total) {
        PyErr_SetString(PyExc_ValueError, "stage_records: the lengths add up to more than the pieces hold");
        goto done;
    }
    uint8_t *dst;
    if (into != Py_None) {
        if (PyObject_GetBuffer(into, &into_buf, PyBUF_WRITABLE) < 0)
            goto done;
        have_into = 1;
        if ((uint64_t)into_buf.len < size) {
            PyErr_Format(PyExc_ValueError, "stage_records: the buffer holds %zd bytes, the records need %llu",
                         into_buf.len, (unsigned long long)size);
            goto done;
        }
        dst = into_buf.buf;
    } else {
        staged = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (!staged)
            goto done;
        dst = (uint8_t *)PyByteArray_AS_STRING(staged);
    }
    stage_job job = {&s.cs, starts, n, ids_buf.buf, pick, dst_at, dst};
    Py_BEGIN_ALLOW_THREADS
    if (n > 0)
        fanout(stage_part, &job, threads_for(threads, picked));
    Py_END_ALLOW_THREADS
    if (have_into) {
        out = PyLong_FromUnsignedLongLong(size);
    } else {
        out = staged;
        staged = NULL;
    }
done:
    if (have_into)
        PyBuffer_Release(&into_buf);
    Py_XDECREF(staged);
    stream_release(&s);
    PyMem_Free(starts);
    PyMem_Free(dst_at);
    PyBuffer_Release(&lengths_buf);
    PyBuffer_Release(&ids_buf);
    PyBuffer_Release(&pick_buf);
    return out;
}
