/* cuBLAS's dispatch heuristic run ahead of the map, on other host cores.

   A fresh GEMM shape's first cublasGemmEx spends ~140-800 us of host time choosing its kernel
   (and loading it); later calls of the shape find the choice in cuBLAS's process-wide heuristics
   cache (~11 us). The map queues 262,144 fresh shapes one after the other on one host thread, so
   that choice was most of its time. Here worker threads make the very same calls first, each
   inside a stream capture on a stream of their own: cuBLAS chooses and loads the kernel and
   records the launch into a graph, which is then thrown away, so no kernel runs and the GPU's
   timed work is not touched. The map's own call then finds the choice cached.

   No CUDA header is needed: the few entry points are looked up in the libraries the process has
   already loaded (the caller names its libcublas), so these are the same cuBLAS and its cache.
   The workers never run ahead of the map by more than `window` calls (the cache is an LRU of
   limited size), and a call they have not reached yet is simply chosen by the map as before. */

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

/* Everything below is guarded by `lock` but the counters (atomics); a worker with nothing to do
   sleeps on `more` (no polling: four shards of a fleet on one host each have their workers). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t more = PTHREAD_COND_INITIALIZER;
static warm_call *calls; /* submitted calls, in the order the map queues them */
static int64_t capacity;
static int64_t submitted; /* calls[0:submitted] are valid */
static int64_t progress;  /* the map has queued calls[0:progress] */
static int64_t next_call; /* the next call a worker takes */
static int64_t warmed, failed, late;
static int stopping;
static int64_t window = 1024;
static void *context;
static pthread_t *workers;
static int worker_count;

static void *work(void *unused) {
    (void)unused;
    void *handle = NULL, *stream = NULL;
    if (api.ctx_set_current(context) || api.stream_create(&stream, 1 /* non-blocking */) ||
        api.blas_create(&handle) || api.blas_set_stream(handle, stream) ||
        api.blas_set_pointer_mode(handle, 0 /* host */) ||
        api.blas_set_math_mode(handle, 0 /* default */)) {
        __atomic_add_fetch(&failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&lock);
        while (!stopping && (next_call >= submitted || next_call >= progress + window))
            pthread_cond_wait(&more, &lock);
        if (stopping) {
            pthread_mutex_unlock(&lock);
            break;
        }
        int64_t index = next_call++;
        warm_call w = calls[index];
        int behind = index < progress; /* the map got there first: its own call chose */
        pthread_mutex_unlock(&lock);
        if (w.routine < 0) continue;
        if (behind) {
            __atomic_add_fetch(&late, 1, __ATOMIC_RELAXED);
            continue;
        }
        void *graph = NULL;
        if (api.begin_capture(stream, 2 /* relaxed */)) {
            __atomic_add_fetch(&failed, 1, __ATOMIC_RELAXED);
            continue;
        }
        int status = native_call(handle, &w);
        api.end_capture(stream, &graph);
        if (graph) api.graph_destroy(graph);
        __atomic_add_fetch(status ? &failed : &warmed, 1, __ATOMIC_RELAXED);
    }
    api.blas_destroy(handle);
    api.stream_destroy(stream);
    return NULL;
}

/* Starts `threads` workers on `ctx` (the map's CUcontext), cuBLAS from `cublas_path`. 0: started. */
int warm_start(const char *cublas_path, void *ctx, int threads, int64_t ahead) {
    int found = native_resolve(cublas_path);
    if (found) return found;
    submitted = progress = next_call = 0; /* a fresh start: the last map's calls are done */
    warmed = failed = late = 0;
    stopping = 0;
    context = ctx;
    window = ahead;
    worker_count = threads;
    workers = calloc((size_t)threads, sizeof(pthread_t));
    if (!workers) return 3;
    for (int i = 0; i < threads; i++)
        if (pthread_create(&workers[i], NULL, work, NULL)) return 4;
    return 0;
}

/* Appends `count` calls, in the order the map will queue them. 0: taken. */
int warm_submit(const warm_call *coming, int64_t count) {
    pthread_mutex_lock(&lock);
    if (submitted + count > capacity) {
        int64_t wanted = (submitted + count) * 2;
        warm_call *grown = realloc(calls, (size_t)wanted * sizeof(warm_call));
        if (!grown) {
            pthread_mutex_unlock(&lock);
            return 1;
        }
        calls = grown;
        capacity = wanted;
    }
    memcpy(calls + submitted, coming, (size_t)count * sizeof(warm_call));
    submitted += count;
    pthread_cond_broadcast(&more);
    pthread_mutex_unlock(&lock);
    return 0;
}

/* The map has queued the first `queued` calls submitted. */
void warm_progress(int64_t queued) {
    pthread_mutex_lock(&lock);
    progress = queued;
    pthread_cond_broadcast(&more);
    pthread_mutex_unlock(&lock);
}

/* Counts so far: warmed, failed, late (the map was first). */
void warm_counts(int64_t *out) {
    out[0] = __atomic_load_n(&warmed, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&failed, __ATOMIC_RELAXED);
    out[2] = __atomic_load_n(&late, __ATOMIC_RELAXED);
}

/* The size of one call as compiled here (the Python side's struct must match it). */
int64_t warm_call_size(void) { return (int64_t)sizeof(warm_call); }

/* Stops and joins the workers (their handles and streams destroyed). */
void warm_stop(void) {
    pthread_mutex_lock(&lock);
    stopping = 1;
    pthread_cond_broadcast(&more);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < worker_count; i++) pthread_join(workers[i], NULL);
    free(workers);
    workers = NULL;
    worker_count = 0;
}
