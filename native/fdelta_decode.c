/* The fdelta decoder (docs/format.md section 3.2.1). Plain C; floatcodec.c calls it with the
 * GIL released.
 *
 * Elements are decoded a block of BLOCK at a time, in three passes over the block:
 *   1. each element's context, from its base element's exponent (arithmetic the compiler
 *      vectorises);
 *   2. the four rANS lanes, unrolled, alone: each element's symbol (its bit length). A step
 *      is one load from its context's slot table (symbol, frequency and bias packed in a
 *      word), a multiply and the renormalisation. The slots of a context the payload has
 *      no table for all hold NO_TABLE, a symbol no table has;
 *   3. the block's symbols summed (and checked for NO_TABLE), then the raw bits below each
 *      leading one, and the elements written.
 * In one pass, as before, every element's raw bits waited for its symbol (their place is
 * the sum of the bit lengths before it) and so chained the four lanes together; the slot
 * table replaced a search whose steps the branch predictor could not guess
 * (docs/benchmarks.md, "The float delta's decoder").
 *
 * Both streams are read from copies with zero padding behind them, so that a step needs no
 * bounds check: the words are checked once per four elements (a step takes at most one),
 * the raw bits once per block, before any of its bits is read, and both exactly at the end. */
#include <stdlib.h>
#include <string.h>

#include "fdelta.h"

#define BLOCK 2048 /* elements per block */

/* A slot table entry: the symbol whose range holds the slot, the symbol's frequency and the
 * slot's place in its range, so that a step makes one load. */
#define SLOT_ENTRY(freq, bias, sym) ((freq) | (bias) << 13 | (uint32_t)(sym) << 25)
#define SLOT_FREQ(e) ((e) & 0x1fffu)
#define SLOT_BIAS(e) (((e) >> 13) & 0xfffu)
#define SLOT_SYM(e) ((e) >> 25)
#define NO_TABLE 63u /* the symbol of every slot of a context without a table (no symbol is above 32) */

/* Read the table rows into `slots` (PROB_SCALE entries per context, rows the payload has)
 * and `valid`; returns where they end, or NULL with *err set. */
static const uint8_t *read_tables(const uint8_t *q, const uint8_t *end, size_t used, const fd_format *f, int nctx,
                                  uint32_t *slots, uint8_t *valid, const char **err)
{
    int last = -1;
    for (size_t u = 0; u < used; u++) {
        if (end - q < 3) { *err = "table runs past the payload"; return NULL; }
        int c = (int)get16(q), k = q[2];
        q += 3;
        if (c <= last || c >= nctx) { *err = "table contexts out of order"; return NULL; }
        if (k < 1 || k > f->nsym || end - q < 3 * k) { *err = "bad table row"; return NULL; }
        last = c;
        uint32_t fr[MAX_SYMS] = {0};
        int ls = -1;
        for (int j = 0; j < k; j++, q += 3) {
            int s = q[0];
            if (s <= ls || s >= f->nsym) { *err = "table symbols out of order"; return NULL; }
            ls = s;
            fr[s] = get16(q + 1) + 1;
        }
        uint32_t run = 0;
        for (int s = 0; s < f->nsym; s++) {
            run += fr[s];
            if (run > PROB_SCALE) { *err = "table frequencies do not sum to 4096"; return NULL; }
        }
        if (run != PROB_SCALE) { *err = "table frequencies do not sum to 4096"; return NULL; }
        uint32_t *row = slots + (size_t)c * PROB_SCALE, at = 0;
        for (int s = 0; s < f->nsym; s++)
            for (uint32_t j = 0; j < fr[s]; j++)
                row[at++] = SLOT_ENTRY(fr[s], j, s);
        valid[c] = 1;
    }
    return q;
}

