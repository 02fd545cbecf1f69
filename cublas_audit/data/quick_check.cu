/* The map's quick float64 check: one kernel a problem, or one a chunk of problems, and the poison
   each problem's C gets before its calls (device.quick_check says what the check computes and how
   it is launched, device.check_chunk the chunk's; its ROWS and MAX_COLUMNS are the defines
   below). */
#define MAX_COLUMNS 16
#define ROWS 128
#define WARPS (ROWS / 32)
/* TRANSA's value where A and B are untransposed 2-byte values read two at a load (A two rows, B
   two values of K: 4-byte words, aligned where lda, ldb and the batch strides are even) */
#define PAIRED 2
#define B_LOADS 2  /* B's loads a thread makes a tile */

/* Values of K a tile stages in shared memory (the launch's K split is in 32s): 32 where values
   are read in pairs (16 loads of 4 bytes a thread: twice the bytes in flight of 16 of 2), else
   16. */
template <int TRANSA>
struct Tile {
    static constexpr int STAGE = TRANSA == PAIRED ? 32 : 16;
};
#define STAGE_MOST 32

/* A stored 2-byte value (bf16 bits, STORAGE 2, or fp16: the hardware's exact conversion) as a
   float. */
template <int STORAGE>
__device__ __forceinline__ float from_bits(unsigned h) {
    if (STORAGE == 2) return __uint_as_float(h << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
}

/* A stored value as a float (exact for all three storages: float32, bf16 and fp16 values are
   all floats), so that the staged tile of A takes half the registers and shared memory. */
template <int STORAGE>
__device__ __forceinline__ float as_float(const void* p, long long i) {
    if (STORAGE == 0) return ((const float*)p)[i];
    return from_bits<STORAGE>(((const unsigned short*)p)[i]);
}

/* Where A's value (row, q) of a tile lives in shared memory: rows XOR-swizzled by q, so that
   both ways of storing (a warp's 32 rows of one q, or 32 q of one row) and the fragments' loads
   (8 rows x 4 q) each touch 32 different banks. */
__device__ __forceinline__ int a_at(int q, int row) {
    return q * ROWS + (row ^ (((q & 3) << 3) | (q >> 2)));
}

/* Where B's value (q, column) of a tile lives: in the order of the mma's B fragments (k step,
   8-column half, lane), so that a warp reads each fragment as 32 consecutive doubles. */
__device__ __forceinline__ int b_at(int q, int c) {
    return ((q >> 2) * 2 + (c >> 3)) * 32 + (q & 3) + 4 * (c & 7);
}

/* d += a b for one 8x8x4 float64 product: the H100's float64 tensor cores (sm_80 on), else
   the same sums from the warp's fragments by shuffles. */
__device__ __forceinline__ void mma_f64(double& d0, double& d1, double a, double b) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                 : "+d"(d0), "+d"(d1) : "d"(a), "d"(b));
#else
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const double x = __shfl_sync(0xffffffffu, a, g * 4 + kk);
        d0 += x * __shfl_sync(0xffffffffu, b, kk + 4 * (2 * t));
        d1 += x * __shfl_sync(0xffffffffu, b, kk + 4 * (2 * t + 1));
    }
#endif
}

/* x added to *p at the GPU's L2, nothing returned (no wait for it here) */
__device__ __forceinline__ void red_add(double* p, double x) {
    asm volatile("red.global.add.f64 [%0], %1;" :: "l"(p), "d"(x) : "memory");
}

/* A block's place in its problem's check: row block x, K split y, checked entry z, among gx row
   blocks, gy K splits and gz entries (blockIdx and gridDim where a kernel checks one problem;
   derived from the block's number where one kernel checks a chunk's problems). */
struct Place {
    int x, y, z, gx, gy, gz;
};


/* One tile's values of A and B (paired: words of two values), loaded into registers while the
   tile before is multiplied. */
struct Next {
    float a[16];
    float b[B_LOADS];
};

