// Reference FP32 SGEMM for sm_90 and newer: TMA loads into a STAGES-deep shared-memory ring,
// mbarrier hand-offs, no block-wide barrier in the main loop.
//
// Pipeline, per CTA (one work unit: a BM x BN tile of C of one batch entry, a run of its k tiles;
// see Unit in sgemm_common.cuh):
//
//   thread 0: init full[s]; issue TMA for the unit's first STAGES k tiles (A box BM x BK, B box
//             BK x BN)
//   every warp, for each k tile t of the unit (s = t % STAGES):
//     wait full[s]                 the TMA bytes of tile t arrived (expect_tx = STAGE_BYTES)
//     FMA over stage s into the register tile
//     lane 0: count this warp out of stage s; the warp that leaves last refills s with
//             tile t + STAGES
//   park the register tile in the ring, then write it to C (guarded where the tile overhangs
//   M or N; added if the unit holds a partial sum)
//
// No warp is set aside as a producer: a ninth warp would put three warps on one SM sub-partition
// and cap registers at 168 per thread, where the 16 x 8 register tile needs about 255. Because
// whichever warp finishes a stage last issues its refill, no warp waits for another except on
// data, and fast warps run up to STAGES tiles ahead.
//
// The tensor maps are 3-D (rows, columns, batch): TMA zero-fills boxes that overhang M, N or K, so
// ragged sizes need no load-side checks and add nothing to the sum; the transaction count is the
// full box either way. Needs M % 4 == 0 and K % 4 == 0 (TMA strides are multiples of 16 bytes);
// reference.py routes other sizes to the cp.async kernel.
#include "sgemm_common.cuh"

#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

// CUtensorMap, declared here so that the source needs no CUDA headers under NVRTC.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

namespace ref {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void tma_load_3d(void* dst, const TensorMap* map, int c0, int c1, int c2,
                                            unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2),
        "r"(smem_addr(bar))
        : "memory");
}

}  // namespace ref

// Issues k tile `kt` of this CTA's unit into stage `s`.
__device__ __forceinline__ void ref_fill(unsigned char* smem, unsigned long long* full, int s, int kt,
                                         const TensorMap* a_map, const TensorMap* b_map,
                                         const ref::Unit& unit) {
    float* as = reinterpret_cast<float*>(smem + s * STAGE_BYTES);
    ref::mbar_expect_tx(&full[s], STAGE_BYTES);
    ref::tma_load_3d(as, a_map, unit.tile_m, kt * BK, unit.batch, &full[s]);
    ref::tma_load_3d(as + A_STAGE_FLOATS, b_map, kt * BK, unit.tile_n, unit.batch, &full[s]);
}

extern "C" __global__ void __launch_bounds__(CONSUMER_THREADS, MIN_BLOCKS)
    cublas_audit_ref_tma_sgemm(const __grid_constant__ TensorMap a_map,
                               const __grid_constant__ TensorMap b_map, float* __restrict__ c,
                               int whole, int split) {
    extern __shared__ __align__(128) unsigned char smem[];
    // The barriers live past the parked tile too: the epilogue never writes over them.
    unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + DATA_BYTES);
    // Warps that have left each stage, counted up forever: a multiple of CONSUMER_WARPS means
    // every warp is done with the stage's current tile.
    unsigned* released = reinterpret_cast<unsigned*>(full + STAGES);

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const ref::Unit unit(whole, split);
    const int k_count = unit.k_count;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            ref::mbar_init(&full[s], 1);
            released[s] = 0;
        }
        // Make the initialised barriers visible to the async (TMA) proxy.
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int s = 0; s < STAGES && s < k_count; ++s)
            ref_fill(smem, full, s, unit.first_k + s, &a_map, &b_map, unit);
    }
    __syncthreads();

    const int m0 = (warp % WARPS_M) * WARP_M + (lane % 8) * 4;
    const int n0 = (warp / WARPS_M) * WARP_N + (lane / 8) * TN;
    float acc[TM * TN];
    ref::clear(acc);

    int s = 0;
    unsigned phase = 0;
    for (int t = 0; t < k_count; ++t) {
        ref::mbar_wait(&full[s], phase);
        ref::fma_stage(reinterpret_cast<const float*>(smem + s * STAGE_BYTES),
                       reinterpret_cast<const float*>(smem + s * STAGE_BYTES) + A_STAGE_FLOATS,
                       m0, n0, acc);
        __syncwarp();
        if (lane == 0) {
            // Release this warp's reads of stage s before counting out; the last warp out
            // acquires everyone's and only then lets TMA overwrite the stage.
            __threadfence_block();
            const unsigned out = atomicAdd(&released[s], 1u) + 1;
            if (out % CONSUMER_WARPS == 0 && t + STAGES < k_count) {
                __threadfence_block();
                ref_fill(smem, full, s, unit.first_k + t + STAGES, &a_map, &b_map, unit);
            }
        }
        if (++s == STAGES) {
            s = 0;
            phase ^= 1;
        }
    }
    // Every issued copy has been waited for: the ring is idle once all warps are through.
    ref::finish_unit(smem, c, unit, m0, n0, acc, ref::partial_sum(whole, split));
}
