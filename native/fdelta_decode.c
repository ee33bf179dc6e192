/* The fdelta decoder (docs/format.md section 3.2.1), for 4 states (codec 4) and 32 (codec
 * 5). Plain C, with AVX2 steps chosen at run time where the CPU has them; floatcodec.c
 * calls it with the GIL released.
 *
 * Elements are decoded a block of BLOCK at a time, in three passes over the block:
 *   1. each element's context, from its base element's exponent (arithmetic the compiler
 *      vectorises);
 *   2. the rANS lanes alone: each element's symbol (its bit length). A step is one load
 *      from its context's slot table (symbol, frequency and bias packed in a word), a
 *      multiply and the renormalisation. The slots of a context the payload has no table
 *      for all hold NO_TABLE, a symbol no table has. Four lanes: unrolled, in registers;
 *      32: eight at a time in an AVX2 register (a gather of their entries), or one after
 *      another in plain C;
 *   3. the block's symbols summed (and checked for NO_TABLE), then the raw bits below each
 *      leading one, and the elements written: eight at a time with AVX2 (the prefix sums
 *      of their bit counts by one multiply, then a byte shuffle or a gather), else one by
 *      one.
 * In one pass, as before, every element's raw bits waited for its symbol (their place is
 * the sum of the bit lengths before it) and so chained the lanes together; the slot table
 * replaced a search whose steps the branch predictor could not guess (docs/benchmarks.md,
 * "The float delta's decoder"). The vector and plain steps give the same bytes and the
 * same errors: both check the words once per round of lanes.
 *
 * Both streams are read from copies with STREAM_PAD zero bytes behind them, so that a step
 * needs no bounds check: the words are checked once per round of lanes (a step takes at
 * most one word, and a round of 32 reads at most 64 bytes past the check), the raw bits
 * once per block, before any of its bits is read, and both exactly at the end. */
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

/* One rANS step of the lane whose state is ST, for element K of the block: its symbol into
 * sym[K]. Branch-free: the next word is read whether or not it is taken. */
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

/* Pass 2 of a block of bn elements whose first is on lane 0: the symbols, as far as the
 * words last (checked before every round of `lanes` elements, which take at most one word
 * each); returns the elements decoded (bn unless the words ran out). */
typedef size_t (*symbols_fn)(const uint32_t *slots, const uint8_t *cx, uint8_t *sym, size_t bn, uint32_t *st,
                             int lanes, const uint8_t *words, size_t *wpos_io, size_t word_bytes);

static size_t symbols_4(const uint32_t *slots, const uint8_t *cx, uint8_t *sym, size_t bn, uint32_t *st, int lanes,
                        const uint8_t *words, size_t *wpos_io, size_t word_bytes)
{
    (void)lanes;
    size_t wpos = *wpos_io, k;
    uint32_t s0 = st[0], s1 = st[1], s2 = st[2], s3 = st[3]; /* four chains in registers */
    for (k = 0; k + 4 <= bn && wpos <= word_bytes; k += 4) {
        SYM_STEP(s0, k); SYM_STEP(s1, k + 1); SYM_STEP(s2, k + 2); SYM_STEP(s3, k + 3);
    }
    if (k < bn && k + 4 > bn && wpos <= word_bytes) { /* the last 1-3 elements of the piece */
        SYM_STEP(s0, k);
        if (k + 1 < bn) SYM_STEP(s1, k + 1);
        if (k + 2 < bn) SYM_STEP(s2, k + 2);
        k = bn;
    }
    st[0] = s0, st[1] = s1, st[2] = s2, st[3] = s3;
    *wpos_io = wpos;
    return k;
}

/* Any number of lanes, one state after another through st[] (32 independent chains keep
 * the core busy without registers for them all). */
