/* A stand-in for libcuda and libcublas, for testing the map's C parts (data/heuristic_warm.c's
   workers, data/map_queue.c's thread) without a GPU: the entry points they look up, each
   recording what it was called with. Built with the soname libcuda.so.1, so that their
   dlopen("libcuda.so.1", RTLD_NOLOAD) finds it. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int capturing;
static int64_t seen[4096][4]; /* routine, m, inside a capture, beta as an integer */
static int64_t count, outside, handles_live;

int cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
int cuStreamCreate(void **stream, unsigned flags) { (void)flags; *stream = (void *)1; return 0; }
int cuStreamBeginCapture_v2(void *stream, int mode) { (void)stream; (void)mode; capturing = 1; return 0; }
int cuStreamEndCapture(void *stream, void **graph) { (void)stream; capturing = 0; *graph = (void *)2; return 0; }
int cuGraphDestroy(void *graph) { (void)graph; return 0; }
int cuStreamDestroy_v2(void *stream) { (void)stream; return 0; }
int cublasCreate_v2(void **handle) {
    pthread_mutex_lock(&lock); handles_live++; pthread_mutex_unlock(&lock);
    *handle = (void *)3; return 0;
}
int cublasDestroy_v2(void *handle) {
    (void)handle; pthread_mutex_lock(&lock); handles_live--; pthread_mutex_unlock(&lock); return 0;
}
int cublasSetStream_v2(void *handle, void *stream) { (void)handle; (void)stream; return 0; }
int cublasSetPointerMode_v2(void *handle, int mode) { (void)handle; return mode; }
int cublasSetMathMode(void *handle, int mode) { (void)handle; return mode; }

/* Every stream operation in order: what, then four of its arguments. */
enum { MEMSET = 1, EVENT = 2, GEMM = 3, LAUNCH = 4, COPY_UP = 5, COPY_DOWN = 6, ARGS = 7 };
static int64_t ops[8192][5];
static int64_t op_count;
static void op(int64_t what, int64_t a, int64_t b, int64_t c, int64_t d) {
    pthread_mutex_lock(&lock);
    if (op_count < 8192) {
        ops[op_count][0] = what; ops[op_count][1] = a; ops[op_count][2] = b;
        ops[op_count][3] = c; ops[op_count][4] = d;
    }
    op_count++;
    pthread_mutex_unlock(&lock);
}
/* Event 0xB10C holds the recording thread until fake_release(): a GPU whose launch queue is full */
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released_cond = PTHREAD_COND_INITIALIZER;
static int released;
void fake_release(void) {
    pthread_mutex_lock(&hold_lock); released = 1; pthread_cond_broadcast(&released_cond);
    pthread_mutex_unlock(&hold_lock);
}
int cuEventRecord(void *event, void *stream) {
    (void)stream;
    op(EVENT, (int64_t)event, 0, 0, 0);
    if ((int64_t)event == 0xB10C) {
        pthread_mutex_lock(&hold_lock);
        while (!released) pthread_cond_wait(&released_cond, &hold_lock);
        pthread_mutex_unlock(&hold_lock);
    }
    return 0;
}
int cuMemsetD8Async(uint64_t dst, unsigned char value, size_t bytes, void *stream) {
    (void)stream; op(MEMSET, (int64_t)dst, value, (int64_t)bytes, 0); return 0;
}
int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t bytes, void *stream) {
    (void)src; (void)stream; op(COPY_UP, (int64_t)dst, (int64_t)bytes, 0, 0); return 0;
}
int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t bytes, void *stream) {
    (void)dst; (void)stream; op(COPY_DOWN, (int64_t)src, (int64_t)bytes, 0, 0); return 0;
}
/* Function 0x100 stands for the chunk's check: its one parameter is the chunk's jobs
   (device.check_chunk.params_dtype: 128 jobs of 24 int64 fields, then their count), of which the
   values a misplaced field would move are recorded (its grid, the count, the first job's m;
   then as ARGS: the second job's first block, the third's scratch and sums). Function 0x500
   stands for the poison: its grid, C and m; then as ARGS: C's value size, the picked entries'
   and columns' addresses. Any other: its grid and block size. */