/* The global loads of the tile at `base`: A's STAGE x ROWS values coalesced in every layout
   (a warp reads 32 consecutive rows of one column, transa = n; 64 as 32 words, PAIRED, where
   lda and the batch stride are even; or 32 consecutive K values of one row, transa = t), and
   B's picked columns (a warp reads 32 consecutive K of one column). Values outside the problem
   are zero (a pair's second row past m: zeroed where stored). */
template <int STORAGE, int TRANSA>
__device__ __forceinline__ void load_tile(
        Next& next, const void* __restrict__ a, const void* __restrict__ b,
        long long a_offset, long long b_offset, long long lda, long long ldb, int transb,
        int row0, int m, int base, int p1, const int* col, const bool* col_ok) {
    constexpr int STAGE = Tile<TRANSA>::STAGE;
    if (TRANSA == PAIRED) {
        /* rows i and i + 1 (i even: with lda even, one aligned word; past m only where lda > m),
           K values base + 16 half + q */
        const int i = row0 + 2 * (threadIdx.x % 64), from = base + 16 * (threadIdx.x / 64);
        const unsigned* words = (const unsigned*)a;
        const long long at = (a_offset + (long long)from * lda + i) / 2;
        #pragma unroll
        for (int q = 0; q < 16; ++q)
            next.a[q] = (i < m && from + q < p1) ? __uint_as_float(words[at + q * (lda / 2)])
                                                 : 0.0f;
    } else if (!TRANSA) {
        const int i = row0 + threadIdx.x;
        const long long at = a_offset + (long long)base * lda + i;
        #pragma unroll
        for (int q = 0; q < STAGE; ++q)
            next.a[q] = (i < m && base + q < p1) ? as_float<STORAGE>(a, at + q * lda) : 0.0f;
    } else {
        const int q = threadIdx.x % STAGE, first = threadIdx.x / STAGE;
        constexpr int STEP = ROWS / STAGE;
        const long long at = a_offset + (long long)(row0 + first) * lda + base + q;
        #pragma unroll
        for (int r = 0; r < STAGE; ++r)
            next.a[r] = (row0 + first + STEP * r < m && base + q < p1)
                ? as_float<STORAGE>(a, at + (long long)(STEP * r) * lda) : 0.0f;
    }
    if (TRANSA == PAIRED) {  /* K values p and p + 1 of columns t / 16 and 8 more */
        const int p = base + 2 * (threadIdx.x % 16);
        const unsigned* words = (const unsigned*)b;
        #pragma unroll
        for (int u = 0; u < B_LOADS; ++u)
            next.b[u] = (p < p1 && col_ok[u])
                ? __uint_as_float(words[(b_offset + col[u] * ldb + p) / 2]) : 0.0f;
    } else {
        const int p = base + threadIdx.x % STAGE;
        #pragma unroll
        for (int u = 0; u < B_LOADS; ++u)
            next.b[u] = (p < p1 && col_ok[u])
                ? as_float<STORAGE>(b, b_offset + (transb ? p * ldb + col[u] : col[u] * ldb + p))
                : 0.0f;
    }
}

