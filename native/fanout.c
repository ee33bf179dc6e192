/* fanout.h: one call's parts on threads started for it (pthread_create costs tens of
 * microseconds, against milliseconds of work per part of a multi-MiB batch). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>

#include "fanout.h"

typedef struct {
    fanout_part fn;
    void *job;
    int part, parts;
} fanout_task;

static void *fanout_run(void *arg)
{
    fanout_task *t = arg;
    pthread_setname_np(pthread_self(), "cowfs-fanout");
    t->fn(t->job, t->part, t->parts);
    return NULL;
}

void fanout(fanout_part fn, void *job, int parts)
{
    if (parts < 1)
        parts = 1;
    if (parts > FANOUT_MAX)
        parts = FANOUT_MAX;
    fanout_task tasks[FANOUT_MAX];
    pthread_t threads[FANOUT_MAX];
    int started[FANOUT_MAX];
    /* the threads start with every signal blocked: a signal to the process (SIGTERM to the
     * daemon) goes to a thread that runs Python, never to these */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (int i = 1; i < parts; i++) {
        tasks[i] = (fanout_task){fn, job, i, parts};
        started[i] = pthread_create(&threads[i], NULL, fanout_run, &tasks[i]) == 0;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    fn(job, 0, parts);
    for (int i = 1; i < parts; i++) {
        if (started[i])
            pthread_join(threads[i], NULL);
        else
            fn(job, i, parts);
    }
}
