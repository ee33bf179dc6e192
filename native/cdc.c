/* FastCDC cuts of a stream of pieces, on one thread or several (cdc.h; docs/design.md,
 * section 3, "Native batches"). Both ways give pyfastcdc's cuts.
 *
 * One thread runs pyfastcdc's loop: chunk after chunk, each chunk's first min_size bytes
 * skipped, then the gear hash rolled two bytes a step until a position passes the test.
 * It hashes about three quarters of the bytes, the fewest; a cut depends on the one before
 * it, so it cannot be split.
 *
 * Several threads use a property of the gear hash: it rolls a byte in as
 * h = (h << 1) + gear[byte], so after 64 bytes the first has been shifted out, and from a
 * chunk's min_size + 64th byte on the hash at a position depends only on the 64 bytes that
 * end there, not on where the chunk began (pyfastcdc's two-byte step, (h << 2) +
 * gear_ls[byte] at even positions tested against the mask shifted by one, is the same test
 * when bit 63 of the mask is clear). So the cuts are found in two passes:
 *
 *   1. mark: every position of the stream whose 64-byte window hash passes the small-chunk
 *      test (mask_s) or the large-chunk test (mask_l) gets a bit in one of two bitmaps.
 *      Positions are independent, so the stream is split among threads at 64-position
 *      borders (no bitmap word is shared). A run starts 63 bytes early to fill its window;
 *      the first 63 positions of a piece take their window from the pieces before it
 *      through a small copy.
 *   2. select, in one thread, chunk after chunk as pyfastcdc does: the first 64 positions
 *      after min_size, whose hash holds fewer than 64 bytes, are hashed exactly; after them
 *      the first marked position below the normal size (mask_s), else the first after it
 *      (mask_l), else the maximum.
 *
 * Pass 1 hashes every byte, a third more than one thread does, for a batch cut in 1/N of
 * the time: the caller asks for threads only when cores are idle.
 */
#include <stdlib.h>
#include <string.h>

#include "cdc.h"
#include "fanout.h"

#define WINDOW 64                /* bytes a settled gear hash depends on */
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