/* The loaded tile into shared memory (its layouts above); `rows` of the block's are the problem's
and `values` of the tile's K (a pair's second value past them stored as zero). */
template <int STORAGE, int TRANSA>
__device__ __forceinline__ void store_tile(const Next& next, float* a_tile, double* b_tile,
                                           int rows, int values) {
    constexpr int STAGE = Tile<TRANSA>::STAGE;
    if (TRANSA == PAIRED) {
        const int row = 2 * (threadIdx.x % 64), from = 16 * (threadIdx.x / 64);
        #pragma unroll
        for (int q = 0; q < 16; ++q) {
            const unsigned word = __float_as_uint(next.a[q]);
            a_tile[a_at(from + q, row)] = from_bits<STORAGE>(word & 0xffffu);
            a_tile[a_at(from + q, row + 1)] = row + 1 < rows ? from_bits<STORAGE>(word >> 16)
                                                             : 0.0f;
        }
    } else if (!TRANSA) {
        #pragma unroll
        for (int q = 0; q < STAGE; ++q) a_tile[a_at(q, threadIdx.x)] = next.a[q];
    } else {
        const int q = threadIdx.x % STAGE, first = threadIdx.x / STAGE;
        #pragma unroll
        for (int r = 0; r < STAGE; ++r) a_tile[a_at(q, first + (ROWS / STAGE) * r)] = next.a[r];
    }
    if (TRANSA == PAIRED) {
        const int q = 2 * (threadIdx.x % 16);
        #pragma unroll
        for (int u = 0; u < B_LOADS; ++u) {
            const int c = threadIdx.x / 16 + 8 * u;
            const unsigned word = __float_as_uint(next.b[u]);
            b_tile[b_at(q, c)] = from_bits<STORAGE>(word & 0xffffu);
            b_tile[b_at(q + 1, c)] = q + 1 < values ? from_bits<STORAGE>(word >> 16) : 0.0;
        }
    } else {
        #pragma unroll
        for (int u = 0; u < B_LOADS; ++u)
            b_tile[b_at(threadIdx.x % STAGE, threadIdx.x / STAGE + (ROWS / STAGE) * u)] = next.b[u];
    }
}

/* One staged tile multiplied: each warp's 32 rows (4 fragments of 8) by the 16 columns (2 of
   8), 4 values of K at a time. acc[f][h]: rows warp*32 + 8f + lane/4, columns 8h + 2(lane%4)
   and the next. */
template <int STAGE>
__device__ __forceinline__ void multiply_tile(const float* a_tile, const double* b_tile,
                                              double (*acc)[2][2]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    #pragma unroll
    for (int s = 0; s < STAGE / 4; ++s) {
        const double b0 = b_tile[(s * 2) * 32 + lane], b1 = b_tile[(s * 2 + 1) * 32 + lane];
        const int q = 4 * s + (lane & 3);
        #pragma unroll
        for (int f = 0; f < 4; ++f) {
            const double x = a_tile[a_at(q, warp * 32 + 8 * f + (lane >> 2))];
            mma_f64(acc[f][0][0], acc[f][0][1], x, b0);
            mma_f64(acc[f][1][0], acc[f][1][1], x, b1);
        }
    }
}

/* The block's rows' sums over its share of K, added into the problem's scratch (float64
   atomics: the other K shares add theirs). `smem` holds A's tile (STAGE x ROWS floats), then the
   block's sums (MAX_COLUMNS x ROWS doubles): the accumulators pass through it so that each
   thread adds one row's 16 sums, a warp's atomics 32 consecutive rows of one column. */