static size_t symbols_plain(const uint32_t *slots, const uint8_t *cx, uint8_t *sym, size_t bn, uint32_t *st, int lanes,
                             const uint8_t *words, size_t *wpos_io, size_t word_bytes)
{
    size_t wpos = *wpos_io, k = 0;
    while (k < bn && wpos <= word_bytes) {
        size_t round = bn - k < (size_t)lanes ? bn - k : (size_t)lanes;
        for (size_t j = 0; j < round; j++)
            SYM_STEP(st[j], k + j);
        k += round;
    }
    *wpos_io = wpos;
    return k;
}

/* Pass 1: each element's context, its base element's exponent bucket (clamped to
 * 0..EBUCKETS - 1) merged 2^bshift at a time; and, before pass 3, the raw bits a block's
 * symbols take and their largest. Plain arithmetic the compiler vectorises: built twice,
 * for any x86-64 and for AVX2 (whose min, max and wider registers it needs to be fast). */
typedef void (*contexts_fn)(const uint8_t *bb, size_t bn, int elem, int mant, uint32_t emask, int elo, int bshift,
                            uint8_t *cx);
typedef uint64_t (*bit_count_fn)(const uint8_t *sym, size_t bn, uint8_t *top);

#define CONTEXTS_BODY                                                                                \
    {                                                                                                \
        if (elem == 2)                                                                               \
            for (size_t k = 0; k < bn; k++) {                                                        \
                int b = (int)((load_elem(bb, k, 2) >> mant) & emask) - elo;                          \
                cx[k] = (uint8_t)((b < 0 ? 0 : (b > EBUCKETS - 1 ? EBUCKETS - 1 : b)) >> bshift);    \
            }                                                                                        \
        else                                                                                         \
            for (size_t k = 0; k < bn; k++) {                                                        \
                int b = (int)((load_elem(bb, k, 4) >> mant) & emask) - elo;                          \
                cx[k] = (uint8_t)((b < 0 ? 0 : (b > EBUCKETS - 1 ? EBUCKETS - 1 : b)) >> bshift);    \
            }                                                                                        \
    }
#define BIT_COUNT_BODY                                                                               \
    {                                                                                                \
        uint64_t take = 0;                                                                           \
        uint8_t hi = 0;                                                                              \
        for (size_t k = 0; k < bn; k++) {                                                            \
            take += (uint64_t)(sym[k] - (sym[k] > 0));                                               \
            hi = sym[k] > hi ? sym[k] : hi;                                                          \
        }                                                                                            \
        *top = hi;                                                                                   \
        return take;                                                                                 \
    }

static void contexts_plain(const uint8_t *bb, size_t bn, int elem, int mant, uint32_t emask, int elo, int bshift,
                           uint8_t *cx) CONTEXTS_BODY
static uint64_t bit_count_plain(const uint8_t *sym, size_t bn, uint8_t *top) BIT_COUNT_BODY

/* Pass 3 of a block whose symbols are all known and whose raw bits all lie in the stream:
 * each element's raw bits below its leading one, from bit bpos on, and the element written
 * (out = base + the zigzag-decoded difference); returns where the next block's bits start. */
typedef size_t (*raw_bits_fn)(const uint8_t *sym, size_t bn, const uint8_t *bits, size_t bpos, const uint8_t *bb,
                              uint8_t *ob, int elem);

