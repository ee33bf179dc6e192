/* The fdelta encoder (docs/format.md section 3.2.1): two passes over the piece, the
 * first finding each element's symbol, bucket and raw bits and counting them, the
 * second coding the symbols with rANS, last to first. Plain C; floatcodec.c calls it
 * with the GIL released. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fdelta.h"

/* Frequencies summing to PROB_SCALE, at least 1 for every symbol counted. */
static void normalize(const uint32_t *count, int nsym, uint32_t *freq)
{
    uint64_t total = 0;
    uint32_t sum = 0;
    int top = 0;
    for (int s = 0; s < nsym; s++)
        total += count[s];
    for (int s = 0; s < nsym; s++) {
        freq[s] = 0;
        if (count[s]) {
            uint64_t q = (uint64_t)count[s] * PROB_SCALE / total;
            freq[s] = q ? (uint32_t)q : 1;
            sum += freq[s];
            if (freq[s] > freq[top])
                top = s;
        }
    }
    /* the largest absorbs the rounding; if it cannot go below 1, take from the others */
    while (sum != PROB_SCALE) {
        if (sum < PROB_SCALE) {
            freq[top] += PROB_SCALE - sum;
            sum = PROB_SCALE;
        } else {
            int best = -1;
            for (int s = 0; s < nsym; s++)
                if (freq[s] > 1 && (best < 0 || freq[s] > freq[best]))
                    best = s;
            uint32_t take = sum - PROB_SCALE, room = freq[best] - 1;
            if (take > room)
                take = room;
            freq[best] -= take;
            sum -= take;
        }
    }
}

static inline void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }

typedef struct {
    uint32_t x_max;    /* a state at or above it is renormalised first */
    uint32_t rcp_freq; /* x / freq = (x * rcp_freq) >> 32 >> rcp_shift */
    uint32_t bias;
    uint16_t rcp_shift;
    uint16_t cmpl_freq; /* PROB_SCALE - freq */
} enc_sym;

static void enc_symbol(enc_sym *e, uint32_t start, uint32_t freq)
{
    e->x_max = ((RANS_L >> PROB_BITS) << 16) * freq;
    e->cmpl_freq = (uint16_t)(PROB_SCALE - freq);
    if (freq < 2) {
        e->rcp_freq = ~0u;
        e->rcp_shift = 0;
        e->bias = start + PROB_SCALE - 1;
    } else {
        uint32_t shift = 0;
        while (freq > (1u << shift))
            shift++;
        e->rcp_freq = (uint32_t)(((1ull << (shift + 31)) + freq - 1) / freq);
        e->rcp_shift = (uint16_t)(shift - 1);
        e->bias = start;
    }
}

/* The context modes the encoder weighs (docs/format.md 3.2.1): the 16 exponent buckets
 * merged 2^bshift at a time. A small piece pays less for a table of fewer contexts. */
#define MODES 5 /* bshift 0..4 */
#define SAMPLE_BLOCK 1024 /* the look before a piece is coded: a block of elements */
#define SAMPLE_EVERY 16   /* in every 16 */

/* Bits the symbols take with buckets merged 2^bshift at a time (their empirical conditional
 * entropy), plus the table when `tables`. */
static double mode_bits(const uint32_t *fine, int nsym, int bshift, uint32_t *agg, int tables)
{
    int nctx = EBUCKETS >> bshift;
    memset(agg, 0, (size_t)nctx * nsym * sizeof(uint32_t));
    for (int b = 0; b < EBUCKETS; b++)
        for (int s = 0; s < nsym; s++)
            agg[(size_t)(b >> bshift) * nsym + s] += fine[(size_t)b * nsym + s];
    double bits = 0;
    for (int c = 0; c < nctx; c++) {
        const uint32_t *row = agg + (size_t)c * nsym;
        double total = 0, sum = 0;
        int present = 0;
        for (int s = 0; s < nsym; s++)
            if (row[s]) {
                total += row[s];
                sum += row[s] * log2((double)row[s]);
                present++;
            }
        if (present)
            bits += total * log2(total) - sum + (tables ? 8.0 * (3 + 3 * present) : 0);
    }
    return bits;
}