template <int STORAGE, int TRANSA>
__device__ __forceinline__ void partial_sums(
        double* smem, double* b_tile, const void* __restrict__ a, const void* __restrict__ b,
        int m, int k, int transb, long long lda, long long ldb, long long e, long long stride_a,
        long long stride_b, const int* cols, int n_columns, int k_per_block, double* partial,
        const Place& at) {
    float* a_tile = (float*)smem;
    double* sums = smem;
    const long long a_offset = e * stride_a, b_offset = e * stride_b;
    const int row0 = at.x * ROWS;
    const int p0 = at.y * k_per_block;
    const int p1 = min(k, p0 + k_per_block);
    constexpr int STAGE = Tile<TRANSA>::STAGE;
    int col[B_LOADS];
    bool col_ok[B_LOADS];
    #pragma unroll
    for (int u = 0; u < B_LOADS; ++u) {  /* (paired: two values of K a load, 16 loads a column) */
        const int c = TRANSA == PAIRED ? threadIdx.x / 16 + 8 * u
                                       : threadIdx.x / STAGE + (ROWS / STAGE) * u;
        col_ok[u] = c < n_columns;
        col[u] = col_ok[u] ? cols[c] : 0;
    }
    double acc[4][2][2];
    #pragma unroll
    for (int f = 0; f < 4; ++f)
        #pragma unroll
        for (int h = 0; h < 2; ++h) acc[f][h][0] = acc[f][h][1] = 0.0;
    Next next;
    load_tile<STORAGE, TRANSA>(next, a, b, a_offset, b_offset, lda, ldb, transb, row0, m, p0, p1,
                               col, col_ok);
    for (int base = p0; base < p1; base += STAGE) {
        __syncthreads();  /* the tile before read by every warp */
        store_tile<STORAGE, TRANSA>(next, a_tile, b_tile, m - row0, p1 - base);
        __syncthreads();
        if (base + STAGE < p1)  /* the next tile's loads in flight while this one multiplies */
            load_tile<STORAGE, TRANSA>(next, a, b, a_offset, b_offset, lda, ldb, transb, row0,
                                       m, base + STAGE, p1, col, col_ok);
        multiply_tile<STAGE>(a_tile, b_tile, acc);
    }
    /* values past p1 are zero in both tiles: whole tiles summed, nothing added */
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    #pragma unroll
    for (int f = 0; f < 4; ++f)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
            #pragma unroll
            for (int j = 0; j < 2; ++j)
                sums[(8 * h + 2 * (lane & 3) + j) * ROWS + warp * 32 + 8 * f + (lane >> 2)]
                    = acc[f][h][j];
    __syncthreads();
    const int i = row0 + threadIdx.x;
    if (i < m) {
        #pragma unroll
        for (int c = 0; c < MAX_COLUMNS; ++c)
            if (c < n_columns)
                red_add(&partial[(long long)c * m + i], sums[c * ROWS + threadIdx.x]);
    }
}

/* One row's squared error and squared norm over the checked columns, from the float64 sums the
   problem's blocks added up (read from L2: other blocks' atomics), each sum then zeroed for the
   next problem; the columns' loads in flight together (unrolled, the storage known). */
template <int STORAGE>
__device__ __forceinline__ void row_sums(
        const void* __restrict__ c, const void* __restrict__ c0, const void* __restrict__ bias,
        double beta, int m, int n, long long e, const int* cols, int n_columns,
        double* partial, int i, double& d2, double& r2) {
    const double added = bias ? (double)as_float<STORAGE>(bias, i) : 0.0;
    double exact[MAX_COLUMNS], got[MAX_COLUMNS];
    #pragma unroll
    for (int col = 0; col < MAX_COLUMNS; ++col) {
        if (col < n_columns) {
            const long long at = e * (long long)m * n + (long long)cols[col] * m + i;
            exact[col] = __ldcg(partial + (long long)col * m + i);
            got[col] = (double)as_float<STORAGE>(c, at);
            if (c0) exact[col] += beta * (double)as_float<STORAGE>(c0, at);
        }
    }
    #pragma unroll
    for (int col = 0; col < MAX_COLUMNS; ++col) {
        if (col < n_columns) {
            partial[(long long)col * m + i] = 0.0;
            const double want = exact[col] + added;
            const double diff = got[col] - want;
            d2 += diff * diff;
            r2 += want * want;
        }
    }
}

