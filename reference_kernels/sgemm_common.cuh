// Shared core of the reference FP32 SGEMM kernels: tile geometry, the register-tile FMA loop over
// one shared-memory stage, CTA swizzle, work units and the epilogue through shared memory.
//
// Problem: column-major, cuBLAS "nn", C = A x B for a batch of independent matrices
//   A: M x K, lda = M, stride M*K      B: K x N, ldb = K, stride K*N      C: M x N, ldc = M
// Every size and tile parameter is a compile-time constant (reference.py writes the #defines), so
// loop bounds fold and the bounds checks of aligned sizes vanish. The batch count is not: the
// launch's work units cover the batch (see Unit), so one compiled module serves every batch count.
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
#ifndef SWIZZLE
#define SWIZZLE 8
#endif
#ifndef ORDER
#define ORDER 0
#endif
#ifndef ACC_BLOCK_M
#define ACC_BLOCK_M TM
#endif
#ifndef ACC_BLOCK_N
#define ACC_BLOCK_N TN
#endif
#ifndef ACC_BLOCKS_BY_COLUMN
#define ACC_BLOCKS_BY_COLUMN 0
#endif
#ifndef ACC_BY_COLUMN
#define ACC_BY_COLUMN 0
#endif

#define WARP_M (8 * TM)
#define WARP_N (4 * TN)
#define WARPS_M (BM / WARP_M)
#define WARPS_N (BN / WARP_N)
#define CONSUMER_WARPS (WARPS_M * WARPS_N)
#define CONSUMER_THREADS (32 * CONSUMER_WARPS)
#define TILES_M ((M + BM - 1) / BM)
#define TILES_N ((N + BN - 1) / BN)
#define TILES (TILES_M * TILES_N)
#define K_TILES ((K + BK - 1) / BK)
#define A_STAGE_FLOATS (BM * BK)
#define B_STAGE_FLOATS (BN * BK)
#define STAGE_BYTES (4 * (A_STAGE_FLOATS + B_STAGE_FLOATS))

static_assert(TM % 4 == 0 && BK % 4 == 0,
              "float4 reads of A need TM % 4 == 0; 16-byte copies of B need BK % 4 == 0");
static_assert(BM % WARP_M == 0 && BN % WARP_N == 0, "the CTA tile must hold whole warp tiles");
static_assert(SWIZZLE >= 1, "SWIZZLE is a count");
static_assert(ORDER >= 0 && ORDER <= 2, "fma_order() knows orders 0, 1 and 2");
static_assert(ACC_BLOCK_M >= 1 && TM % ACC_BLOCK_M == 0 && ACC_BLOCK_N >= 1 && TN % ACC_BLOCK_N == 0,
              "accumulator blocks must tile the thread's TM x TN tile");

// The thread's accumulator in row i, column j of its register tile (see acc_index).
#define ACC(i, j) acc[ref::acc_index(i, j)]

// Where accumulator (i, j) of the register tile (row i along m, column j along n) lies in the
// thread's array. The code is the same for every layout: the layout sets the order in which NVVM
// numbers the loop-carried accumulators, which ptxas's register assignment partly follows (the 80
// possible blocks of a 16 x 8 tile give 14 distinct FMA loops), so the layout moves register-bank
// conflicts and with them the FMA loop's issue rate (on the H100, up to 1.2 % at the same tile
// and FMA order: docs/reference.md). A tuned parameter: the tile is cut into
// ACC_BLOCK_M x ACC_BLOCK_N blocks, stored one after another (row by row of blocks, or column by
// column with ACC_BLOCKS_BY_COLUMN), each block row by row (or column by column with
// ACC_BY_COLUMN). One TM x TN block gives plain row- or column-major order.
namespace ref {

__device__ __forceinline__ constexpr int acc_index(int i, int j) {
    constexpr int blocks_m = TM / ACC_BLOCK_M, blocks_n = TN / ACC_BLOCK_N;
    const int bi = i / ACC_BLOCK_M, bj = j / ACC_BLOCK_N;
    const int ii = i % ACC_BLOCK_M, jj = j % ACC_BLOCK_N;
    const int block = ACC_BLOCKS_BY_COLUMN ? bj * blocks_m + bi : bi * blocks_n + bj;
    const int within = ACC_BY_COLUMN ? jj * ACC_BLOCK_M + ii : ii * ACC_BLOCK_N + jj;
    return block * (ACC_BLOCK_M * ACC_BLOCK_N) + within;
}

// The origin of tile `t` of one matrix of the batch. Consecutive tiles walk SWIZZLE m-tiles down
// one n-tile column before moving right, so the CTAs resident at one time share B columns and A
// rows in L2.
__device__ __forceinline__ void tile_origin(int t, int& tile_m, int& tile_n) {
    constexpr int group_tiles = SWIZZLE * TILES_N;
    const int first_m = (t / group_tiles) * SWIZZLE;
    const int rows = min(TILES_M - first_m, SWIZZLE);
    const int in_group = t % group_tiles;
    tile_m = (first_m + in_group % rows) * BM;
    tile_n = (in_group / rows) * BN;
}

// Where tile `tile` of the whole batch (batch entry after batch entry) lies.
__device__ __forceinline__ void locate(int tile, int& tile_m, int& tile_n, int& batch) {
    batch = tile / TILES;
    tile_origin(tile % TILES, tile_m, tile_n);
}

// One CTA's work: a tile of C (its origin and batch entry) and a run of its k tiles. The launch
// numbers the batch's tiles 0 .. batch * TILES - 1 and runs `whole` + (tiles - whole) * `split`
// CTAs: the first `whole` tiles one CTA each, over all of K; every later tile `split` CTAs, each
// over an equal run of k tiles, adding its partial sum into a C the launcher zeroed there. The
// launcher splits only what would otherwise leave SMs idle in the launch's last wave (and, for
// small problems, every tile).
struct Unit {
    int tile_m, tile_n, batch, first_k, k_count;