/* A look at one block of SAMPLE_BLOCK elements in every SAMPLE_EVERY: true when the piece's
 * payload would clearly exceed `limit` (its estimate, the symbols' entropy and the raw bits
 * scaled up, passes the limit by a tenth), so that a piece the float delta does not suit
 * (AdamW's exp_avg) costs a sixteenth of a pass. `fine` and `agg` are left zeroed. */
static int too_large(const uint8_t *raw, const uint8_t *base, size_t n, const fd_format *f, uint32_t *fine,
                     uint32_t *agg, size_t limit)
{
    size_t cells = (size_t)EBUCKETS * f->nsym, seen = 0;
    uint64_t raw_bits = 0;
    uint32_t wmask = f->elem == 2 ? 0xffffu : 0xffffffffu;
    for (size_t b = 0; b + SAMPLE_BLOCK <= n; b += SAMPLE_EVERY * SAMPLE_BLOCK) {
        for (size_t i = b; i < b + SAMPLE_BLOCK; i++) {
            uint32_t y = load_elem(base, i, f->elem), d = (load_elem(raw, i, f->elem) - y) & wmask;
            uint32_t z = ((d << 1) ^ (0u - (d >> (8 * f->elem - 1)))) & wmask;
            int L = bit_length(z);
            fine[(size_t)bucket(y, f) * f->nsym + L]++;
            raw_bits += (uint64_t)(L - (L > 0));
        }
        seen += SAMPLE_BLOCK;
    }
    double best = -1;
    for (int m = 0; m < MODES; m++) {
        double bits = mode_bits(fine, f->nsym, m, agg, 0);
        if (best < 0 || bits < best)
            best = bits;
    }
    memset(fine, 0, cells * sizeof(uint32_t));
    memset(agg, 0, cells * sizeof(uint32_t));
    double estimate = (best + (double)raw_bits) / 8 * ((double)n / (double)seen);
    return estimate > 1.1 * (double)limit;
}

