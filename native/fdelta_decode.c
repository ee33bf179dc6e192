/* The fdelta decoder (docs/format.md section 3.2.1): one pass, four rANS lanes unrolled,
 * both streams read from padded copies so that a step needs no bounds checks (they are
 * checked once per four elements and exactly at the end). Plain C; floatcodec.c calls it
 * with the GIL released. */
#include <stdlib.h>
#include <string.h>

#include "fdelta.h"

typedef struct {
    uint16_t cum[MAX_SYMS + 1];
    uint8_t start[STARTS]; /* the symbol whose range holds slot k << SLOT_SHIFT */
    uint8_t valid;
} dec_table;

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
    dec_table *tab = calloc((size_t)nctx, sizeof(dec_table));
    if (!tab)
        return "out of memory";
    for (int c = 0; c < nctx; c++) /* rows the payload lacks: searches stop at once (never decoded: see below) */
        for (int s = 0; s <= MAX_SYMS; s++)
            tab[c].cum[s] = PROB_SCALE;
    const char *err = NULL;
    uint8_t *streams = NULL;
    const uint8_t *q = p + HEADER, *end = p + len;
    int last = -1;
    for (size_t u = 0; u < used; u++) {
        if (end - q < 3) { err = "table runs past the payload"; goto done; }
        int c = (int)get16(q), k = q[2];
        q += 3;
        if (c <= last || c >= nctx) { err = "table contexts out of order"; goto done; }
        if (k < 1 || k > f.nsym || end - q < 3 * k) { err = "bad table row"; goto done; }
        last = c;
        dec_table *t = tab + c;
        uint32_t fr[MAX_SYMS] = {0};
        int ls = -1;
        for (int j = 0; j < k; j++, q += 3) {
            int s = q[0];
            if (s <= ls || s >= f.nsym) { err = "table symbols out of order"; goto done; }
            ls = s;
            fr[s] = get16(q + 1) + 1;
        }
        uint32_t run = 0;
        for (int s = 0; s < f.nsym; s++) {
            t->cum[s] = (uint16_t)run;
            run += fr[s];
            if (run > PROB_SCALE) { err = "table frequencies do not sum to 4096"; goto done; }
        }
        if (run != PROB_SCALE) { err = "table frequencies do not sum to 4096"; goto done; }
        for (int s = f.nsym; s <= MAX_SYMS; s++)
            t->cum[s] = PROB_SCALE;
        int s = 0;
        for (int j = 0; j < (int)STARTS; j++) {
            uint32_t slot = (uint32_t)j << SLOT_SHIFT;
            while ((uint32_t)t->cum[s] + fr[s] <= slot)
                s++;
            t->start[j] = (uint8_t)s;
        }
        t->valid = 1;
    }
    if ((size_t)(end - q) != 4 * LANES + word_bytes + bit_bytes) { err = "stream lengths do not match the payload"; goto done; }
    uint32_t st[LANES];
    for (int k = 0; k < LANES; k++, q += 4) {
        st[k] = get32(q);
        if (st[k] < RANS_L || st[k] >= 2 * (uint32_t)RANS_L << 15) { err = "bad rANS state"; goto done; }
    }
    /* both streams copied behind zero padding, so that a step reads without bounds checks;
     * the bounds are checked once per four elements (a step takes at most one word and
     * 31 bits) and exactly at the end */
    streams = malloc(word_bytes + bit_bytes + 2 * STREAM_PAD);
    if (!streams) { err = "out of memory"; goto done; }
    uint8_t *words = streams, *bits = streams + word_bytes + STREAM_PAD;
    memcpy(words, q, word_bytes);
    memset(words + word_bytes, 0, STREAM_PAD);
    memcpy(bits, q + word_bytes, bit_bytes);
    memset(bits + bit_bytes, 0, STREAM_PAD);
    /* each exponent's table; a base element whose table the payload lacks is found before
     * decoding (one pass over the base), so the steps need not look */
    const dec_table *by_exp[1 << 11];
    uint8_t lacking[1 << 11];
    for (int e = 0; e < (1 << f.ebits); e++) {
        int b = e - f.elo;
        by_exp[e] = tab + ((b < 0 ? 0 : (b >= EBUCKETS ? EBUCKETS - 1 : b)) >> f.bshift);
        lacking[e] = !by_exp[e]->valid;
    }
    uint32_t lead[MAX_SYMS + 1] = {0}; /* a symbol's leading one (symbols above W never decode) */
    for (int s = 1; s <= 32; s++)
        lead[s] = 1u << (s - 1);
    const uint32_t emask = (1u << f.ebits) - 1, wmask = f.elem == 2 ? 0xffffu : 0xffffffffu;
    const int mant = f.mant;
    size_t wpos = 0, bpos = 0; /* bytes of words, bits of raw bits taken */
    uint32_t s0 = st[0], s1 = st[1], s2 = st[2], s3 = st[3];
    int missing = 0;
    if (f.elem == 2)
        for (size_t i = 0; i < n; i++)
            missing |= lacking[(load_elem(base, i, 2) >> mant) & emask];
    else
        for (size_t i = 0; i < n; i++)
            missing |= lacking[(load_elem(base, i, 4) >> mant) & emask];
    if (missing) { err = "a context the table does not have"; goto done; }

