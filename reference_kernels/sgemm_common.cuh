// Shared core of the reference FP32 SGEMM kernels: tile geometry, the register-tile FMA loop over
// one shared-memory stage, CTA swizzle and the guarded epilogue.
//
// Problem: column-major, cuBLAS "nn", C = A x B for gridDim.z independent matrices
//   A: M x K, lda = M, stride M*K      B: K x N, ldb = K, stride K*N      C: M x N, ldc = M
// Every size and tile parameter is a compile-time constant (reference.py writes the #defines), so
// loop bounds fold and the bounds checks of aligned sizes vanish. The batch count is not: it is
// the grid's z extent, so one compiled module serves every batch count of a problem.
//
// Shared-memory stage layout (what a TMA box of a column-major matrix lands as, unchanged):
//   As[BK][BM]  m contiguous: one float4 holds 4 rows of A at one k
//   Bs[BN][BK]  k contiguous: a column of B's tile, one k after the other
// so a thread reads A as float4s along m and B one k at a time (ptxas merges consecutive k into
// vector loads), and no transpose is needed.
//
// Thread tile: TM (m) x TN (n) accumulators. A warp is 8 lanes along m by 4 lanes along n; a lane's
// m rows are 4-wide groups 32 rows apart (the 8 lanes of a quarter-warp read 128 contiguous bytes
// of As: conflict-free) and its n columns are TN consecutive ones (a quarter-warp shares one
// column of Bs: a broadcast).
#pragma once
// The epilogue keeps a scalar path that some specializations never reach; that is intended.
#pragma nv_diag_suppress 128

#ifndef M
#define M 4096
#endif
#ifndef N
#define N 4096
#endif
#ifndef K
#define K 4096
#endif
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 16
#endif
#ifndef TM
#define TM 16
#endif
#ifndef TN
#define TN 8
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef SPLITK
#define SPLITK 1
#endif
#ifndef SWIZZLE
#define SWIZZLE 8
#endif

#define WARP_M (8 * TM)
#define WARP_N (4 * TN)
#define WARPS_M (BM / WARP_M)
#define WARPS_N (BN / WARP_N)
#define CONSUMER_WARPS (WARPS_M * WARPS_N)
#define CONSUMER_THREADS (32 * CONSUMER_WARPS)
#define TILES_M ((M + BM - 1) / BM)
#define TILES_N ((N + BN - 1) / BN)
#define K_TILES ((K + BK - 1) / BK)
#define K_TILES_PER_SPLIT ((K_TILES + SPLITK - 1) / SPLITK)
#define A_STAGE_FLOATS (BM * BK)
#define B_STAGE_FLOATS (BN * BK)
#define STAGE_BYTES (4 * (A_STAGE_FLOATS + B_STAGE_FLOATS))

static_assert(TM % 4 == 0 && BK % 4 == 0,
              "float4 reads of A need TM % 4 == 0; 16-byte copies of B need BK % 4 == 0");
static_assert(BM % WARP_M == 0 && BN % WARP_N == 0, "the CTA tile must hold whole warp tiles");
static_assert(SPLITK >= 1 && SWIZZLE >= 1, "SPLITK and SWIZZLE are counts");

