/* Run one job's parts on several threads at once, within one call (plain C, no Python):
 * the calling thread runs part 0 and waits for the others. Used by the batch functions
 * (cdc.c, dataplane.c) after they have released the GIL. */
#ifndef COWFS_FANOUT_H
#define COWFS_FANOUT_H

#define FANOUT_MAX 64 /* threads per call at most */

typedef void (*fanout_part)(void *job, int part, int parts);

/* fn(job, i, parts) for every i in [0, parts), parts clamped to [1, FANOUT_MAX]; returns
 * when all are done. A thread that cannot be started has its part run by the caller. */
void fanout(fanout_part fn, void *job, int parts);

#endif