enum { JOB_WORDS = 24, CHUNK_JOBS = 128 };
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    (void)by; (void)bz; (void)shared; (void)stream; (void)extra;
    int64_t function = (int64_t)f;
    if (function == 0x100) {
        const int64_t *jobs = (const int64_t *)params[0];
        op(LAUNCH, function, gx, jobs[JOB_WORDS * CHUNK_JOBS], jobs[5]);
        op(ARGS, function, jobs[JOB_WORDS + 21], jobs[2 * JOB_WORDS + 22],
           jobs[2 * JOB_WORDS + 23]);
    }
    else if (function == 0x500) {
        op(LAUNCH, function, gx, (int64_t)*(void **)params[0], *(long long *)params[1]);
        op(ARGS, function, *(long long *)params[3], (int64_t)*(void **)params[4],
           (int64_t)*(void **)params[5]);
    }
    else
        op(LAUNCH, function, gx * 1000000 + gy * 1000 + gz, bx, 0);
    return 0;
}

int64_t fake_ops(int64_t *out, int64_t most) {
    pthread_mutex_lock(&lock);
    for (int64_t i = 0; i < op_count && i < most; i++)
        for (int j = 0; j < 5; j++) out[5 * i + j] = ops[i][j];
    int64_t done = op_count;
    pthread_mutex_unlock(&lock);
    return done;
}

static int record(int routine, int m, const float *beta) {
    op(GEMM, routine, m, 0, 0);
    pthread_mutex_lock(&lock);
    if (count < 4096) {
        seen[count][0] = routine; seen[count][1] = m; seen[count][2] = capturing;
        seen[count][3] = (int64_t)(*beta * 1000);
    }
    count++;
    if (!capturing) outside++;
    pthread_mutex_unlock(&lock);
    return m == 13 ? 7 : 0; /* m = 13: cuBLAS refuses the call */
}
int cublasSgemm_v2(void *h, int ta, int tb, int m, int n, int k, const float *alpha, const void *a,
                   int lda, const void *b, int ldb, const float *beta, void *c, int ldc) {
    (void)h; (void)ta; (void)tb; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)b;
    (void)ldb; (void)c; (void)ldc;
    return record(0, m, beta);
}
int cublasSgemmStridedBatched(void *h, int ta, int tb, int m, int n, int k, const float *alpha,
                              const void *a, int lda, long long sa, const void *b, int ldb,
                              long long sb, const float *beta, void *c, int ldc, long long sc,
                              int batch) {
    (void)h; (void)ta; (void)tb; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)sa;
    (void)b; (void)ldb; (void)sb; (void)c; (void)ldc; (void)sc; (void)batch;
    return record(1, m, beta);
}
int cublasGemmEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a,
                 int at, int lda, const void *b, int bt, int ldb, const void *beta, void *c, int ct,
                 int ldc, int compute, int algo) {
    (void)h; (void)ta; (void)tb; (void)n; (void)k; (void)alpha; (void)a; (void)at; (void)lda;
    (void)b; (void)bt; (void)ldb; (void)c; (void)ct; (void)ldc; (void)compute; (void)algo;
    return record(2, m, (const float *)beta);
}
int cublasGemmStridedBatchedEx(void *h, int ta, int tb, int m, int n, int k, const void *alpha,
                               const void *a, int at, int lda, long long sa, const void *b, int bt,
                               int ldb, long long sb, const void *beta, void *c, int ct, int ldc,
                               long long sc, int batch, int compute, int algo) {
    (void)h; (void)ta; (void)tb; (void)n; (void)k; (void)alpha; (void)a; (void)at; (void)lda;
    (void)sa; (void)b; (void)bt; (void)ldb; (void)sb; (void)c; (void)ct; (void)ldc; (void)sc;
    (void)batch; (void)compute; (void)algo;
    return record(3, m, (const float *)beta);
}

/* What was called: count, calls made outside a capture, handles not destroyed; then the calls. */
int64_t fake_seen(int64_t *out, int64_t most) {
    pthread_mutex_lock(&lock);
    out[0] = count; out[1] = outside; out[2] = handles_live;
    for (int64_t i = 0; i < count && i < most; i++)
        for (int j = 0; j < 4; j++) out[3 + 4 * i + j] = seen[i][j];
    pthread_mutex_unlock(&lock);
    return count;
}