    __device__ __forceinline__ Unit(int whole, int split) {
        const int u = blockIdx.x;
        int tile = u, slice = 0, parts = 1;
        if (u >= whole) {
            tile = whole + (u - whole) / split;
            slice = (u - whole) % split;
            parts = split;
        }
        locate(tile, tile_m, tile_n, batch);
        first_k = slice * K_TILES / parts;
        k_count = (slice + 1) * K_TILES / parts - first_k;
    }
};

// Whether this CTA holds a partial sum (its tile is split over several CTAs).
__device__ __forceinline__ bool partial_sum(int whole, int split) {
    return static_cast<int>(blockIdx.x) >= whole && split > 1;
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

// The x-th FMA of depth k in the register tile: (i, j). The order decides which operand each FMA
// can take from the operand reuse cache, and which schedule and register assignment ptxas ends
// up with: on the H100 the same tile ran up to 4 % apart between orders (ncu: fewer
// register-bank conflicts, "dispatch stall", and fewer waits on shared-memory loads), with no
// order best for every tile and size, so it is a tuned parameter (docs/reference.md).
//   0  column by column: j-major, i ascending (B's element reused along a column)
//   1  row by row (A's element reused along a row), each row snaking back over the previous
//      one's last column, and the whole walk run backwards on odd k
//   2  row by row, the snake's direction flipping every second k
__device__ __forceinline__ constexpr void fma_order(int x, int k, int& i, int& j) {
    if (ORDER == 0) {
        j = x / TM;
        i = x % TM;
    } else if (ORDER == 1) {
        const int y = k % 2 ? TM * TN - 1 - x : x;
        i = y / TN;
        j = i % 2 ? TN - 1 - y % TN : y % TN;
    } else {
        i = x / TN;
        j = (i + k / 2) % 2 ? TN - 1 - x % TN : x % TN;
    }
}

// acc += a x b^T at depth k of a stage, in the tile's FMA order.
__device__ __forceinline__ void fma_k(int k, const float (&a)[TM], const float (&b)[TN],
                                      float (&acc)[TM * TN]) {
#pragma unroll
    for (int x = 0; x < TM * TN; ++x) {
        int i = 0, j = 0;
        fma_order(x, k, i, j);
        ACC(i, j) = fmaf(a[i], b[j], ACC(i, j));
    }
}

__device__ __forceinline__ void clear(float (&acc)[TM * TN]) {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) ACC(i, j) = 0.0f;
}

__device__ __forceinline__ void fma_stage(const float* __restrict__ as, const float* __restrict__ bs,
                                          int m0, int n0, float (&acc)[TM * TN]) {
    float a[2][TM], b[2][TN];
    load_a(as, 0, m0, a[0]);
    load_b(bs, 0, n0, b[0]);
#pragma unroll
    for (int k = 0; k < BK; ++k) {
        if (k + 1 < BK) {
            load_a(as, k + 1, m0, a[(k + 1) % 2]);
            load_b(bs, k + 1, n0, b[(k + 1) % 2]);
        }
        fma_k(k, a[k % 2], b[k % 2], acc);
    }
}

__device__ __forceinline__ void add_to(float* p, float v) { atomicAdd(p, v); }

__device__ __forceinline__ void add_to(float4* p, float4 v) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y),
                 "f"(v.z), "f"(v.w)
                 : "memory");