#define FD_STEP(ST, I, ELEM)                                                                        \
    do {                                                                                            \
        uint32_t y_ = load_elem(base, (I), (ELEM));                                                 \
        const dec_table *t_ = by_exp[(y_ >> mant) & emask];                                         \
        uint32_t x_ = (ST), slot_ = x_ & (PROB_SCALE - 1);                                          \
        int s_ = t_->start[slot_ >> SLOT_SHIFT];                                                    \
        while (t_->cum[s_ + 1] <= slot_)                                                            \
            s_++;                                                                                   \
        x_ = (uint32_t)(t_->cum[s_ + 1] - t_->cum[s_]) * (x_ >> PROB_BITS) + slot_ - t_->cum[s_];   \
        uint32_t need_ = x_ < RANS_L;                                                               \
        uint32_t w_ = get16(words + wpos) & (0u - need_);                                           \
        (ST) = x_ << (need_ << 4) | w_;                                                             \
        wpos += 2 * need_;                                                                          \
        int nb_ = s_ - (s_ > 0);                                                                    \
        uint64_t win_ = get64(bits + (bpos >> 3)) >> (bpos & 7);                                    \
        uint32_t z_ = lead[s_] | (uint32_t)(win_ & ((1ull << nb_) - 1));                             \
        bpos += (size_t)nb_;                                                                        \
        store_elem(out, (I), (ELEM), (y_ + ((z_ >> 1) ^ (0u - (z_ & 1)))) & wmask);                 \
    } while (0)

    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        if (wpos > word_bytes || (bpos >> 3) > bit_bytes)
            break;
        if (f.elem == 2) {
            FD_STEP(s0, i, 2); FD_STEP(s1, i + 1, 2); FD_STEP(s2, i + 2, 2); FD_STEP(s3, i + 3, 2);
        } else {
            FD_STEP(s0, i, 4); FD_STEP(s1, i + 1, 4); FD_STEP(s2, i + 2, 4); FD_STEP(s3, i + 3, 4);
        }
    }
    if (i < n && i + LANES > n && wpos <= word_bytes && (bpos >> 3) <= bit_bytes) {
        FD_STEP(s0, i, f.elem);
        if (i + 1 < n) FD_STEP(s1, i + 1, f.elem);
        if (i + 2 < n) FD_STEP(s2, i + 2, f.elem);
        i = n;
    }
#undef FD_STEP
    if (i < n || wpos > word_bytes) { err = "rANS words run out"; goto done; }
    if (bpos > 8 * (uint64_t)bit_bytes) { err = "raw bits run out"; goto done; }
    if (wpos != word_bytes || bit_bytes != (bpos + 63) / 64 * 8) { err = "streams not used up"; goto done; }
    if (bpos % 64 && get64(bits + bpos / 64 * 8) >> (bpos % 64)) { err = "streams not used up"; goto done; }
    if (s0 != RANS_L || s1 != RANS_L || s2 != RANS_L || s3 != RANS_L) {
        err = "rANS states do not end where the encoder began";
        goto done;
    }
done:
    free(tab);
    free(streams);
    return err;
}