size_t cdc_piece_at(const cdc_stream *s, uint64_t at)
{
    size_t lo = 0, hi = s->count;
    while (lo < hi) { /* the first piece that ends after `at` */
        size_t mid = lo + (hi - lo) / 2;
        if (s->pieces[mid].start + s->pieces[mid].len <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void cdc_stream_copy(const cdc_stream *s, uint64_t at, uint64_t n, uint8_t *out)
{
    if (n == 0)
        return;
    size_t i = cdc_piece_at(s, at);
    uint64_t off = at - s->pieces[i].start;
    while (n > 0) {
        uint64_t k = s->pieces[i].len - off;
        if (k > n)
            k = n;
        memcpy(out, s->pieces[i].data + off, k);
        out += k;
        n -= k;
        i++;
        off = 0;
    }
}

/* ---- one thread: pyfastcdc's loop, over pieces ---- */

/* Where pyfastcdc's _cut_gear looks for a chunk's cut with `remaining` bytes left. */
typedef struct {
    uint64_t remaining;         /* the chunk's length if no position passes (at most max_size) */
    uint64_t start_pos;         /* the first position hashed: min_size, even */
    uint64_t mid_pos;           /* from here the looser mask: the normal size, even */
    uint64_t end_pos;           /* the end of the scan, even */
} chunk_bounds;

/* 0 when the chunk is all the `remaining` bytes (no more than min_size), else 1 and *b. */
static int bounds_of(const cdc_params *cp, uint64_t remaining, chunk_bounds *b)
{
    if (remaining <= cp->min_size)
        return 0;
    uint64_t center = cp->avg_size;
    if (remaining > cp->max_size)
        remaining = cp->max_size;
    else if (remaining < center)
        center = remaining;
    *b = (chunk_bounds){remaining, cp->min_size / 2 * 2, center / 2 * 2, remaining / 2 * 2};
    return 1;
}

typedef struct {
    size_t piece;
    uint64_t off;
} cursor;

/* Move `c` forward by n bytes (n within the stream), past empty pieces. */
static void cursor_skip(const cdc_stream *s, cursor *c, uint64_t n)
{
    while (n > 0) {
        uint64_t left = s->pieces[c->piece].len - c->off;
        if (n < left) {
            c->off += n;
            return;
        }
        n -= left;
        c->piece++;
        c->off = 0;
    }
    while (c->piece < s->count && s->pieces[c->piece].len == c->off) {
        c->piece++;
        c->off = 0;
    }
}

/* Gear-hash bytes [rel, end) of a chunk (`p` points at byte rel) with pyfastcdc's two-byte
 * step: bytes at even rel are shifted by two and use the shifted table and mask, bytes at
 * odd rel add the plain table. Returns the cut (the chunk's length) or -1, the hash carried
 * in *hash. */
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
        if (UNLIKELY(!(h & m_ls))) {
            *hash = h;
            return (int64_t)rel;
        }
        h += cp->gear[p[1]];
        if (UNLIKELY(!(h & m))) {
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

/* The length of the chunk at `at`, `remaining` bytes left in the stream (pyfastcdc's
 * _cut_gear): each chunk's first min_size bytes are not hashed. */
static uint64_t cut_one(const cdc_params *cp, const cdc_stream *s, cursor at, uint64_t remaining)
{
    chunk_bounds b;
    if (!bounds_of(cp, remaining, &b))
        return remaining;
    remaining = b.remaining;
    uint64_t start_pos = b.start_pos, mid_pos = b.mid_pos, end_pos = b.end_pos;
    uint64_t hash = 0;
    cursor c = at;
    cursor_skip(s, &c, start_pos);
    uint64_t rel = start_pos;
    while (rel < end_pos) {
        const uint8_t *p = s->pieces[c.piece].data + c.off;
        uint64_t in_piece = s->pieces[c.piece].len - c.off;
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

static int64_t cut_sequential(const cdc_params *cp, const cdc_stream *s, int final, uint32_t *lengths,
                              uint64_t *consumed)
{
    cursor c = {0, 0};
    cursor_skip(s, &c, 0);
    int64_t n = 0;
    uint64_t pos = 0;
    while (pos < s->total) {
        uint64_t len = cut_one(cp, s, c, s->total - pos);
        if (!final && pos + len == s->total)
            break; /* the last chunk is not certain: the caller carries it */
        lengths[n++] = (uint32_t)len;
        pos += len;
        cursor_skip(s, &c, len);
    }
    *consumed = pos;
    return n;
}

/* ---- pass 1: mark ---- */

typedef struct {
    const cdc_params *cp;
    const cdc_stream *s;
    uint64_t *small, *large; /* the bitmaps: mask_s and mask_l passed */
} mark_job;

static inline void mark_hit(const mark_job *job, uint64_t h, uint64_t pos)
{
    uint64_t bit = 1ull << (pos & 63);
    if (!(h & job->cp->mask_s))
        job->small[pos >> 6] |= bit;
    if (!(h & job->cp->mask_l))
        job->large[pos >> 6] |= bit;
}

/* The hash of the (up to 63) bytes before p[a]: p[a - 63 .. a) or from p[0]. */
static inline uint64_t warm(const uint64_t *gear, const uint8_t *p, uint64_t a)
{
    uint64_t h = 0;
    for (uint64_t t = a >= WINDOW - 1 ? a - (WINDOW - 1) : 0; t < a; t++)
        h = (h << 1) + gear[p[t]];
    return h;
}

/* One mark thread's copy of what it reads for every byte (its own cache lines). */
typedef struct {
    uint64_t gear[256], gear_ls[256];
    uint64_t any, any_ls; /* mask_s & mask_l (clear wherever either test passes), and shifted */
} mark_tables;

/* Mark `pos` if hash h passes either test (h_ls: the hash shifted by one, pyfastcdc's even step). */
#define MARK_CHECK(h, pos)                                                                         \
    do {                                                                                           \
        if (UNLIKELY(!((h) & t->any)))                                                             \
            mark_hit(job, (h), (pos));                                                             \
    } while (0)
#define MARK_CHECK_LS(h_ls, pos)                                                                   \
    do {                                                                                           \
        if (UNLIKELY(!((h_ls) & t->any_ls)))                                                       \
            mark_hit(job, (h_ls) >> 1, (pos));                                                     \
    } while (0)

/* Mark positions [a, b) of buffer p, whose byte 0 is at stream offset `base`; the window of
 * each is the bytes of p before it (up to 63). Two runs at once, each rolling two bytes a
 * step as pyfastcdc does ((h << 2) + gear_ls at the first, the hash then held shifted by
 * one, tested against the shifted mask): on the cores measured a plain (h << 1) + gear
 * chain is bound by its latency, and this is about twice as fast (docs/benchmarks.md). */
static void mark_run(const mark_job *job, const mark_tables *t, const uint8_t *p, uint64_t a, uint64_t b,
                     uint64_t base)
{
    uint64_t k = a;
    if (b - a >= 256) {
        uint64_t q = (b - a) / 4 * 2; /* even: each run steps two bytes */
        const uint8_t *p0 = p + a, *p1 = p0 + q;
        uint64_t h0 = warm(t->gear, p, a), h1 = warm(t->gear, p, a + q);
        for (uint64_t i = 0; i < q; i += 2) {
            h0 = (h0 << 2) + t->gear_ls[p0[i]];
            h1 = (h1 << 2) + t->gear_ls[p1[i]];
            MARK_CHECK_LS(h0, base + a + i);
            MARK_CHECK_LS(h1, base + a + q + i);
            h0 += t->gear[p0[i + 1]];
            h1 += t->gear[p1[i + 1]];
            MARK_CHECK(h0, base + a + i + 1);
            MARK_CHECK(h1, base + a + q + i + 1);
        }
        k = a + 2 * q;
        uint64_t h = h1; /* the second run goes on to b */
        for (; k < b; k++) {
            h = (h << 1) + t->gear[p[k]];
            MARK_CHECK(h, base + k);
        }
        return;
    }
    uint64_t h = warm(t->gear, p, a);
    for (; k < b; k++) {
        h = (h << 1) + t->gear[p[k]];
        MARK_CHECK(h, base + k);
    }
}

/* Mark stream positions [lo, hi). */
static void mark_range(const mark_job *job, const mark_tables *t, uint64_t lo, uint64_t hi)
{
    const cdc_stream *s = job->s;
    if (lo >= hi)
        return;
    for (size_t i = cdc_piece_at(s, lo); i < s->count && s->pieces[i].start < hi; i++) {
        const cdc_piece *pc = &s->pieces[i];
        uint64_t st = pc->start, en = pc->start + pc->len;
        uint64_t x = lo > st ? lo : st, y = hi < en ? hi : en;
        if (x >= y)
            continue;
        /* positions within the first 63 of the piece: their windows reach into earlier pieces */
        uint64_t edge = st + WINDOW - 1 < y ? st + WINDOW - 1 : y;
        if (x < edge) {
            uint8_t tmp[2 * WINDOW];
            uint64_t from = x >= WINDOW - 1 ? x - (WINDOW - 1) : 0;
            cdc_stream_copy(s, from, edge - from, tmp);
            mark_run(job, t, tmp, x - from, edge - from, from);
            x = edge;
        }
        if (x < y)
            mark_run(job, t, pc->data, x - st, y - st, st);
    }
}

static void mark_part(void *arg, int part, int parts)
{
    const mark_job *job = arg;
    uint64_t words = (job->s->total + 63) / 64;
    uint64_t lo = words * (uint64_t)part / (uint64_t)parts * 64, hi = words * (uint64_t)(part + 1) / (uint64_t)parts * 64;
    mark_tables t;
    memcpy(t.gear, job->cp->gear, sizeof t.gear);
    memcpy(t.gear_ls, job->cp->gear_ls, sizeof t.gear_ls);
    t.any = job->cp->mask_s & job->cp->mask_l;
    t.any_ls = t.any << 1;
    mark_range(job, &t, lo, hi < job->s->total ? hi : job->s->total);
}

/* ---- pass 2: select ---- */

/* The first set bit in [from, to), or UINT64_MAX. */
static uint64_t next_mark(const uint64_t *bm, uint64_t from, uint64_t to)
{
    if (from >= to)
        return UINT64_MAX;
    uint64_t w = from >> 6, word = bm[w] & (~0ull << (from & 63));
    for (;;) {
        if (word) {
            uint64_t at = (w << 6) + (uint64_t)__builtin_ctzll(word);
            return at < to ? at : UINT64_MAX;
        }
        if (++w << 6 >= to)
            return UINT64_MAX;
        word = bm[w];
    }
}

/* The length of the chunk at stream offset `pos` (pyfastcdc's _cut_gear). */
static uint64_t select_one(const cdc_params *cp, const cdc_stream *s, const mark_job *marks, uint64_t pos)
{
    chunk_bounds b;
    if (!bounds_of(cp, s->total - pos, &b))
        return s->total - pos;
    uint64_t remaining = b.remaining, start_pos = b.start_pos, mid_pos = b.mid_pos, end_pos = b.end_pos;
    /* the first positions after start_pos, exactly: their hash has fewer than 64 bytes */
    uint64_t exact_end = start_pos + WINDOW < end_pos ? start_pos + WINDOW : end_pos;
    if (start_pos < exact_end) {
        uint8_t buf[WINDOW];
        cdc_stream_copy(s, pos + start_pos, exact_end - start_pos, buf);
        uint64_t h = 0;
        for (uint64_t r = start_pos; r < exact_end; r++) {
            h = (h << 1) + cp->gear[buf[r - start_pos]];
            if (!(h & (r < mid_pos ? cp->mask_s : cp->mask_l)))
                return r;
        }
    }
    uint64_t from = exact_end;
    if (from < mid_pos) {
        uint64_t at = next_mark(marks->small, pos + from, pos + mid_pos);
        if (at != UINT64_MAX)
            return at - pos;
        from = mid_pos;
    }
    uint64_t at = next_mark(marks->large, pos + from, pos + end_pos);
    return at != UINT64_MAX ? at - pos : remaining;
}

int64_t cdc_cut(const cdc_params *cp, const cdc_stream *s, int final, int threads, uint32_t *lengths,
                uint64_t *consumed)
{
    *consumed = 0;
    if (s->total == 0)
        return 0;
    if (threads <= 1)
        return cut_sequential(cp, s, final, lengths, consumed);
    uint64_t words = (s->total + 63) / 64;
    if ((uint64_t)threads > words)
        threads = (int)words; /* a part marks 64 positions at least */
    uint64_t *bits = calloc(2 * words, sizeof(uint64_t));
    if (!bits)
        return -1;
    mark_job job = {cp, s, bits, bits + words};
    fanout(mark_part, &job, threads);
    int64_t n = 0;
    uint64_t pos = 0;
    while (pos < s->total) {
        uint64_t len = select_one(cp, s, &job, pos);
        if (!final && pos + len == s->total)
            break; /* the last chunk is not certain: the caller carries it */
        lengths[n++] = (uint32_t)len;
        pos += len;
    }
    free(bits);
    *consumed = pos;
    return n;
}