static size_t raw_bits_plain(const uint8_t *sym, size_t bn, const uint8_t *bits, size_t bpos, const uint8_t *bb,
                              uint8_t *ob, int elem)
{
    for (size_t k = 0; k < bn; k++) {
        int s = sym[k], nb = s - (s > 0);
        uint64_t win = get64(bits + (bpos >> 3)) >> (bpos & 7);
        uint32_t z = (s ? 1u << (s - 1) : 0u) | (uint32_t)(win & ((1ull << nb) - 1));
        bpos += (size_t)nb;
        uint32_t d = (z >> 1) ^ (0u - (z & 1));
        if (elem == 2)
            store_elem(ob, k, 2, (load_elem(bb, k, 2) + d) & 0xffffu);
        else
            store_elem(ob, k, 4, load_elem(bb, k, 4) + d);
    }
    return bpos;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <pthread.h>
#define HAVE_AVX2_PATH 1

/* Lane j of a group of eight that takes a word takes the one after those of the lanes
 * before it that take one: expand_idx[mask] gives each lane the index of its word among
 * the eight read. */
static uint32_t expand_idx[256][8];

static void fill_expand_idx(void)
{
    for (int m = 0; m < 256; m++) {
        int c = 0;
        for (int j = 0; j < 8; j++)
            expand_idx[m][j] = (m >> j & 1) ? (uint32_t)c++ : 0;
    }
}

/* Eight lanes in one AVX2 vector: the eight slot entries by one gather, the eight states
 * stepped at once, and the words the lanes take read as eight u16 and moved to their lanes.
 * For 32 lanes: a round is four vectors, each its own chain. The four gathers and steps of
 * a round come first and the words after them, so that no gather waits for the word count
 * of the vector before it (where a vector's words start). */
__attribute__((target("avx2"))) static size_t symbols_avx2(const uint32_t *slots, const uint8_t *cx, uint8_t *sym,
                                                            size_t bn, uint32_t *st, int lanes, const uint8_t *words,
                                                            size_t *wpos_io, size_t word_bytes)
{
    enum { nv = MAX_LANES / 8 };
    size_t wpos = *wpos_io, k = 0;
    __m256i x[nv];
    for (int v = 0; v < nv; v++)
        x[v] = _mm256_loadu_si256((const __m256i *)(st + 8 * v));
    const __m256i pmask = _mm256_set1_epi32(PROB_SCALE - 1), fmask = _mm256_set1_epi32(0x1fff),
                  bmask = _mm256_set1_epi32(0xfff), low = _mm256_set1_epi32(RANS_L);
    for (; k + (size_t)lanes <= bn && wpos <= word_bytes; k += (size_t)lanes) {
        __m256i nx[nv], need[nv];
        int m[nv];
        for (int v = 0; v < nv; v++) {
            const uint8_t *c8 = cx + k + 8 * (size_t)v;
            __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)c8));
            __m256i idx = _mm256_or_si256(_mm256_slli_epi32(c, PROB_BITS), _mm256_and_si256(x[v], pmask));
            __m256i e = _mm256_i32gather_epi32((const int *)slots, idx, 4);
            nx[v] = _mm256_add_epi32(
                _mm256_mullo_epi32(_mm256_and_si256(e, fmask), _mm256_srli_epi32(x[v], PROB_BITS)),
                _mm256_and_si256(_mm256_srli_epi32(e, 13), bmask));
            need[v] = _mm256_cmpgt_epi32(low, nx[v]); /* states stay below 2^31: signed compare */
            m[v] = _mm256_movemask_ps(_mm256_castsi256_ps(need[v]));
            __m256i s32 = _mm256_srli_epi32(e, 25); /* eight symbols to eight bytes */
            __m128i s16 = _mm_packus_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            _mm_storel_epi64((__m128i *)(sym + k + 8 * (size_t)v), _mm_packus_epi16(s16, s16));
        }
        for (int v = 0; v < nv; v++) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(words + wpos)));
            w = _mm256_permutevar8x32_epi32(w, _mm256_loadu_si256((const __m256i *)expand_idx[m[v]]));
            x[v] = _mm256_blendv_epi8(nx[v], _mm256_or_si256(_mm256_slli_epi32(nx[v], 16), w), need[v]);
            wpos += 2 * (size_t)__builtin_popcount((unsigned)m[v]);
        }
    }
    for (int v = 0; v < nv; v++)
        _mm256_storeu_si256((__m256i *)(st + 8 * v), x[v]);
    *wpos_io = wpos;
    if (k < bn && wpos <= word_bytes) /* the piece's last round, shorter than `lanes` */
        k += symbols_plain(slots, cx + k, sym + k, bn - k, st, lanes, words, wpos_io, word_bytes);
    return k;
}

