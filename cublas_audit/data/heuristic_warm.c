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

#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t routine; /* 0 Sgemm, 1 SgemmStridedBatched, 2 GemmEx, 3 GemmStridedBatchedEx, -1 none */
    int32_t transa, transb, m, n, k, lda, ldb, ldc, batch, data_type, compute_type;
    int64_t stride_a, stride_b, stride_c;
    uint64_t a, b, c;
    float beta;
    int32_t pad;
} warm_call;

typedef int (*fn_i_p)(void *);
typedef int (*fn_i_pi)(void *, int);
typedef int (*fn_i_pp)(void *, void *);
typedef int (*fn_i_pu)(void *, unsigned);
typedef int (*fn_sgemm)(void *, int, int, int, int, int, const float *, const void *, int,
                        const void *, int, const float *, void *, int);
typedef int (*fn_sgemm_strided)(void *, int, int, int, int, int, const float *, const void *, int,
                                long long, const void *, int, long long, const float *, void *,
                                int, long long, int);
typedef int (*fn_gemm_ex)(void *, int, int, int, int, int, const void *, const void *, int, int,
                          const void *, int, int, const void *, void *, int, int, int, int);
typedef int (*fn_gemm_strided_ex)(void *, int, int, int, int, int, const void *, const void *,
                                  int, int, long long, const void *, int, int, long long,
                                  const void *, void *, int, int, long long, int, int, int);

static struct {
    fn_i_p ctx_set_current;
    fn_i_pu stream_create;
    fn_i_pi begin_capture;
    fn_i_pp end_capture;
    fn_i_p graph_destroy;
    fn_i_p stream_destroy;
    fn_i_p blas_create;
    fn_i_p blas_destroy;
    fn_i_pp blas_set_stream;
    fn_i_pi blas_set_pointer_mode;
    fn_i_pi blas_set_math_mode;
    fn_sgemm sgemm;
    fn_sgemm_strided sgemm_strided;
    fn_gemm_ex gemm_ex;
    fn_gemm_strided_ex gemm_strided_ex;
} api;

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

static int resolve(const char *cublas_path) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *blas = dlopen(cublas_path, RTLD_NOW | RTLD_NOLOAD);
    if (!cuda || !blas) return 1;
#define FIND(lib, field, name) \
    if (!(*(void **)&api.field = dlsym(lib, name))) return 2;
    FIND(cuda, ctx_set_current, "cuCtxSetCurrent")
    FIND(cuda, stream_create, "cuStreamCreate")
    FIND(cuda, begin_capture, "cuStreamBeginCapture_v2")
    FIND(cuda, end_capture, "cuStreamEndCapture")
    FIND(cuda, graph_destroy, "cuGraphDestroy")
    FIND(cuda, stream_destroy, "cuStreamDestroy_v2")
    FIND(blas, blas_create, "cublasCreate_v2")
    FIND(blas, blas_destroy, "cublasDestroy_v2")
    FIND(blas, blas_set_stream, "cublasSetStream_v2")
    FIND(blas, blas_set_pointer_mode, "cublasSetPointerMode_v2")
    FIND(blas, blas_set_math_mode, "cublasSetMathMode")
    FIND(blas, sgemm, "cublasSgemm_v2")
    FIND(blas, sgemm_strided, "cublasSgemmStridedBatched")
    FIND(blas, gemm_ex, "cublasGemmEx")
    FIND(blas, gemm_strided_ex, "cublasGemmStridedBatchedEx")
#undef FIND
    return 0;
}

static int call(void *handle, const warm_call *w) {
    static const float one = 1.0f;
    switch (w->routine) {
    case 0:
        return api.sgemm(handle, w->transa, w->transb, w->m, w->n, w->k, &one, (void *)w->a,
                         w->lda, (void *)w->b, w->ldb, &w->beta, (void *)w->c, w->ldc);
    case 1:
        return api.sgemm_strided(handle, w->transa, w->transb, w->m, w->n, w->k, &one,
                                 (void *)w->a, w->lda, w->stride_a, (void *)w->b, w->ldb,
                                 w->stride_b, &w->beta, (void *)w->c, w->ldc, w->stride_c,
                                 w->batch);
    case 2:
        return api.gemm_ex(handle, w->transa, w->transb, w->m, w->n, w->k, &one, (void *)w->a,
                           w->data_type, w->lda, (void *)w->b, w->data_type, w->ldb, &w->beta,
                           (void *)w->c, w->data_type, w->ldc, w->compute_type, -1);
    case 3:
        return api.gemm_strided_ex(handle, w->transa, w->transb, w->m, w->n, w->k, &one,
                                   (void *)w->a, w->data_type, w->lda, w->stride_a, (void *)w->b,
                                   w->data_type, w->ldb, w->stride_b, &w->beta, (void *)w->c,
                                   w->data_type, w->ldc, w->stride_c, w->batch, w->compute_type,
                                   -1);
    }
    return 0;
}

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
        int status = call(handle, &w);
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
    int found = resolve(cublas_path);
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
