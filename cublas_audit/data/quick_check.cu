/* The map's quick float64 check: one kernel a problem (device.quick_check says what it computes
   and how it is launched; its ROWS, K_TILE and MAX_COLUMNS are the defines below). */
#define MAX_COLUMNS 16
#define ROWS 128
#define K_TILE 32
#define B_LOADS (K_TILE * MAX_COLUMNS / ROWS)  /* B values a thread stages a tile */

__device__ __forceinline__ double half_bits(unsigned short h) {
    const unsigned exponent = (h >> 10) & 0x1f, fraction = h & 0x3ff;
    double v;
    if (exponent == 0) v = ldexp((double)fraction, -24);
    else if (exponent == 31) v = fraction ? __longlong_as_double(0x7ff8000000000000ULL)
                                          : __longlong_as_double(0x7ff0000000000000ULL);
    else v = ldexp((double)(fraction | 0x400), (int)exponent - 25);
    return (h >> 15) ? -v : v;
}

/* A stored value as a float (exact for all three storages: float32, bf16 and fp16 values are
   all floats), so that the staged tile of A takes half the registers and shared memory. */
template <int STORAGE>
__device__ __forceinline__ float as_float(const void* p, long long i) {
    if (STORAGE == 0) return ((const float*)p)[i];
    const unsigned short h = ((const unsigned short*)p)[i];
    if (STORAGE == 2) return __uint_as_float(((unsigned)h) << 16);
    return (float)half_bits(h);
}

/* One K_TILE x ROWS tile of op(A) into shared memory, each thread issuing its loads 16 at a
   time (the first kernel loaded one value and waited for it before the next: latency-bound, ~65
   us a grid problem on average; all 32 at once took ~250 registers), coalesced in both
   layouts: a warp reads 32 consecutive rows of one column (transa = n) or 32 consecutive K
   values of one row (transa = t). Values outside the problem are zero. */
template <int STORAGE>
__device__ __forceinline__ void stage_a(
        float (*a_tile)[ROWS + 1], const void* a, long long offset, long long lda, int transa,
        int row0, int m, int base, int p1) {
    constexpr int HALF = K_TILE / 2;  /* 16 loads in flight a thread: fewer registers */
    float v[HALF];
    if (!transa) {  /* thread t: row row0 + t, K values base .. base + K_TILE */
        const int i = row0 + threadIdx.x;
        #pragma unroll 1
        for (int h = 0; h < K_TILE; h += HALF) {
            const long long at = offset + (long long)(base + h) * lda + i;
            #pragma unroll
            for (int q = 0; q < HALF; ++q)
                v[q] = (i < m && base + h + q < p1) ? as_float<STORAGE>(a, at + q * lda) : 0.0f;
            #pragma unroll
            for (int q = 0; q < HALF; ++q) a_tile[h + q][threadIdx.x] = v[q];
        }
    } else {  /* thread t: K value base + t % 32 of rows row0 + t / 32 + 4 r */
        const int q = threadIdx.x % K_TILE, first = threadIdx.x / K_TILE;
        constexpr int STEP = ROWS / K_TILE;
        #pragma unroll 1
        for (int h = 0; h < K_TILE; h += HALF) {
            const int row = first + STEP * h;
            const long long at = offset + (long long)(row0 + row) * lda + base + q;
            #pragma unroll
            for (int r = 0; r < HALF; ++r)
                v[r] = (row0 + row + STEP * r < m && base + q < p1)
                    ? as_float<STORAGE>(a, at + (long long)(STEP * r) * lda) : 0.0f;
            #pragma unroll
            for (int r = 0; r < HALF; ++r) a_tile[q][row + STEP * r] = v[r];
        }
    }
}

template <int STORAGE>
__device__ __forceinline__ void partial_sums(
        double (*tile)[MAX_COLUMNS], float (*a_tile)[ROWS + 1], const void* a, const void* b,
        int m, int k, int transa, int transb, long long lda, long long ldb, long long stride_a,
        long long stride_b, const int* entries, const int* columns, int n_columns,
        int k_per_block, double* partial) {
    const int slot = blockIdx.z;
    const long long e = entries[slot];
    const int row0 = blockIdx.x * ROWS;
    const int i = row0 + threadIdx.x;
    const int p0 = blockIdx.y * k_per_block;
    const int p1 = min(k, p0 + k_per_block);
    const int* cols = columns + slot * n_columns;
    double acc[MAX_COLUMNS];
    #pragma unroll
    for (int c = 0; c < MAX_COLUMNS; ++c) acc[c] = 0.0;
    for (int base = p0; base < p1; base += K_TILE) {
        /* the B tile's values loaded together (then A's), stored once all are asked for:
           one memory latency a tile, not one a value */
        double bv[B_LOADS];
        #pragma unroll
        for (int u = 0; u < B_LOADS; ++u) {
            const int t = threadIdx.x + ROWS * u;
            const int p = base + t / MAX_COLUMNS, c = t % MAX_COLUMNS;
            const long long j = c < n_columns ? cols[c] : 0;
            bv[u] = (p < p1 && c < n_columns)
                ? as_float<STORAGE>(b, e * stride_b + (transb ? p * ldb + j : j * ldb + p))
                : 0.0;
        }
        __syncthreads();  /* the last tile's values all read */
        #pragma unroll
        for (int u = 0; u < B_LOADS; ++u) {
            const int t = threadIdx.x + ROWS * u;
            tile[t / MAX_COLUMNS][t % MAX_COLUMNS] = bv[u];
        }
        stage_a<STORAGE>(a_tile, a, e * stride_a, lda, transa, row0, m, base, p1);
        __syncthreads();
        /* values past p1 are zero in both tiles: whole tiles summed, nothing added */
        #pragma unroll 4
        for (int q = 0; q < K_TILE; ++q) {
            const double x = a_tile[q][threadIdx.x];
            #pragma unroll
            for (int c = 0; c < MAX_COLUMNS; ++c) acc[c] += x * tile[q][c];
        }
    }
    if (i < m) {
        #pragma unroll
        for (int c = 0; c < MAX_COLUMNS; ++c)  // unrolled: acc stays in registers
            if (c < n_columns)
                atomicAdd(&partial[((long long)slot * MAX_COLUMNS + c) * m + i], acc[c]);
    }
}

