/* A stand-in for libcuda and libcublas, for testing data/heuristic_warm.c's workers without a
   GPU: the entry points it looks up, each recording what it was called with. Built with the
   soname libcuda.so.1, so that the workers' dlopen("libcuda.so.1", RTLD_NOLOAD) finds it. */
#include <pthread.h>
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

static int record(int routine, int m, const float *beta) {
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