/* The block's two sums added up (ROWS threads: 4 warps), then into the problem's slots. */
__device__ __forceinline__ void block_sums(double d2, double r2, double* sums, int slot) {
    __shared__ double warp_sums[2][WARPS];
    for (int offset = 16; offset > 0; offset >>= 1) {
        d2 += __shfl_down_sync(0xffffffffu, d2, offset);
        r2 += __shfl_down_sync(0xffffffffu, r2, offset);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { warp_sums[0][warp] = d2; warp_sums[1][warp] = r2; }
    __syncthreads();
    if (threadIdx.x == 0) {
        d2 = r2 = 0.0;
        #pragma unroll
        for (int w = 0; w < WARPS; ++w) { d2 += warp_sums[0][w]; r2 += warp_sums[1][w]; }
        atomicAdd(&sums[2 * slot], d2);
        atomicAdd(&sums[2 * slot + 1], r2);
    }
}

/* The whole check of one problem in one launch (grid: row blocks x K splits x checked entries).
   Each block adds its rows' partial sums over its share of K into the scratch (float64 atomics),
   then takes a ticket of its rows; the block that takes the last (every K split of those rows
   is in) compares them with C, adds the squared error and norm into `sums` and zeroes what it
   read and the ticket, so the scratch is all zeros again for the next problem. The ticket
   follows CUDA's threadFenceReduction sample: each block's atomics made visible
   (__threadfence) before its ticket, the last block's reads from L2 (__ldcg). */
template <int STORAGE, int TRANSA>
__device__ __forceinline__ void check(
        double* smem, double* b_tile, const void* a, const void* b, const void* c,
        const void* c0, const void* bias, double beta, int m, int n, int k, int transb,
        long long lda, long long ldb, long long stride_a, long long stride_b, const int* entries,
        const int* columns, int n_columns, int k_per_block, double* scratch, double* sums,
        const Place& at) {
    __shared__ int last;
    const int slot = at.z;
    const long long e = entries[slot];
    const int* cols = columns + slot * n_columns;
    double* partial = scratch + (long long)slot * MAX_COLUMNS * m;
    partial_sums<STORAGE, TRANSA>(smem, b_tile, a, b, m, k, transb, lda, ldb, e, stride_a,
                                  stride_b, cols, n_columns, k_per_block, partial, at);
    __syncthreads();  /* every thread's sums added (cumulative: thread 0's fence covers them) */
    unsigned long long* ticket = (unsigned long long*)(scratch + (long long)at.gz * MAX_COLUMNS * m)
                                 + slot * at.gx + at.x;
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");  /* release the block's sums */
        last = atomicAdd(ticket, 1ULL) == at.gy - 1;
        if (last) asm volatile("fence.acq_rel.gpu;" ::: "memory");  /* acquire the others' */
    }
    __syncthreads();
    if (!last) return;
    const int i = at.x * ROWS + threadIdx.x;
    double d2 = 0.0, r2 = 0.0;
    if (i < m)
        row_sums<STORAGE>(c, c0, bias, beta, m, n, e, cols, n_columns, partial, i, d2, r2);
    block_sums(d2, r2, sums, slot);
    if (threadIdx.x == 0) *ticket = 0ULL;
}

#define CHECK(S, T) check<S, T>(smem, b_tile, a, b, c, c0, bias, beta, m, n, k, transb, lda, ldb, \
                                stride_a, stride_b, entries, columns, n_columns, k_per_block,   \
                                scratch, sums, at)

/* One problem's check by the block at `at`: each storage and layout of A compiled on its own,
   one path's registers, not all six's. */
__device__ __forceinline__ void check_any(
        const void* a, const void* b, const void* c, const void* c0, const void* bias,
        int storage, double beta, int m, int n, int k, int transa, int transb, long long lda,
        long long ldb, long long stride_a, long long stride_b, const int* entries,
        const int* columns, int n_columns, int k_per_block, double* scratch, double* sums,
        const Place& at) {
    /* A's tile (STAGE x ROWS floats), then the block's sums (MAX_COLUMNS x ROWS doubles) */
    __shared__ __align__(16) double smem[MAX_COLUMNS * ROWS];
    __shared__ __align__(16) double b_tile[STAGE_MOST * MAX_COLUMNS];
    /* values read in pairs where each pair is one aligned word */
    const bool paired = !transa && !transb && lda % 2 == 0 && ldb % 2 == 0 && stride_a % 2 == 0
                        && stride_b % 2 == 0;
#define BY_LAYOUT(S) if (transa) CHECK(S, 1); else if (paired) CHECK(S, PAIRED); else CHECK(S, 0)
    if (storage == 0) { if (transa) CHECK(0, 1); else CHECK(0, 0); }  /* (4-byte: never paired) */
    else if (storage == 2) { BY_LAYOUT(2); }
    else { BY_LAYOUT(1); }
}

