/* FastCDC over a stream of pieces, on several threads (plain C, no Python; cdc.c). */
#ifndef COWFS_CDC_H
#define COWFS_CDC_H

#include <stddef.h>
#include <stdint.h>

/* pyfastcdc's parameters (cdc_config in dataplane.c fills them from its tables). Neither
 * mask may have bit 63 set (checked there): then a position's cut test does not depend on
 * its parity within the chunk, only on the 64 bytes that end there. */
typedef struct {
    uint64_t min_size, avg_size, max_size;
    uint64_t mask_s, mask_l, mask_s_ls, mask_l_ls;
    uint64_t gear[256], gear_ls[256];
} cdc_params;

/* One buffer of a stream: `len` bytes at stream offset `start` (pieces lie back to back). */
typedef struct {
    const uint8_t *data;
    uint64_t len, start;
} cdc_piece;

typedef struct {
    const cdc_piece *pieces;
    size_t count;
    uint64_t total;
} cdc_stream;

/* Cut the stream into chunks: the same lengths as pyfastcdc's FastCDC with these parameters
 * over the joined bytes. Without `final` the last chunk is left out. Writes at most
 * total / min_size + 2 lengths; returns how many, or -1 when memory ran out.
 * `*consumed`: the bytes the lengths cover. threads <= 1: pyfastcdc's loop on this thread;
 * more: every position marked on that many threads, then the cuts picked (cdc.c says
 * which costs what). */
int64_t cdc_cut(const cdc_params *cp, const cdc_stream *s, int final, int threads, uint32_t *lengths,
                uint64_t *consumed);

/* Copy `n` stream bytes from stream offset `at` (within the stream) into `out`. */
void cdc_stream_copy(const cdc_stream *s, uint64_t at, uint64_t n, uint8_t *out);

/* The index of the piece that holds stream offset `at` (< total): the last piece starting
 * at or before it that is not empty. */
size_t cdc_piece_at(const cdc_stream *s, uint64_t at);

#endif
