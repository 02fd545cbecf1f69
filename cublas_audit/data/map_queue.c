/* The map's chunks of problems queued on the GPU from a C thread (device.native_queue).

   Queued from Python, a problem of the BF16 grid cost the map's one host thread ~295 us (the
   five cuBLAS calls through their bindings, the quick check's two launches, C's poison, six
   events and the Python around them) while the GPU needed ~150 us for it; reading results back
   took that thread another ~130 us. Here a thread of its own makes exactly the same driver and
   cuBLAS calls, in the same order on the same stream, with the arguments Python prepared, while
   Python reads earlier chunks back. A chunk: its check indices copied up and its sums zeroed,
   the chunk's marker kernel (device.map_records), then for each problem the columns of its C that
   the check reads poisoned by a kernel (every byte 0xFF, a NaN in each storage; each problem has
   its own C in the chunk's region), the classic call `reps` times between `reps` + 1 events;
   then the chunk's check, one kernel for all its problems (device.check_chunk) adding each
   problem's sums into its slots; last the sums copied down and the chunk's end event recorded.

   A problem whose call or launch fails gets the case-end marker kernel after what it queued (its
   records end there, as map_records.close_case does from Python), and its status says which
   library refused what: the map records it and goes on. The thread tells the heuristic warmer
   (data/heuristic_warm.c) how far the map has queued, as the Python engine did. */

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "native.h"

typedef struct {
    /* the classic call (device.launchers.ClassicCall), every field 64 bits wide */
    int64_t routine, transa, transb, m, n, k, lda, ldb, ldc, batch, data_type, compute_type;
    int64_t stride_a, stride_b, stride_c, a, b, c;
    double beta;
    /* C's checked columns, poisoned first: C's value size, the problem's picked entries and
       columns (device addresses of int32 values), how many columns an entry, the poison's blocks
       (one a column of each entry) */
    int64_t item, entries, columns, n_columns, poison_blocks;
} queued_case;

enum { OK = 0, REFUSED_BY_CUBLAS = 1, REFUSED_BY_CUDA = 2 };
enum { CHECK_ROWS = 128, POISON_THREADS = 256 }; /* device.quick_check's, device.check_chunk's */
enum { CHUNK_CHECK = 0, CASE_END = 1, CHUNK_MARKER = 2, POISON = 3 }; /* kernels[] */

static warm_call call_of(const queued_case *q) {
    warm_call w = {(int32_t)q->routine, (int32_t)q->transa, (int32_t)q->transb, (int32_t)q->m,
                   (int32_t)q->n, (int32_t)q->k, (int32_t)q->lda, (int32_t)q->ldb,
                   (int32_t)q->ldc, (int32_t)q->batch, (int32_t)q->data_type,
                   (int32_t)q->compute_type, q->stride_a, q->stride_b, q->stride_c,
                   (uint64_t)q->a, (uint64_t)q->b, (uint64_t)q->c, (float)q->beta, 0};
    return w;
}

/* C's checked columns poisoned before the problem's calls (a kernel: it opens the problem's CUPTI
   records). */
static int poison(const queued_case *q, void *stream, void *const *kernels) {
    void *c = (void *)q->c, *entries = (void *)q->entries, *columns = (void *)q->columns;
    long long m = q->m, n = q->n, item = q->item;
    int n_columns = (int)q->n_columns;
    void *args[] = {&c, &m, &n, &item, &entries, &columns, &n_columns};
    return api.launch_kernel(kernels[POISON], (unsigned)q->poison_blocks, 1, 1, POISON_THREADS,
                             1, 1, 0, stream, args, 0);
}

/* One problem: poison, the timed calls between events. 0, or the refusal (*where). */
static int queue_one(const queued_case *q, void *handle, void *stream, int64_t reps,
                     void *const *events, void *const *kernels, int *where) {
    warm_call w = call_of(q);
    *where = REFUSED_BY_CUDA;
    int status = poison(q, stream, kernels);
    if (!status) status = api.event_record(events[0], stream);
    for (int64_t rep = 0; rep < reps && !status; rep++) {
        status = native_call(handle, &w);
        if (status) {
            *where = REFUSED_BY_CUBLAS;
            break;
        }
        status = api.event_record(events[rep + 1], stream);
    }
    return status;
}

typedef struct {
    const queued_case *cases;
    int64_t count;
    void *const *events; /* count * (reps + 1) */
    int32_t *status;     /* 2 * count: where each problem was refused (0 nowhere) and why */
    uint64_t indices;    /* the check's entries and columns: device copy, pinned host values */
    const void *host_indices;
    int64_t indices_bytes;
    uint64_t sums; /* the check's sums: zeroed here, copied into pinned host memory at the end */
    void *host_sums;
    int64_t sums_bytes;
    void *check_params;   /* the chunk check's parameter (device.check_chunk.params_dtype) */
    int64_t check_blocks; /* and its blocks */
    int64_t marker_threads; /* the chunk marker's block size; 0: no marker (nothing traced) */
    void *end;              /* recorded after the chunk */
    int64_t warm_progress;  /* the heuristic warmer's index of the chunk's first call; -1 none */
    int64_t setup_status;   /* written by the thread: the driver's status of the chunk's own work */
} queued_chunk;

void warm_progress(int64_t queued); /* data/heuristic_warm.c */