/* Pass 3 for eight elements at a time: their raw-bit counts and the prefix sums of those
 * in one 64-bit word (one multiply), each element's bits taken at its own bit place (a byte
 * shuffle of one 16-byte window for bf16, a gather of 64-bit windows for f32), and the
 * eight written at once. */
__attribute__((target("avx2"), always_inline)) static inline size_t
raw_bits_avx2_of(const uint8_t *sym, size_t bn, const uint8_t *bits, size_t bpos, const uint8_t *bb, uint8_t *ob,
                 int elem)
{
    const __m256i one = _mm256_set1_epi32(1), seven = _mm256_set1_epi32(7), zero = _mm256_setzero_si256();
    const __m256i one64 = _mm256_set1_epi64x(1), low32 = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m128i one16 = _mm_set1_epi16(1);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                            0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i step4 = _mm256_set1_epi32(0x03020100); /* a lane's byte b becomes b, b+1, b+2, b+3 */
    size_t k = 0;
    for (; k + 8 <= bn; k += 8) {
        /* the eight raw-bit counts s - (s > 0) as bytes of one word (a symbol is at most 32,
         * so s + 0x7f sets its byte's top bit exactly when s > 0, and carries nowhere), and
         * their prefix sums by one multiply (8 * 31 = 248: no byte overflows) */
        uint64_t s8 = get64(sym + k);
        uint64_t nb8 = s8 - ((s8 + 0x7f7f7f7f7f7f7f7full) >> 7 & 0x0101010101010101ull);
        uint64_t incl = nb8 * 0x0101010101010101ull, excl = incl - nb8;
        __m256i s = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)s8));
        const uint8_t *at = bits + (bpos >> 3);
        __m256i rel = _mm256_add_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)excl)),
                                       _mm256_set1_epi32((int)(bpos & 7)));
        __m256i byte = _mm256_srli_epi32(rel, 3), sh = _mm256_and_si256(rel, seven), lo;
        if (elem == 2) {
            /* at most 8 * 15 bits after a start below 8: every element's bits lie in the 16
             * bytes at `at`, and its u32 lane takes bytes byte..byte+3 of them by a byte
             * shuffle (an index past 15 only fills bits above its field, masked off) */
            __m256i win = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)at));
            __m256i idx = _mm256_add_epi32(_mm256_shuffle_epi8(byte, spread), step4);
            lo = _mm256_srlv_epi32(_mm256_shuffle_epi8(win, idx), sh);
            /* z = the leading one at bit s - 1 and the raw bits below it: with t = 1 << s,
             * (lo | t >> 1) & (t - 1), which is 0 for s = 0; s <= 16, so z fits 16 bits and
             * the rest runs on eight u16 (the sum wraps as the element does) */
            __m256i t = _mm256_sllv_epi32(one, s);
            __m256i z = _mm256_and_si256(_mm256_or_si256(lo, _mm256_srli_epi32(t, 1)), _mm256_sub_epi32(t, one));
            __m128i z16 = _mm_packus_epi32(_mm256_castsi256_si128(z), _mm256_extracti128_si256(z, 1));
            __m128i d16 = _mm_xor_si128(_mm_srli_epi16(z16, 1), _mm_sub_epi16(_mm_setzero_si128(), _mm_and_si128(z16, one16)));
            __m128i y16 = _mm_loadu_si128((const __m128i *)(bb + 2 * k));
            _mm_storeu_si128((__m128i *)(ob + 2 * k), _mm_add_epi16(y16, d16));
        } else { /* up to 31 bits each: each element's 64-bit window by a gather */
            __m256i nb = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)nb8));
            __m256i w0 = _mm256_i32gather_epi64((const long long *)at, _mm256_castsi256_si128(byte), 1);
            __m256i w1 = _mm256_i32gather_epi64((const long long *)at, _mm256_extracti128_si256(byte, 1), 1);
            w0 = _mm256_srlv_epi64(w0, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(sh)));
            w1 = _mm256_srlv_epi64(w1, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(sh, 1)));
            w0 = _mm256_and_si256(w0, _mm256_sub_epi64(_mm256_sllv_epi64(one64, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(nb))), one64));
            w1 = _mm256_and_si256(w1, _mm256_sub_epi64(_mm256_sllv_epi64(one64, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(nb, 1))), one64));
            lo = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(w0, low32), _mm256_permutevar8x32_epi32(w1, low32), 0xf0);
            __m256i z = _mm256_or_si256(lo, _mm256_sllv_epi32(one, _mm256_sub_epi32(s, one))); /* s = 0: a shift past 31 gives 0 */
            __m256i d = _mm256_xor_si256(_mm256_srli_epi32(z, 1), _mm256_sub_epi32(zero, _mm256_and_si256(z, one)));
            __m256i y = _mm256_loadu_si256((const __m256i *)(bb + 4 * k));
            _mm256_storeu_si256((__m256i *)(ob + 4 * k), _mm256_add_epi32(y, d));
        }
        bpos += incl >> 56;
    }
    return raw_bits_plain(sym + k, bn - k, bits, bpos, bb + (size_t)elem * k, ob + (size_t)elem * k, elem);
}

