/* The entry points data/native.h declares, and one classic cuBLAS call made from its record. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "native.h"

struct native_api api;

int native_resolve(const char *cublas_path) {
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
    FIND(cuda, event_record, "cuEventRecord")
    FIND(cuda, memset_d8, "cuMemsetD8Async")
    FIND(cuda, copy_up, "cuMemcpyHtoDAsync_v2")
    FIND(cuda, copy_down, "cuMemcpyDtoHAsync_v2")
    FIND(cuda, launch_kernel, "cuLaunchKernel")
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

int native_call(void *handle, const warm_call *w) {
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