namespace ref {

// The CTA's output tile. Consecutive CTAs walk SWIZZLE m-tiles down one n-tile column before moving
// right, so the CTAs resident at one time share B columns and A rows in L2.
__device__ __forceinline__ void tile_origin(int& tile_m, int& tile_n) {
    constexpr int group_ctas = SWIZZLE * TILES_N;
    const int pid = blockIdx.x;
    const int first_m = (pid / group_ctas) * SWIZZLE;
    const int rows = min(TILES_M - first_m, SWIZZLE);
    const int in_group = pid % group_ctas;
    tile_m = (first_m + in_group % rows) * BM;
    tile_n = (in_group / rows) * BN;
}

// The K tiles of this CTA's split: [first, first + count).
__device__ __forceinline__ void k_range(int& first, int& count) {
    first = blockIdx.y * K_TILES_PER_SPLIT;
    count = max(0, min(K_TILES_PER_SPLIT, K_TILES - first));
}

// The thread's TM rows of As at depth k: TM/4 float4s, 32 rows apart.
__device__ __forceinline__ void load_a(const float* __restrict__ as, int k, int m0, float (&a)[TM]) {
#pragma unroll
    for (int q = 0; q < TM / 4; ++q) {
        const float4 v = *reinterpret_cast<const float4*>(as + k * BM + m0 + 32 * q);
        a[4 * q + 0] = v.x;
        a[4 * q + 1] = v.y;
        a[4 * q + 2] = v.z;
        a[4 * q + 3] = v.w;
    }
}

// The thread's TN columns of Bs at depth k: TN scalars, BK apart (Bs is k contiguous).
__device__ __forceinline__ void load_b(const float* __restrict__ bs, int k, int n0, float (&b)[TN]) {
#pragma unroll
    for (int j = 0; j < TN; ++j) b[j] = bs[(n0 + j) * BK + k];
}

// acc += As^T-slice x Bs-slice for one stage, one k at a time, the next k's fragments loaded
// while this k's FMAs run. All loops unroll, so every register index is a constant and acc stays
// in registers. Written this way (scalar B, explicit one-k-ahead fragments) rather than as
// float4s of B covering four k, ptxas emits the same loads (it merges consecutive k of B into
// LDS.128) but schedules the FMAs better: on the H100 the stage runs 3-4 % faster. Rolled loops
// (a smaller body for the instruction cache) measured 10-25 % slower: the full unroll stays.
__device__ __forceinline__ void fma_stage(const float* __restrict__ as, const float* __restrict__ bs,
                                          int m0, int n0, float (&acc)[TM][TN]) {
    float a[2][TM], b[2][TN];
    load_a(as, 0, m0, a[0]);
    load_b(bs, 0, n0, b[0]);
#pragma unroll
    for (int k = 0; k < BK; ++k) {
        if (k + 1 < BK) {
            load_a(as, k + 1, m0, a[(k + 1) % 2]);
            load_b(bs, k + 1, n0, b[(k + 1) % 2]);
        }
#pragma unroll
        for (int j = 0; j < TN; ++j)
#pragma unroll
            for (int i = 0; i < TM; ++i) acc[i][j] = fmaf(a[k % 2][i], b[k % 2][j], acc[i][j]);
    }
}

// Writes the thread's TM x TN block of C. Checks vanish when the tile divides the size; float4
// stores need 16-byte aligned columns (M % 4 == 0). Split-K partial sums are added atomically
// into a C the launcher zeroed.
__device__ __forceinline__ void store_tile(float* __restrict__ c, int tile_m, int tile_n, int m0,
                                           int n0, const float (&acc)[TM][TN]) {
    constexpr bool full_m = M % BM == 0;
    constexpr bool full_n = N % BN == 0;
    constexpr bool vec4 = M % 4 == 0 && SPLITK == 1;
    float* batch_c = c + static_cast<size_t>(blockIdx.z) * M * N;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
        const int n = tile_n + n0 + j;
        if (!full_n && n >= N) continue;
        float* col = batch_c + static_cast<size_t>(n) * M;
#pragma unroll
        for (int q = 0; q < TM / 4; ++q) {
            const int m = tile_m + m0 + 32 * q;
            if (vec4 && (full_m || m + 3 < M)) {
                *reinterpret_cast<float4*>(col + m) =
                    make_float4(acc[4 * q][j], acc[4 * q + 1][j], acc[4 * q + 2][j], acc[4 * q + 3][j]);
                continue;
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                if (!full_m && m + r >= M) continue;
                if (SPLITK > 1)
                    atomicAdd(col + m + r, acc[4 * q + r][j]);
                else
                    col[m + r] = acc[4 * q + r][j];
            }
        }
    }
}

}  // namespace ref