enum { RING = 256 };
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static queued_chunk *ring[RING];
static int64_t submitted, finished; /* chunks handed over, and queued on the GPU */
static int stopping, warming;
static int working; /* the thread has taken chunk `finished` and is queueing it */
static pthread_t thread;
static void *context, *blas, *stream, *kernels[4]; /* chunk check, case end, marker, poison */
static int64_t reps;
static int64_t busy_ns; /* the thread's time queueing chunks (not waiting for them) */

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void queue_cases(const queued_chunk *chunk) {
    for (int64_t i = 0; i < chunk->count; i++) {
        int where = OK;
        int refused = queue_one(&chunk->cases[i], blas, stream, reps,
                                chunk->events + i * (reps + 1), kernels, &where);
        chunk->status[2 * i] = refused ? where : OK;
        chunk->status[2 * i + 1] = refused;
        if (refused) /* its records end here */
            api.launch_kernel(kernels[CASE_END], 1, 1, 1, 1, 1, 1, 0, stream, 0, 0);
    }
}

/* A chunk's own work around its problems; 0, or the first status that refused it. */
static int queue_chunk(queued_chunk *chunk) {
    int status = api.blas_set_stream(blas, stream);
    if (!status) status = api.blas_set_pointer_mode(blas, 0 /* host */);
    if (!status) status = api.blas_set_math_mode(blas, 0 /* default */);
    if (!status) status = api.copy_up(chunk->indices, chunk->host_indices,
                                  (size_t)chunk->indices_bytes, stream);
    if (!status) status = api.memset_d8(chunk->sums, 0, (size_t)chunk->sums_bytes, stream);
    if (!status && chunk->marker_threads > 0)
        status = api.launch_kernel(kernels[CHUNK_MARKER], 1, 1, 1, (unsigned)chunk->marker_threads,
                                   1, 1, 0, stream, 0, 0);
    if (status) return status;
    if (warming && chunk->warm_progress >= 0) warm_progress(chunk->warm_progress);
    queue_cases(chunk);
    void *args[] = {chunk->check_params}; /* its bytes: the driver copies them at the launch */
    status = api.launch_kernel(kernels[CHUNK_CHECK], (unsigned)chunk->check_blocks, 1, 1,
                               CHECK_ROWS, 1, 1, 0, stream, args, 0);
    if (!status)
        status = api.copy_down(chunk->host_sums, chunk->sums, (size_t)chunk->sums_bytes, stream);
    if (!status) status = api.event_record(chunk->end, stream);
    return status;
}

static void *serve(void *unused) {
    (void)unused;
    int status = api.ctx_set_current(context);
    for (;;) {
        pthread_mutex_lock(&lock);
        while (!stopping && finished >= submitted) pthread_cond_wait(&changed, &lock);
        if (finished >= submitted) { /* stopping, and nothing left */
            pthread_mutex_unlock(&lock);
            break;
        }
        queued_chunk *chunk = ring[finished % RING];
        working = 1;
        pthread_mutex_unlock(&lock);
        int64_t began = now_ns();
        chunk->setup_status = status ? status : queue_chunk(chunk);
        int64_t spent = now_ns() - began;
        pthread_mutex_lock(&lock);
        busy_ns += spent;
        finished++;
        working = 0;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

/* Starts the thread on `ctx` with cuBLAS's `handle` (the map's: set here to `stream`, host
   pointer mode and default math, as the launchers set it), `calls` calls a problem and
   `functions`: the chunk's check, the case-end and chunk markers, the poison. `warm`: tell the
   heuristic warmer the progress. 0: started (native_resolve must have found the entry points). */
int map_queue_start(void *ctx, void *handle, void *on_stream, int64_t calls,
                    void *const *functions, int warm) {
    if (!api.launch_kernel) return 1; /* native_resolve first */
    context = ctx;
    blas = handle;
    stream = on_stream;
    reps = calls;
    for (int i = 0; i < 4; i++) kernels[i] = functions[i];
    warming = warm;
    submitted = finished = busy_ns = 0;
    stopping = working = 0;
    return pthread_create(&thread, NULL, serve, NULL) ? 4 : 0;
}

/* Hands a chunk over (kept alive by the caller until map_queue_finished passes it). 0: taken;
   1: RING chunks are already waiting. */
int map_queue_submit(queued_chunk *chunk) {
    pthread_mutex_lock(&lock);
    int full = submitted - finished >= RING;
    if (!full) {
        ring[submitted % RING] = chunk;
        submitted++;
        pthread_cond_broadcast(&changed);
    }
    pthread_mutex_unlock(&lock);
    return full;
}

/* Chunks queued on the GPU so far (in the order handed over). */
int64_t map_queue_finished(void) {
    pthread_mutex_lock(&lock);
    int64_t done = finished;
    pthread_mutex_unlock(&lock);
    return done;
}

/* Seconds the thread has spent queueing chunks so far. */
double map_queue_busy_seconds(void) {
    pthread_mutex_lock(&lock);
    double spent = (double)busy_ns / 1e9;
    pthread_mutex_unlock(&lock);
    return spent;
}

/* Waits at most `ms` milliseconds for every chunk handed over to be queued on the GPU (the caller
   loops, so that Ctrl-C reaches Python between waits). 1: all queued; 0: not yet. */
int map_queue_wait_ms(int64_t ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&lock);
    while (finished < submitted)
        if (pthread_cond_timedwait(&changed, &lock, &until)) break;
    int done = finished >= submitted;
    pthread_mutex_unlock(&lock);
    return done;
}

/* Stops and joins the thread: after queueing what was handed over, or (`abandon`: the map was
   interrupted) after the chunk it is queueing, the chunks not begun left unqueued. */
void map_queue_stop(int abandon) {
    pthread_mutex_lock(&lock);
    if (abandon) submitted = finished + working; /* the chunk begun is finished, no other */
    stopping = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    pthread_join(thread, NULL);
}

/* The sizes of a problem's and a chunk's records as compiled here (Python's must match). */
int64_t map_queued_case_size(void) { return (int64_t)sizeof(queued_case); }
int64_t map_queued_chunk_size(void) { return (int64_t)sizeof(queued_chunk); }