long long fd_encode(const uint8_t *raw, const uint8_t *base, size_t n, fd_format f, int lanes, uint8_t *out,
                    size_t limit)
{
    int emax = -1, einf = (1 << f.ebits) - 1;
    if (f.elem == 2) /* the largest finite exponent, without a branch per element */
        for (size_t i = 0; i < n; i++) {
            int e = (int)((load_elem(base, i, 2) >> f.mant) & (uint32_t)einf);
            e = e == einf ? -1 : e;
            emax = e > emax ? e : emax;
        }
    else
        for (size_t i = 0; i < n; i++) {
            int e = (int)((load_elem(base, i, 4) >> f.mant) & (uint32_t)einf);
            e = e == einf ? -1 : e;
            emax = e > emax ? e : emax;
        }
    f.elo = emax > EBUCKETS - 1 ? emax - (EBUCKETS - 1) : 0;

    size_t cells = (size_t)EBUCKETS * f.nsym;
    uint8_t *sym = malloc(n ? n : 1);
    uint8_t *ctx = malloc(n ? n : 1); /* the exponent bucket of each element */
    uint32_t *fine = calloc(2 * cells, sizeof(uint32_t)); /* two halves: even and odd elements */
    uint32_t *count = calloc(cells, sizeof(uint32_t));
    uint32_t *freq = calloc(cells, sizeof(uint32_t));
    uint32_t *cum = calloc(cells, sizeof(uint32_t));
    uint8_t *bits = malloc(n * (size_t)f.elem + 16);
    uint8_t *words = malloc(n * 2 + 2);
    enc_sym *esym = malloc(cells * sizeof(enc_sym));
    long long result = -1;
    if (!sym || !ctx || !fine || !count || !freq || !cum || !bits || !words || !esym)
        goto done;

    if (n >= SAMPLE_EVERY * SAMPLE_BLOCK && too_large(raw, base, n, &f, fine, count, limit)) {
        result = 0;
        goto done;
    }

    uint64_t acc = 0;
    int nacc = 0;
    uint8_t *bp = bits;
    uint32_t wmask = f.elem == 2 ? 0xffffu : 0xffffffffu;
    uint8_t bucket_of[1 << 11]; /* exponent field -> bucket */
    for (int e = 0; e <= einf; e++) {
        int b = e - f.elo;
        bucket_of[e] = (uint8_t)(b < 0 ? 0 : (b >= EBUCKETS ? EBUCKETS - 1 : b));
    }
    const int mant = f.mant, nsym = f.nsym;
#define FD_SCAN(ELEM)                                                                               \
    for (size_t i = 0; i < n; i++) {                                                                \
        uint32_t x = load_elem(raw, i, (ELEM)), y = load_elem(base, i, (ELEM));                     \
        uint32_t d = (x - y) & wmask;                                                               \
        uint32_t z = ((d << 1) ^ (0u - (d >> (8 * (ELEM) - 1)))) & wmask;                           \
        int L = bit_length(z);                                                                      \
        int c = bucket_of[(y >> mant) & (uint32_t)einf];                                            \
        sym[i] = (uint8_t)L;                                                                        \
        ctx[i] = (uint8_t)c;                                                                        \
        fine[(i & 1) * cells + (size_t)c * nsym + L]++; /* no store-to-load chain between neighbours */ \
        int nb = L - (L > 0); /* the bits below the leading one, appended without a branch: */      \
        acc |= (uint64_t)(z & ((1u << nb) - 1)) << nacc; /* at most 7 + 31 bits held */             \
        nacc += nb;                                                                                 \
        put64(bp, acc);                                                                             \
        bp += nacc >> 3;                                                                            \
        acc >>= nacc & ~7;                                                                          \
        nacc &= 7;                                                                                  \
    }
    if (f.elem == 2)
        FD_SCAN(2)
    else
        FD_SCAN(4)
#undef FD_SCAN
    size_t bit_bytes = ((size_t)(bp - bits) + (nacc > 0) + 7) / 8 * 8; /* zero padded to whole u64s */
    for (size_t k = 0; k < cells; k++)
        fine[k] += fine[cells + k];
    memset(bp + (nacc > 0), 0, bits + bit_bytes - (bp + (nacc > 0)));

    double best = -1;
    for (int m = 0; m < MODES; m++) {
        double bits_ = mode_bits(fine, f.nsym, m, count, 1);
        if (best < 0 || bits_ < best) {
            best = bits_;
            f.bshift = m;
        }
    }
    /* the entropy is a lower bound of what rANS writes (the final states, which carry up to
     * 16 bits each, not counted): past the limit already, stop here */
    if (HEADER + bit_bytes + best / 8 > (double)limit) {
        result = 0;
        goto done;
    }
    int nctx = EBUCKETS >> f.bshift;
    mode_bits(fine, f.nsym, f.bshift, count, 1); /* the chosen mode's counts */

    size_t used = 0, table_bytes = 0;
    int present[EBUCKETS] = {0}; /* symbols seen per context: its table row's length */
    for (int c = 0; c < nctx; c++) {
        uint32_t *cnt = count + (size_t)c * f.nsym, *fr = freq + (size_t)c * f.nsym;
        for (int s = 0; s < f.nsym; s++)
            present[c] += cnt[s] != 0;
        if (!present[c])
            continue;
        normalize(cnt, f.nsym, fr);
        uint32_t run = 0;
        for (int s = 0; s < f.nsym; s++) {
            cum[(size_t)c * f.nsym + s] = run;
            run += fr[s];
        }
        used++;
        table_bytes += 3 + 3 * (size_t)present[c];
    }

    /* rANS, backwards (the decoder reads the words forwards), dividing by reciprocals
     * (Alverson's method, as ryg_rans does: exact for states below 2^31) */
    for (size_t k = 0; k < (size_t)nctx * f.nsym; k++)
        if (freq[k])
            enc_symbol(&esym[k], cum[k], freq[k]);
    uint32_t st[MAX_LANES];
    for (int k = 0; k < lanes; k++)
        st[k] = RANS_L;
    uint8_t *wp = words + n * 2;
#define FD_PUT(ST, I)                                                                               \
    do {                                                                                            \
        const enc_sym *e_ = &esym[(size_t)(ctx[(I)] >> f.bshift) * f.nsym + sym[(I)]];              \
        uint32_t x_ = (ST), out_ = x_ >= e_->x_max; /* branch-free: the word is written anyway */  \
        put16(wp - 2, x_);                                                                          \
        wp -= 2 * out_;                                                                             \
        x_ >>= out_ << 4;                                                                           \
        uint32_t q_ = (uint32_t)(((uint64_t)x_ * e_->rcp_freq) >> 32) >> e_->rcp_shift;             \
        (ST) = x_ + e_->bias + q_ * e_->cmpl_freq;                                                  \
    } while (0)
    size_t i = n;
    for (; i % (size_t)lanes; i--) /* the last n % lanes elements, each on its lane */
        FD_PUT(st[(i - 1) % (size_t)lanes], i - 1);
    if (lanes == 4) {
        uint32_t s0 = st[0], s1 = st[1], s2 = st[2], s3 = st[3];
        for (; i; i -= 4) { /* lanes in registers: four independent chains */
            FD_PUT(s3, i - 1);
            FD_PUT(s2, i - 2);
            FD_PUT(s1, i - 3);
            FD_PUT(s0, i - 4);
        }
        st[0] = s0, st[1] = s1, st[2] = s2, st[3] = s3;
    } else {
        for (; i; i -= (size_t)lanes) /* each lane its own chain, through st[] */
            for (int k = lanes - 1; k >= 0; k--)
                FD_PUT(st[k], i - (size_t)lanes + (size_t)k);
    }
#undef FD_PUT
    size_t word_bytes = (size_t)(words + n * 2 - wp);

    size_t total = HEADER + table_bytes + 4 * (size_t)lanes + word_bytes + bit_bytes;
    if (total > limit) {
        result = 0;
        goto done;
    }
    uint8_t *o = out;
    o[0] = (uint8_t)f.elem;
    o[1] = (uint8_t)f.mant;
    o[2] = (uint8_t)f.ebits;
    o[3] = (uint8_t)f.elo;
    o[4] = (uint8_t)f.bshift;
    put32(o + 5, (uint32_t)n);
    put32(o + 9, (uint32_t)word_bytes);
    put32(o + 13, (uint32_t)bit_bytes);
    put16(o + 17, (uint32_t)used);
    o += HEADER;
    for (int c = 0; c < nctx; c++) {
        uint32_t *cnt = count + (size_t)c * f.nsym, *fr = freq + (size_t)c * f.nsym;
        if (!present[c])
            continue;
        put16(o, (uint32_t)c);
        o[2] = (uint8_t)present[c];
        o += 3;
        for (int s = 0; s < f.nsym; s++)
            if (cnt[s]) {
                o[0] = (uint8_t)s;
                put16(o + 1, fr[s] - 1); /* 1..4096 stored as 0..4095 */
                o += 3;
            }
    }
    for (int k = 0; k < lanes; k++, o += 4)
        put32(o, st[k]);
    memcpy(o, wp, word_bytes);
    o += word_bytes;
    memcpy(o, bits, bit_bytes);
    result = (long long)total;
done:
    free(sym);
    free(ctx);
    free(fine);
    free(count);
    free(freq);
    free(cum);
    free(bits);
    free(words);
    free(esym);
    return result;
}

size_t fd_encode_bound(size_t n, int elem)
{
    /* the header, a table of every context and symbol, the states, a word per element and
     * every raw bit */
    return HEADER + (size_t)EBUCKETS * (3 + 3 * (8 * elem + 1)) + 4 * MAX_LANES + 2 * n
           + n * (size_t)elem + 8;
}