/* The element size made a constant of each copy, so that its tests leave the loop. */
__attribute__((target("avx2"))) static size_t raw_bits_avx2(const uint8_t *sym, size_t bn, const uint8_t *bits,
                                                             size_t bpos, const uint8_t *bb, uint8_t *ob, int elem)
{
    return elem == 2 ? raw_bits_avx2_of(sym, bn, bits, bpos, bb, ob, 2) : raw_bits_avx2_of(sym, bn, bits, bpos, bb, ob, 4);
}

__attribute__((target("avx2"))) static void contexts_avx2(const uint8_t *bb, size_t bn, int elem, int mant,
                                                           uint32_t emask, int elo, int bshift, uint8_t *cx)
    CONTEXTS_BODY
/* The raw bits are the symbols' sum less the number of non-zero symbols: 32 bytes a step,
 * summed by SAD against zero (symbols are at most 63, so no byte sum overflows). */
__attribute__((target("avx2"))) static uint64_t bit_count_avx2(const uint8_t *sym, size_t bn, uint8_t *top)
{
    const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi8(1);
    __m256i sums = zero, hi = zero;
    size_t k = 0;
    for (; k + 32 <= bn; k += 32) {
        __m256i s = _mm256_loadu_si256((const __m256i *)(sym + k));
        hi = _mm256_max_epu8(hi, s);
        sums = _mm256_add_epi64(sums, _mm256_sad_epu8(_mm256_subs_epu8(s, one), zero));
    }
    uint8_t h[32];
    _mm256_storeu_si256((__m256i *)h, hi);
    uint8_t tail_top;
    uint64_t take = bit_count_plain(sym + k, bn - k, &tail_top);
    for (int j = 0; j < 32; j++)
        tail_top = h[j] > tail_top ? h[j] : tail_top;
    *top = tail_top;
    return take + (uint64_t)_mm256_extract_epi64(sums, 0) + (uint64_t)_mm256_extract_epi64(sums, 1) +
           (uint64_t)_mm256_extract_epi64(sums, 2) + (uint64_t)_mm256_extract_epi64(sums, 3);
}
#endif

#ifdef HAVE_AVX2_PATH
static pthread_once_t avx2_once = PTHREAD_ONCE_INIT;
static int avx2_ok;

static void check_avx2(void)
{
    __builtin_cpu_init();
    avx2_ok = __builtin_cpu_supports("avx2");
    if (avx2_ok)
        fill_expand_idx();
}
#endif