/* One problem's check (grid: row blocks x K splits x checked entries). */
extern "C" __global__ void __launch_bounds__(ROWS, 4) cublas_audit_check(
        const void* a, const void* b, const void* c, const void* c0, const void* bias,
        int storage, double beta, int m, int n, int k, int transa, int transb, long long lda,
        long long ldb, long long stride_a, long long stride_b, const int* entries,
        const int* columns, int n_columns, int k_per_block, double* scratch, double* sums) {
    const Place at = {(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z,
                      (int)gridDim.x, (int)gridDim.y, (int)gridDim.z};
    check_any(a, b, c, c0, bias, storage, beta, m, n, k, transa, transb, lda, ldb, stride_a,
              stride_b, entries, columns, n_columns, k_per_block, scratch, sums, at);
}

/* One problem of a chunk (device.check_chunk.JOB_FIELDS: every field 64 bits wide). Pooled
   problems have beta = 0: no C0 is added. */
struct Job {
    long long a, b, c, bias, storage, m, n, k, transa, transb, lda, ldb, stride_a, stride_b;
    long long entries, columns, n_columns, per_block, blocks_x, blocks_y, slots, first_block;
    long long scratch, sums;
};

#define CHUNK_JOBS 128  /* device.check_chunk.CHUNK_JOBS: planning.chunks.CHUNK's problems */

/* A chunk's jobs, passed whole as the kernel's parameter (24 KiB: CUDA 12.1 on takes 32 KiB of
   parameters), so that each block reads its problem's from the constant bank. */
struct Chunk {
    Job jobs[CHUNK_JOBS];
    long long count;
};

/* Every problem of a chunk checked in one launch, after the chunk's calls: the blocks are the
   problems' blocks one problem after another (from each one's `first_block`), so that the
   ~13 us each problem's own launch spent in its chain of dependent memory round trips overlap.
   Each problem has its own C (its values kept until now) and its own scratch. Three blocks an
   SM, not four: the job's values are held in registers (at four, 128 registers, it spilled
   ~350 bytes; at three ~30). */
extern "C" __global__ void __launch_bounds__(ROWS, 3) cublas_audit_check_chunk(
        const __grid_constant__ Chunk chunk) {
    /* this block's problem: the last whose first block is at or before it */
    int index = -1;
    for (int base = 0; base < (int)chunk.count; base += ROWS) {
        const int j = base + (int)threadIdx.x;
        index += __syncthreads_count(j < chunk.count
                                     && chunk.jobs[j].first_block <= (long long)blockIdx.x);
    }
    const Job& job = chunk.jobs[index];
    const int local = (int)(blockIdx.x - job.first_block);
    const int gx = (int)job.blocks_x, gy = (int)job.blocks_y;
    const Place at = {local % gx, (local / gx) % gy, local / (gx * gy), gx, gy, (int)job.slots};
    check_any((const void*)job.a, (const void*)job.b, (const void*)job.c, 0,
              (const void*)job.bias, (int)job.storage, 0.0, (int)job.m, (int)job.n, (int)job.k,
              (int)job.transa, (int)job.transb, job.lda, job.ldb, job.stride_a, job.stride_b,
              (const int*)job.entries, (const int*)job.columns, (int)job.n_columns,
              (int)job.per_block, (double*)job.scratch, (double*)job.sums, at);
}

/* The checked columns of C poisoned before a problem's calls (one block a column of each checked
   entry): every byte 0xFF, a NaN in each storage, so that an output the calls did not write fails
   the check, which reads nothing else of C. A kernel, not a memset: CUPTI's records show where
   each problem begins (device.map_records). `c` null: nothing poisoned (a case that could not be
   made: its records still open here). */
extern "C" __global__ void cublas_audit_poison(
        void* c, long long m, long long n, long long item, const int* entries,
        const int* columns, int n_columns) {
    if (!c) return;
    const int slot = blockIdx.x / n_columns;
    const long long e = entries[slot], col = columns[blockIdx.x];
    const long long first = (e * n + col) * m;
    for (long long i = threadIdx.x; i < m; i += blockDim.x) {
        if (item == 4) ((unsigned*)c)[first + i] = 0xFFFFFFFFu;
        else ((unsigned short*)c)[first + i] = 0xFFFFu;
    }
}