/* One row's squared error and squared norm over the checked columns, from the float64 sums the
   problem's blocks added up (read from L2: other blocks' atomics), each sum then zeroed for the
   next problem; the columns' loads in flight together (unrolled, the storage known). */
template <int STORAGE>
__device__ __forceinline__ void row_sums(
        const void* c, const void* c0, const void* bias, double beta, int m, int n, long long e,
        const int* cols, int n_columns, double* partial, int i, double& d2, double& r2) {
    const double added = bias ? (double)as_float<STORAGE>(bias, i) : 0.0;
    #pragma unroll
    for (int col = 0; col < MAX_COLUMNS; ++col) {
        if (col < n_columns) {
            const long long at = e * (long long)m * n + (long long)cols[col] * m + i;
            double* sum = partial + (long long)col * m + i;
            double exact = __ldcg(sum);
            *sum = 0.0;
            if (c0) exact += beta * (double)as_float<STORAGE>(c0, at);
            if (bias) exact += added;
            const double diff = (double)as_float<STORAGE>(c, at) - exact;
            d2 += diff * diff;
            r2 += exact * exact;
        }
    }
}

/* The block's two sums added up (ROWS threads: 4 warps), then into the problem's slots. */
__device__ __forceinline__ void block_sums(double d2, double r2, double* sums, int slot) {
    __shared__ double warp_sums[2][ROWS / 32];
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
        for (int w = 0; w < ROWS / 32; ++w) { d2 += warp_sums[0][w]; r2 += warp_sums[1][w]; }
        atomicAdd(&sums[2 * slot], d2);
        atomicAdd(&sums[2 * slot + 1], r2);
    }
}

/* The whole check of one problem in one launch (grid: row blocks x K splits x checked entries).
   Each block adds its rows' partial sums over its share of K into the scratch (float64 atomics),
   then takes a ticket of its rows; the block that takes the last (every K split of those rows
   is in) compares them with C, adds the squared error and norm into `sums` and zeroes what it
   read and the ticket, so the scratch is all zeros again for the next problem. Before, the
   scratch's memset, the partial sums and a final kernel were three launches a problem, ~30 us
   of the H100's time together on the BF16 grid for ~8 us of work. The ticket follows CUDA's
   threadFenceReduction sample: each block's atomics made visible (__threadfence) before its
   ticket, the last block's reads from L2 (__ldcg). */
template <int STORAGE>
__device__ __forceinline__ void check(
        double (*tile)[MAX_COLUMNS], float (*a_tile)[ROWS + 1], const void* a, const void* b,
        const void* c, const void* c0, const void* bias, double beta, int m, int n, int k,
        int transa, int transb, long long lda, long long ldb, long long stride_a,
        long long stride_b, const int* entries, const int* columns, int n_columns,
        int k_per_block, double* scratch, double* sums) {
    __shared__ int last;
    const int slot = blockIdx.z;
    double* partial = scratch + (long long)slot * MAX_COLUMNS * m;
    partial_sums<STORAGE>(tile, a_tile, a, b, m, k, transa, transb, lda, ldb, stride_a, stride_b,
                          entries, columns, n_columns, k_per_block, scratch);
    __threadfence();
    __syncthreads();
    unsigned long long* ticket = (unsigned long long*)(scratch + (long long)gridDim.z
                                                       * MAX_COLUMNS * m)
                                 + slot * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1ULL) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int i = blockIdx.x * ROWS + threadIdx.x;
    double d2 = 0.0, r2 = 0.0;
    if (i < m)
        row_sums<STORAGE>(c, c0, bias, beta, m, n, entries[slot], columns + slot * n_columns,
                          n_columns, partial, i, d2, r2);
    block_sums(d2, r2, sums, slot);
    if (threadIdx.x == 0) *ticket = 0ULL;
}

extern "C" __global__ void __launch_bounds__(ROWS) cublas_audit_check(
        const void* a, const void* b, const void* c, const void* c0, const void* bias,
        int storage, double beta, int m, int n, int k, int transa, int transb, long long lda,
        long long ldb, long long stride_a, long long stride_b, const int* entries,
        const int* columns, int n_columns, int k_per_block, double* scratch, double* sums) {
    __shared__ double tile[K_TILE][MAX_COLUMNS];
    __shared__ float a_tile[K_TILE][ROWS + 1];  /* +1: the transposed stores hit 32 banks */
    if (storage == 0)
        check<0>(tile, a_tile, a, b, c, c0, bias, beta, m, n, k, transa, transb, lda, ldb,
                 stride_a, stride_b, entries, columns, n_columns, k_per_block, scratch, sums);
    else if (storage == 2)
        check<2>(tile, a_tile, a, b, c, c0, bias, beta, m, n, k, transa, transb, lda, ldb,
                 stride_a, stride_b, entries, columns, n_columns, k_per_block, scratch, sums);
    else
        check<1>(tile, a_tile, a, b, c, c0, bias, beta, m, n, k, transa, transb, lda, ldb,
                 stride_a, stride_b, entries, columns, n_columns, k_per_block, scratch, sums);
}