/* The passes a decode runs: for `lanes`, and with `simd` the AVX2 ones where the CPU has
 * them (0: the plain C ones, which the tests compare against them). */
typedef struct {
    contexts_fn contexts;
    symbols_fn symbols;
    bit_count_fn bit_count;
    raw_bits_fn raw_bits;
} fd_passes;

static fd_passes pick_passes(int lanes, int simd)
{
    fd_passes p = {contexts_plain, lanes == 4 ? symbols_4 : symbols_plain, bit_count_plain, raw_bits_plain};
#ifdef HAVE_AVX2_PATH
    if (simd) {
        pthread_once(&avx2_once, check_avx2);
        if (avx2_ok) {
            p.contexts = contexts_avx2;
            p.bit_count = bit_count_avx2;
            p.raw_bits = raw_bits_avx2;
            if (lanes == MAX_LANES) /* four lanes are too few chains to fill a vector */
                p.symbols = symbols_avx2;
        }
    }
#else
    (void)simd;
#endif
    return p;
}

int fd_decode_simd(void)
{
#ifdef HAVE_AVX2_PATH
    pthread_once(&avx2_once, check_avx2);
    return avx2_ok;
#else
    return 0;
#endif
}

const char *fd_decode(const uint8_t *p, size_t len, const uint8_t *base, uint8_t *out, size_t out_len, int lanes,
                      int simd)
{
    if (lanes != 4 && lanes != MAX_LANES)
        return "lanes not 4 or 32";
    if (len < HEADER + 4 * (size_t)lanes)
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
    if ((size_t)(p + len - q) != 4 * (size_t)lanes + word_bytes + bit_bytes) { err = "stream lengths do not match the payload"; goto done; }
    uint32_t st[MAX_LANES];
    for (int k = 0; k < lanes; k++, q += 4) {
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
    const uint32_t emask = (1u << f.ebits) - 1;
    const int mant = f.mant, elo = f.elo, bshift = f.bshift;
    size_t wpos = 0, bpos = 0; /* bytes of words, bits of raw bits taken */
    const fd_passes pass = pick_passes(lanes, simd);

    uint8_t cx[BLOCK], sym[BLOCK];
    for (size_t i = 0; i < n;) {
        size_t bn = n - i < BLOCK ? n - i : BLOCK, k;
        const uint8_t *bb = base + i * (size_t)f.elem;
        uint8_t *ob = out + i * (size_t)f.elem;
        /* 1. contexts */
        pass.contexts(bb, bn, f.elem, mant, emask, elo, bshift, cx);
        /* 2. symbols */
        k = pass.symbols(slots, cx, sym, bn, st, lanes, words, &wpos, word_bytes);
        if (k < bn || wpos > word_bytes) { /* what went wrong first: a context without a table? */
            err = memchr(sym, NO_TABLE, k) ? "a context the table does not have" : "rANS words run out";
            goto done;
        }
        /* 3. raw bits, all of the block's checked to lie in the stream first */
        uint8_t top;
        uint64_t take = pass.bit_count(sym, bn, &top);
        if (top == NO_TABLE) { err = "a context the table does not have"; goto done; }
        if (bpos + take > 8 * (uint64_t)bit_bytes) { err = "raw bits run out"; goto done; }
        bpos = pass.raw_bits(sym, bn, bits, bpos, bb, ob, f.elem);
        i += bn;
    }
    if (wpos != word_bytes || bit_bytes != (bpos + 63) / 64 * 8) { err = "streams not used up"; goto done; }
    if (bpos % 64 && get64(bits + bpos / 64 * 8) >> (bpos % 64)) { err = "streams not used up"; goto done; }
    for (int l = 0; l < lanes; l++)
        if (st[l] != RANS_L) {
            err = "rANS states do not end where the encoder began";
            goto done;
        }
done:
    free(slots);
    free(streams);
    return err;
}
