/* What data/heuristic_warm.c and data/map_queue.c share: the CUDA driver and cuBLAS entry points
   they use, looked up in the libraries the process has already loaded (no CUDA header is needed,
   and these are the very cuBLAS and driver the map's Python side uses), and one classic cuBLAS
   call as the launcher makes it (device.launchers.ClassicCall, routine numbered as ROUTINES). */
#ifndef CUBLAS_AUDIT_NATIVE_H
#define CUBLAS_AUDIT_NATIVE_H

#include <stddef.h>
#include <stdint.h>

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
typedef int (*fn_memset)(uint64_t, unsigned char, size_t, void *);
typedef int (*fn_copy_up)(uint64_t, const void *, size_t, void *);
typedef int (*fn_copy_down)(void *, uint64_t, size_t, void *);
typedef int (*fn_launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
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

struct native_api {
    fn_i_p ctx_set_current;
    fn_i_pu stream_create;
    fn_i_pi begin_capture;
    fn_i_pp end_capture;
    fn_i_p graph_destroy;
    fn_i_p stream_destroy;
    fn_i_pp event_record;
    fn_memset memset_d8;
    fn_copy_up copy_up;
    fn_copy_down copy_down;
    fn_launch launch_kernel;
    fn_i_p blas_create;
    fn_i_p blas_destroy;
    fn_i_pp blas_set_stream;
    fn_i_pi blas_set_pointer_mode;
    fn_i_pi blas_set_math_mode;
    fn_sgemm sgemm;
    fn_sgemm_strided sgemm_strided;
    fn_gemm_ex gemm_ex;
    fn_gemm_strided_ex gemm_strided_ex;
};

extern struct native_api api;

/* Finds every entry point in the loaded libcuda and `cublas_path`. 0: all found. */
int native_resolve(const char *cublas_path);

/* Makes `w` on `handle` (alpha 1, host pointer mode): cuBLAS's status. */
int native_call(void *handle, const warm_call *w);

#endif