const char *fd_decode(const uint8_t *p, size_t len, const uint8_t *base, uint8_t *out, size_t out_len)
{
    if (len < HEADER + 4 * LANES)
        return "shorter than its header";
    fd_format f = {p[0], p[1], p[2], p[3], 8 * p[0] + 1, p[4]};
    if (f.elem != 2 && f.elem != 4)
        return "element size not 2 or 4";
    if (f.ebits < 1 || f.ebits > 11 || f.mant + f.ebits > 8 * f.elem || f.elo >= (1 << f.ebits))
        return "bad float format";
    if (f.bshift > 4)
        return "bad context mode";
    size_t n = get32(p + 5), word_bytes = get32(p + 9), bit_bytes = get32(p + 13), used = get16(p + 17);
    if (n * (size_t)f.elem != out_len)
        return "element count does not match the raw length";
    if (word_bytes % 2 || bit_bytes % 8)
        return "stream lengths not whole words";
    int nctx = EBUCKETS >> f.bshift;
    uint8_t valid[EBUCKETS] = {0};
    const char *err = NULL;
    uint8_t *streams = NULL;
    uint32_t *slots = malloc((size_t)nctx * PROB_SCALE * sizeof(uint32_t));
    if (!slots)
        return "out of memory";
    const uint8_t *q = read_tables(p + HEADER, p + len, used, &f, nctx, slots, valid, &err);
    if (!q)
        goto done;
    if ((size_t)(p + len - q) != 4 * LANES + word_bytes + bit_bytes) { err = "stream lengths do not match the payload"; goto done; }
    uint32_t st[LANES];
    for (int k = 0; k < LANES; k++, q += 4) {
        st[k] = get32(q);
        if (st[k] < RANS_L || st[k] >= 2 * (uint32_t)RANS_L << 15) { err = "bad rANS state"; goto done; }
    }
    streams = malloc(word_bytes + bit_bytes + 2 * STREAM_PAD);
    if (!streams) { err = "out of memory"; goto done; }
    uint8_t *words = streams, *bits = streams + word_bytes + STREAM_PAD;
    memcpy(words, q, word_bytes);
    memset(words + word_bytes, 0, STREAM_PAD);
    memcpy(bits, q + word_bytes, bit_bytes);
    memset(bits + bit_bytes, 0, STREAM_PAD);
    /* a context the payload has no table for decodes every element to NO_TABLE, which no
     * table has: found when the block's symbols are summed, before any raw bit is read */
    for (int c = 0; c < nctx; c++)
        if (!valid[c])
            for (uint32_t j = 0; j < PROB_SCALE; j++)
                slots[(size_t)c * PROB_SCALE + j] = SLOT_ENTRY(1u, 0u, NO_TABLE);
    uint32_t lead[MAX_SYMS + 1] = {0}; /* a symbol's leading one (symbols above W never decode) */
    for (int s = 1; s <= 32; s++)
        lead[s] = 1u << (s - 1);
    const uint32_t emask = (1u << f.ebits) - 1, wmask = f.elem == 2 ? 0xffffu : 0xffffffffu;
    const int mant = f.mant, elo = f.elo, bshift = f.bshift;
    size_t wpos = 0, bpos = 0; /* bytes of words, bits of raw bits taken */
    uint32_t s0 = st[0], s1 = st[1], s2 = st[2], s3 = st[3];

#define SYM_STEP(ST, K)                                                                             \
    do {                                                                                            \
        uint32_t x_ = (ST), e_ = slots[(uint32_t)cx[K] << PROB_BITS | (x_ & (PROB_SCALE - 1))];      \
        x_ = SLOT_FREQ(e_) * (x_ >> PROB_BITS) + SLOT_BIAS(e_);                                     \
        uint32_t need_ = x_ < RANS_L;                                                               \
        uint32_t w_ = get16(words + wpos) & (0u - need_);                                           \
        (ST) = x_ << (need_ << 4) | w_;                                                             \
        wpos += 2 * need_;                                                                          \
        sym[K] = (uint8_t)SLOT_SYM(e_);                                                             \
    } while (0)

    uint8_t cx[BLOCK], sym[BLOCK];
    for (size_t i = 0; i < n;) {
        size_t bn = n - i < BLOCK ? n - i : BLOCK, k;
        const uint8_t *bb = base + i * (size_t)f.elem;
        uint8_t *ob = out + i * (size_t)f.elem;
        /* 1. contexts: the base element's exponent bucket (clamped to 0..EBUCKETS - 1),
         * merged 2^bshift at a time; plain arithmetic, which the compiler vectorises */
        if (f.elem == 2)
            for (k = 0; k < bn; k++) {
                int b = (int)((load_elem(bb, k, 2) >> mant) & emask) - elo;
                cx[k] = (uint8_t)((b < 0 ? 0 : (b > EBUCKETS - 1 ? EBUCKETS - 1 : b)) >> bshift);
            }
        else
            for (k = 0; k < bn; k++) {
                int b = (int)((load_elem(bb, k, 4) >> mant) & emask) - elo;
                cx[k] = (uint8_t)((b < 0 ? 0 : (b > EBUCKETS - 1 ? EBUCKETS - 1 : b)) >> bshift);
            }
        /* 2. symbols */
        for (k = 0; k + LANES <= bn; k += LANES) {
            if (wpos > word_bytes)
                break;
            SYM_STEP(s0, k); SYM_STEP(s1, k + 1); SYM_STEP(s2, k + 2); SYM_STEP(s3, k + 3);
        }
        if (k < bn && k + LANES > bn && wpos <= word_bytes) { /* the last 1-3 elements of the piece */
            SYM_STEP(s0, k);
            if (k + 1 < bn) SYM_STEP(s1, k + 1);
            if (k + 2 < bn) SYM_STEP(s2, k + 2);
            k = bn;
        }
        if (k < bn || wpos > word_bytes) { /* what went wrong first: a context without a table? */
            err = memchr(sym, NO_TABLE, k) ? "a context the table does not have" : "rANS words run out";
            goto done;
        }
        /* 3. raw bits, all of the block's checked to lie in the stream first */
        uint64_t take = 0;
        uint8_t top = 0;
        for (k = 0; k < bn; k++) {
            take += (uint64_t)(sym[k] - (sym[k] > 0));
            top = sym[k] > top ? sym[k] : top;
        }
        if (top == NO_TABLE) { err = "a context the table does not have"; goto done; }
        if (bpos + take > 8 * (uint64_t)bit_bytes) { err = "raw bits run out"; goto done; }
        for (k = 0; k < bn; k++) {
            int s = sym[k], nb = s - (s > 0);
            uint64_t win = get64(bits + (bpos >> 3)) >> (bpos & 7);
            uint32_t z = lead[s] | (uint32_t)(win & ((1ull << nb) - 1));
            bpos += (size_t)nb;
            uint32_t d = (z >> 1) ^ (0u - (z & 1));
            if (f.elem == 2)
                store_elem(ob, k, 2, (load_elem(bb, k, 2) + d) & wmask);
            else
                store_elem(ob, k, 4, load_elem(bb, k, 4) + d);
        }
        i += bn;
    }
#undef SYM_STEP
    if (wpos != word_bytes || bit_bytes != (bpos + 63) / 64 * 8) { err = "streams not used up"; goto done; }
    if (bpos % 64 && get64(bits + bpos / 64 * 8) >> (bpos % 64)) { err = "streams not used up"; goto done; }
    if (s0 != RANS_L || s1 != RANS_L || s2 != RANS_L || s3 != RANS_L) {
        err = "rANS states do not end where the encoder began";
        goto done;
    }
done:
    free(slots);
    free(streams);
    return err;
}
