// Reference FP32 SGEMM for sm_80, sm_86 and sm_89 (and, on newer GPUs, for sizes TMA cannot
// describe): every thread copies its share of each tile with cp.async (LDGSTS) into a
// STAGES-deep shared-memory ring, then all threads FMA over the oldest stage.
//
// Pipeline, per CTA (one work unit: a BM x BN tile of C of one batch entry, a run of its k tiles;
// see Unit in sgemm_common.cuh):
//
//   prologue: issue tiles 0 .. STAGES-2, one commit group each
//   for t in k tiles:
//     wait until at most STAGES-2 groups are pending (tile t has landed), __syncthreads
//       (tile t is visible to all, and every thread has left the stage tile t-1 used)
//     issue tile t+STAGES-1 into that freed stage, commit (an empty group near the end keeps
//       the count uniform)
//     FMA over stage t
//
// Copies are VEC floats wide: 4 (16-byte cp.async.cg, needs M % 4 == 0 and K % 4 == 0 so every
// chunk is aligned) or 1 (4-byte cp.async.ca, any size). Chunks past M, N or K are zero-filled
// (src-size 0), so ragged edges add nothing to the sum. Shared layout and compute core are the
// TMA kernel's (sgemm_common.cuh).
#include "sgemm_common.cuh"

#ifndef VEC
#define VEC 4
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

static_assert(VEC == 4 || VEC == 1, "copies are 16 or 4 bytes");
static_assert((A_STAGE_FLOATS / VEC) % CONSUMER_THREADS == 0, "A chunks split evenly");
static_assert((B_STAGE_FLOATS / VEC) % CONSUMER_THREADS == 0, "B chunks split evenly");

namespace ref {

__device__ __forceinline__ void copy_async(float* dst, const float* src, bool valid) {
    const unsigned dst_addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const int src_bytes = valid ? 4 * VEC : 0;
#if VEC == 4
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst_addr), "l"(src),
                 "r"(src_bytes)
                 : "memory");
#else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst_addr), "l"(src),
                 "r"(src_bytes)
                 : "memory");
#endif
}

// Issues this thread's chunks of k tile `kt` into one stage.
__device__ __forceinline__ void load_stage(float* as, float* bs, const float* __restrict__ a,
                                           const float* __restrict__ b, int tile_m, int tile_n,
                                           int kt) {
    const int k0 = kt * BK;
#pragma unroll
    for (int i = 0; i < A_STAGE_FLOATS / VEC / CONSUMER_THREADS; ++i) {
        const int chunk = i * CONSUMER_THREADS + threadIdx.x;
        const int kk = chunk / (BM / VEC);
        const int mm = (chunk % (BM / VEC)) * VEC;
        const bool valid = k0 + kk < K && tile_m + mm < M;
        const float* src = valid ? a + static_cast<size_t>(k0 + kk) * M + tile_m + mm : a;
        copy_async(as + kk * BM + mm, src, valid);
    }
#pragma unroll
    for (int i = 0; i < B_STAGE_FLOATS / VEC / CONSUMER_THREADS; ++i) {
        const int chunk = i * CONSUMER_THREADS + threadIdx.x;
        const int nn = chunk / (BK / VEC);
        const int kk = (chunk % (BK / VEC)) * VEC;
        const bool valid = tile_n + nn < N && k0 + kk < K;
        const float* src = valid ? b + static_cast<size_t>(tile_n + nn) * K + k0 + kk : b;
        copy_async(bs + nn * BK + kk, src, valid);
    }
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

__device__ __forceinline__ void wait_stage() {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
}

__device__ __forceinline__ void wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

}  // namespace ref

extern "C" __global__ void __launch_bounds__(CONSUMER_THREADS, MIN_BLOCKS)
    cublas_audit_ref_cpasync_sgemm(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ c, int whole, int split) {
    extern __shared__ __align__(128) unsigned char smem[];
    auto stage_a = [&](int s) { return reinterpret_cast<float*>(smem + s * STAGE_BYTES); };
    auto stage_b = [&](int s) { return stage_a(s) + A_STAGE_FLOATS; };

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const ref::Unit unit(whole, split);
    const int tile_m = unit.tile_m, tile_n = unit.tile_n, first_k = unit.first_k;
    const int k_count = unit.k_count;
    const float* batch_a = a + static_cast<size_t>(unit.batch) * M * K;
    const float* batch_b = b + static_cast<size_t>(unit.batch) * K * N;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_count)
            ref::load_stage(stage_a(s), stage_b(s), batch_a, batch_b, tile_m, tile_n, first_k + s);
        ref::commit();
    }

    const int m0 = (warp % WARPS_M) * WARP_M + (lane % 8) * 4;
    const int n0 = (warp / WARPS_M) * WARP_N + (lane / 8) * TN;
    float acc[TM * TN];
    ref::clear(acc);

    int s = 0;
    int refill = STAGES - 1;
    for (int t = 0; t < k_count; ++t) {
        ref::wait_stage();
        __syncthreads();
        if (t + STAGES - 1 < k_count)
            ref::load_stage(stage_a(refill), stage_b(refill), batch_a, batch_b, tile_m, tile_n,
                            first_k + t + STAGES - 1);
        ref::commit();
        ref::fma_stage(stage_a(s), stage_b(s), m0, n0, acc);
        s = s + 1 == STAGES ? 0 : s + 1;
        refill = refill + 1 == STAGES ? 0 : refill + 1;
    }
    ref::wait_all();  // the trailing (empty) copy groups too, before the ring is reused
    ref::finish_unit(smem, c, unit, m0, n0, acc, ref::partial_sum(whole, split));
}
