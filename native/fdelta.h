/* The fdelta codec's shared parts (fdelta_encode.c, fdelta_decode.c; plain C, no Python):
 * its constants, the float format of a piece, and little-endian helpers. The payload is
 * docs/format.md section 3.2.1; floatcodec.c has the model's description. */
#ifndef COWFS_FDELTA_H
#define COWFS_FDELTA_H
#include <stddef.h>
#include <stdint.h>

#define PROB_BITS 12
#define PROB_SCALE (1u << PROB_BITS)
#define RANS_L (1u << 15) /* states in [2^15, 2^31): the encoder's reciprocals are exact there */
#define MAX_LANES 32 /* codec 4 interleaves 4 rANS states, codec 5 32 */
#define EBUCKETS 16
#define MAX_SYMS 33 /* bit lengths 0..32 */
#define HEADER 19   /* elem, mant, ebits, e_lo, bshift, n, word bytes, bit bytes, contexts */
#define STREAM_PAD 128 /* zero bytes after each stream in the decoder's copy */

typedef struct {
    int elem;  /* 2 or 4 */
    int mant;  /* the exponent field starts at this bit */
    int ebits; /* its width */
    int elo;   /* the exponent of bucket 0 */
    int nsym;  /* 8 * elem + 1 */
    int bshift; /* the context: exponent buckets merged 2^bshift at a time */
} fd_format;

/* Little-endian loads and stores: one memory access on a little-endian CPU, byte by byte
 * elsewhere. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#include <string.h>
static inline uint32_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void put16(uint8_t *p, uint32_t v) { uint16_t w = (uint16_t)v; memcpy(p, &w, 2); }
static inline void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
#else
static inline void put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void put32(uint8_t *p, uint32_t v) { put16(p, v); put16(p + 2, v >> 16); }
static inline uint32_t get16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t get32(const uint8_t *p) { return get16(p) | get16(p + 2) << 16; }
static inline uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
#endif

static inline uint32_t load_elem(const uint8_t *p, size_t i, int elem)
{
    p += i * (size_t)elem;
    return elem == 2 ? get16(p) : get32(p);
}

static inline void store_elem(uint8_t *p, size_t i, int elem, uint32_t v)
{
    p += i * (size_t)elem;
    if (elem == 2)
        put16(p, v);
    else
        put32(p, v);
}

static inline int bucket(uint32_t y, const fd_format *f)
{
    int e = (int)((y >> f->mant) & ((1u << f->ebits) - 1)) - f->elo;
    return e < 0 ? 0 : (e >= EBUCKETS ? EBUCKETS - 1 : e);
}

/* 0 for 0, without a branch: the lowest bit set below z keeps clz defined */
static inline int bit_length(uint32_t z) { return 63 - __builtin_clzll((uint64_t)z << 1 | 1); }

/* The payload (after the base id) of n elements of `raw` against `base`, with `lanes` (4 or
 * 32) interleaved rANS states: its length, 0 when it would exceed `limit`, -1 when out of
 * memory. `out` holds fd_encode_bound(n, elem). */
long long fd_encode(const uint8_t *raw, const uint8_t *base, size_t n, fd_format f, int lanes, uint8_t *out,
                    size_t limit);
size_t fd_encode_bound(size_t n, int elem);

/* Decode a payload of `len` bytes, coded with `lanes` (4 or 32) states, against `base` into
 * `out` (both `out_len` bytes): NULL, or what is wrong with the payload (a static string).
 * `simd` 0: the plain C steps even where the CPU has a vector path (the same bytes). */
const char *fd_decode(const uint8_t *p, size_t len, const uint8_t *base, uint8_t *out, size_t out_len, int lanes,
                      int simd);
/* Whether fd_decode's `simd` has a vector path on this CPU (AVX2) for 32 lanes. */
int fd_decode_simd(void);

#endif