#else
    float* f = reinterpret_cast<float*>(p);
    atomicAdd(f, v.x);
    atomicAdd(f + 1, v.y);
    atomicAdd(f + 2, v.z);
    atomicAdd(f + 3, v.w);
#endif
}

// The epilogue goes through shared memory: every thread parks its register tile in the (now idle)
// stage ring as one column-major BM x BN tile, then the CTA writes it out, or adds it for a partial
// sum, in coalesced float4s. Keeping the global stores out of the register-tile code leaves ptxas
// the same register allocation for the FMA loop whichever way a unit ends, and coalesces the
// stores.
#define TILE_BYTES (4 * BM * BN)
// The ring, large enough to park the tile in: what the kernels' data take of shared memory.
#define DATA_BYTES (STAGES * STAGE_BYTES > TILE_BYTES ? STAGES * STAGE_BYTES : TILE_BYTES)

__device__ __forceinline__ void park_tile(float* __restrict__ tile, int m0, int n0,
                                          const float (&acc)[TM * TN]) {
#pragma unroll
    for (int j = 0; j < TN; ++j)
#pragma unroll
        for (int q = 0; q < TM / 4; ++q)
            *reinterpret_cast<float4*>(tile + (n0 + j) * BM + m0 + 32 * q) = make_float4(
                ACC(4 * q, j), ACC(4 * q + 1, j), ACC(4 * q + 2, j), ACC(4 * q + 3, j));
}

// Writes (or, for a partial sum, adds) a parked tile to C. Checks vanish when the tile divides
// the size; float4 accesses need 16-byte aligned columns (M % 4 == 0).
__device__ __forceinline__ void write_tile(float* __restrict__ c, const float* __restrict__ tile,
                                           const Unit& unit, bool partial) {
    constexpr bool full = M % BM == 0 && N % BN == 0;
    float* batch_c = c + static_cast<size_t>(unit.batch) * M * N;
    for (int v = threadIdx.x; v < BM * BN / 4; v += CONSUMER_THREADS) {
        const int m = unit.tile_m + (v % (BM / 4)) * 4, n = unit.tile_n + v / (BM / 4);
        const float4 x = reinterpret_cast<const float4*>(tile)[v];
        float* at = batch_c + static_cast<size_t>(n) * M + m;
        if (M % 4 == 0 && (full || (n < N && m < M))) {
            if (partial)
                add_to(reinterpret_cast<float4*>(at), x);
            else
                *reinterpret_cast<float4*>(at) = x;
            continue;
        }
        const float parts[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            if (n >= N || m + r >= M) continue;
            if (partial)
                add_to(at + r, parts[r]);
            else
                at[r] = parts[r];
        }
    }
}

// The end of every unit, once no warp reads the ring and no copy into it is pending: park the
// register tiles there, then write (or add) the CTA's tile to C.
__device__ __forceinline__ void finish_unit(unsigned char* smem, float* __restrict__ c,
                                            const Unit& unit, int m0, int n0,
                                            const float (&acc)[TM * TN], bool partial) {
    __syncthreads();
    float* tile = reinterpret_cast<float*>(smem);
    park_tile(tile, m0, n0, acc);
    __syncthreads();
    write_tile(c, tile, unit, partial);
}

}  // namespace ref

// Zeroes the tiles whole .. whole + gridDim.x - 1 of the batch, the ones the sgemm kernel of the
// same specialization splits (and adds into). One CTA per tile.
extern "C" __global__ void cublas_audit_ref_zero_tiles(float* __restrict__ c, int whole) {
    int tile_m, tile_n, batch;
    ref::locate(whole + blockIdx.x, tile_m, tile_n, batch);
    float* batch_c = c + static_cast<size_t>(batch) * M * N;
    for (int i = threadIdx.x; i < BM * BN; i += blockDim.x) {
        const int m = tile_m + i % BM, n = tile_n + i / BM;
        if (m < M && n < N) batch_c[static_cast<size_t>(n) * M + m] = 0.0f;
    }
}
