/* Worker threads for parallel kernels, driven as runtime/vm.py drives them.
 *
 * Bundles carry the hand-off code (packager/codegen/threadpool.py: mlcpack_pool_worker / _run /
 * _join / _steps): workers spin in that code waiting for tasks; one that has been idle for
 * SPIN_ITERATIONS parks, here on its semaphore, and a post that finds it parked returns it in
 * a mask for the caller to wake. Task 0 of every job runs on the calling thread. Bundles without
 * that code get a plain mutex/condition-variable pool with the same task split (task 0 here,
 * task w + 1 on worker w), as vm._LockPool. */

#include <sched.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Idle spin-loop hints before a worker parks (~50 us on Zen 4), as runtime/vm.py's. 20000 (~0.5
 * ms) spun while the caller was descheduled on a shared host (sched_autogroup: a session's threads
 * share one CPU share, so the spin came out of the caller's): mlcrun bench --threads 2, load ~15
 * on 2 vCPUs, AVX2 host, p50 / CPU per run, 20000 -> 2000: ResNet-18 170 -> 116 ms / 54 -> 42 ms,
 * ResNet-50 390 -> 327 ms / 133 -> 110 ms (bench/c_pool_spin.py). */
#define SPIN_ITERATIONS 2000
/* Parallel kernels of at least FINE_TASK_MACS multiply-adds are posted as several tasks per
 * thread, at most MAX_TASKS in all, when the bundle's hand-off has home ranges (runtime/vm.py's
 * FINE_TASK_MACS says why). */
#define FINE_TASK_MACS (1 << 25)
#define MAX_TASKS 8
#define JOIN_SPINS 4000
#define LATE (1ull << 63)
#define LINE 8

typedef int64_t (*worker_fn)(uint64_t *, int64_t, int64_t);
typedef uint64_t (*run_fn)(uint64_t *, int64_t, void *, void *, int64_t, int64_t);
typedef int64_t (*join_fn)(uint64_t *, int64_t);
typedef int64_t (*steps_fn)(uint64_t *, int64_t, uint64_t *, int64_t, int64_t, int64_t,
                            uint64_t *);

struct mlc_threads {
    int n;
    int spins;
    int has_code;
    mlc_pool_code code;
    void *raw;
    uint64_t *slots;
    pthread_t *tids;
    sem_t *sems;
    int started;
    /* the fallback pool */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int stop, finished;
    mlc_kernel_fn fn;
    void **args;
    int64_t ntasks;
};

typedef struct {
    mlc_threads *t;
    int w;
} worker_arg;

static int usable_cpus(void)
{
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int64_t mlc_task_count(int threads, int64_t macs, int ranges)
{
    if (!ranges || threads < 2 || macs < FINE_TASK_MACS)
        return threads;
    int64_t n = MAX_TASKS / threads * threads;
    return n > threads ? n : threads;
}

static void *spin_worker(void *p)
{
    worker_arg *a = p;
    mlc_threads *t = a->t;
    int w = a->w;
    worker_fn worker = (worker_fn)a->t->code.worker;
    free(a);
    while (worker(t->slots, w, t->spins))
        while (sem_wait(&t->sems[w]) != 0) {
        }
    return NULL;
}

static void *lock_worker(void *p)
{
    worker_arg *a = p;
    mlc_threads *t = a->t;
    int w = a->w;
    free(a);
    uint64_t seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (t->gen == seen && !t->stop)
            pthread_cond_wait(&t->go, &t->mu);
        if (t->stop)
            break;
        seen = t->gen;
        mlc_kernel_fn fn = t->fn;
        void **args = t->args;
        int64_t ntasks = t->ntasks;
        pthread_mutex_unlock(&t->mu);
        if (w + 1 < ntasks)
            fn(args, w + 1, ntasks);
        pthread_mutex_lock(&t->mu);
        if (++t->finished == t->n)
            pthread_cond_signal(&t->done);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void wake(mlc_threads *t, uint64_t mask)
{
    for (int w = 0; w < t->n; w++)
        if (mask >> w & 1)
            sem_post(&t->sems[w]);
}

static void finish(mlc_threads *t, uint64_t status)
{
    if (status != LATE)
        wake(t, status);
    join_fn join = (join_fn)t->code.join;
    while (join(t->slots, JOIN_SPINS))
        sched_yield();
}

mlc_status mlc_threads_start(int nworkers, const mlc_pool_code *code, mlc_threads **out,
                             mlc_error *err)
{
    *out = NULL;
    if (nworkers < 1 || nworkers > MLC_MAX_THREADS - 1)
        return mlc_fail(err, MLC_ERR_USAGE, "threads must be 1 to %d", MLC_MAX_THREADS);
    mlc_threads *t = calloc(1, sizeof *t);
    if (!t)
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    t->n = nworkers;
    t->has_code = code != NULL;
    if (code)
        t->code = *code;
    t->spins = nworkers + 1 <= usable_cpus() ? SPIN_ITERATIONS : 0;
    t->raw = calloc((size_t)(nworkers + 2) * LINE, sizeof(uint64_t));
    t->tids = calloc((size_t)nworkers, sizeof(pthread_t));
    t->sems = calloc((size_t)nworkers, sizeof(sem_t));
    if (!t->raw || !t->tids || !t->sems) {
        mlc_threads_stop(t);
        return mlc_fail(err, MLC_ERR_INTERNAL, "out of memory");
    }
    t->slots = (uint64_t *)(((uintptr_t)t->raw + 63) & ~(uintptr_t)63);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    for (int w = 0; w < nworkers; w++)
        sem_init(&t->sems[w], 0, 0);
    for (int w = 0; w < nworkers; w++) {
        worker_arg *a = malloc(sizeof *a);
        if (a) {
            a->t = t;
            a->w = w;
        }
        if (!a || pthread_create(&t->tids[w], NULL, t->has_code ? spin_worker : lock_worker,
                                 a) != 0) {
            free(a);
            mlc_threads_stop(t);
            return mlc_fail(err, MLC_ERR_INTERNAL, "cannot start worker thread %d", w + 1);
        }
        t->started++;
    }
    *out = t;
    return MLC_OK;
}

void mlc_threads_stop(mlc_threads *t)
{
    if (!t)
        return;
    if (t->started) {
        if (t->has_code) {
            run_fn run = (run_fn)t->code.run;
            wake(t, run(t->slots, t->n, NULL, NULL, 0, 0));
        } else {
            pthread_mutex_lock(&t->mu);
            t->stop = 1;
            pthread_cond_broadcast(&t->go);
            pthread_mutex_unlock(&t->mu);
        }
        for (int w = 0; w < t->started; w++)
            pthread_join(t->tids[w], NULL);
    }
    if (t->sems)
        for (int w = 0; w < t->n; w++)
            sem_destroy(&t->sems[w]);
    if (t->raw) {
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->go);
        pthread_cond_destroy(&t->done);
    }
    free(t->raw);
    free(t->tids);
    free(t->sems);
    free(t);
}

void mlc_threads_run(mlc_threads *t, mlc_kernel_fn fn, void **args, int64_t ntasks)
{
    if (t->has_code) {
        run_fn run = (run_fn)t->code.run;
        uint64_t status = run(t->slots, t->n, (void *)fn, args, ntasks, JOIN_SPINS);
        if (status)
            finish(t, status);
        return;
    }
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->args = args;
    t->ntasks = ntasks;
    t->finished = 0;
    t->gen++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    fn(args, 0, ntasks);
    pthread_mutex_lock(&t->mu);
    while (t->finished < t->n)
        pthread_cond_wait(&t->done, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

void mlc_threads_steps(mlc_threads *t, const mlc_pool_code *code, uint64_t *table, int64_t start,
                       int64_t end)
{
    steps_fn steps = (steps_fn)code->steps;
    uint64_t status = 0;
    uint64_t *pool = t ? t->slots : NULL;
    int64_t n = t ? t->n : 0;
    while (start < end) {
        int64_t at = steps(pool, n, table, start, end, JOIN_SPINS, &status);
        if (at >= end)
            break;
        finish(t, status);   /* workers to wake, or a late one to wait for */
        start = at + 1;
    }
}
