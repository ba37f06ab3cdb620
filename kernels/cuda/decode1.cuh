// Batch-1 decode of a LLaMA-shaped bf16 model as ONE persistent kernel (issue #6: batch-1 decode
// at 80 % / 90 % of the bandwidth floor). The launch-per-op step pays ~5 us of ramp, tail and
// dependency per GEMV launch (docs/CUDA.md, session 6): ~85 launch boundaries per 1B token. Here
// one block per SM runs the whole step, layer after layer, and the op boundaries become grid
// barriers. The weights never depend on the activations: every warp knows, from the compiled
// shapes alone, the sequence of weight tiles it will multiply in this step, and streams them (TMA
// bulk copies, one mbarrier per slot) into its own ring of shared-memory slots as fast as slots
// free up, across op and layer boundaries. While a warp waits at a barrier or the block runs the
// attention, its next tiles keep arriving.
//
// Same bits as the launch-per-op step: every output is summed exactly as the GEMV (linear.cuh:
// gemv_round + gemv_finish) sums it at 1-8 rows: the row's K cut into gemv_ksplit pieces, a lane's chunks of a
// piece lane-strided in increasing order with the 8 products of a chunk in order, a butterfly over
// the warp per piece, the pieces added in order; a folded RMSNorm's sum of squares cut and reduced
// the same way, y = acc * inv. The attention is rope_attention_kernel's (one query head's work):
// the same rotation, the same K/V row written to the cache and read back, the same 16 warps over
// the KV blocks (here spread over 4 blocks per head) with the same online softmax, merged in warp
// order as merge_warps does (tests/cuda/cuda_model_test.cpp: CudaDecode1.KeepsTheBits). From 32
// visible KV blocks on the launches split the context into parts (attention.cuh, "context split")
// and this kernel does not: there its attention's bits differ from theirs.
//
// Ops, per layer: QKV (RMSNorm folded, grouped), attention (+ RoPE, KV append), o_proj + residual,
// gate/up + SwiGLU (RMSNorm folded), down + residual; then the final RMSNorm + lm_head into the
// logits. The CUDA emitter selects it for a model whose step is exactly that (compiler/targets/
// cuda_emitter.cpp: decode1_plan); the runtime runs it for one-token, one-logit-row steps with
// SCR_CUDA_DECODE1=1. It is OFF by default: on the H200 it is slower than the launch-per-op step
// (docs/CUDA.md, "Session 9: a persistent batch-1 decode kernel"). Its SCR_CUDA_DECODE1_TRACE=1
// timings show why: each grid barrier costs ~3 us (fence, atomic, poll), four per layer, and the
// slowest SM sets every phase's end; programmatic dependent launches overlap a kernel boundary
// for less. SCR_CUDA_DECODE1_SYNC=flow runs the dataflow form (decode1_flow_kernel below: a counter
// per produced segment of rows, each phase's input staged piece by piece as its rows land): same
// bits, 0.94x (8B) / 0.79x (1B) the launches on an H100, since every phase needs the whole phase
// before it (docs/CUDA.md, "Session 53").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/linear.cuh"

namespace scr::kernels::cuda {

// One layer's weights (row-major [out][in] bf16; RMSNorm weights f32) and its KV offsets.
struct Decode1Layer {
    const bf16_t* wq = nullptr;
    const bf16_t* wk = nullptr;
    const bf16_t* wv = nullptr;
    const bf16_t* wo = nullptr;
    const bf16_t* wg = nullptr;
    const bf16_t* wu = nullptr;
    const bf16_t* wd = nullptr;
    const float* ln_attn = nullptr;
    const float* ln_mlp = nullptr;
    int64_t k_off = 0, v_off = 0;
};

template <int L, int HALF>
struct Decode1Params {
    Decode1Layer layer[L];
    const bf16_t* embed = nullptr;
    const float* final_norm = nullptr;
    const bf16_t* lm_head = nullptr;
    float eps = 0.0f, eps_final = 0.0f, scale = 0.0f;
    RopeFreqs<HALF> rope;
    DevStep st;
    std::byte* kv = nullptr;
    int64_t block_bytes = 0;
    float* x = nullptr;       // [HID] the residual stream
    float* qkv = nullptr;     // [(HQ + 2 HKV) D]
    float* attn = nullptr;    // [HQ D]
    float* h = nullptr;       // [FFN]
    float* part = nullptr;    // [HQ][16][D + 2]: the attention warps' partial softmaxes
    float* logits = nullptr;  // [VOCAB]
    unsigned* sync = nullptr;  // kDecode1SyncBytes (d1::SyncWord), zero between launches
    bool sync_count = true;    // the grid barriers' form (d1::grid_sync; SCR_CUDA_DECODE1_SYNC)
    int l2_ahead = 0;          // flow form: tiles past its ring each warp asks into L2 before the attention (SCR_CUDA_DECODE1_L2AHEAD)
    unsigned long long* trace = nullptr;  // SCR_CUDA_DECODE1_TRACE=1: per block, the time of each event (d1::Trace)
};

namespace d1 {

constexpr int kSlotBytes = 8192;  // one ring slot: a tile of weights
constexpr int kSlotsPerWarp = 2;
constexpr int kSmemLimit = 227 * 1024;

constexpr int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

// Geometry of one GEMV phase: N rows of K (NSRC matrices read row for row: SwiGLU's gate and up),
// RDIV a divisor of every segment's row count. A unit (U rows, or one row) is one warp's; a tile
// (one ring slot) is TILE_CH chunk positions of it (NSRC x 16 bytes each).
template <int K, int N, int NSRC, int RDIV>
struct Phase {
    static constexpr int kNsrc = NSRC;
    static constexpr int kK = K;
    static_assert(K % 8 == 0, "decode1: K must be a whole number of 16-byte chunks");
    static constexpr int ROW_CH = K / 8;
    static constexpr int KS = detail::gemv_ksplit(N, K, 8);  // the GEMV's pieces: the same sums
    static_assert(ROW_CH % KS == 0, "decode1: the GEMV's K pieces must be equal");
    static constexpr int PC = ROW_CH / KS;  // chunks per piece
    static constexpr int MAXCH = kSlotBytes / (16 * NSRC);
    static constexpr int pick_u() {
        int u = 1;
        while (ROW_CH * u * 2 <= MAXCH && RDIV % (u * 2) == 0) u *= 2;
        return ROW_CH * u <= MAXCH ? u : 1;
    }
    static constexpr int U = pick_u();
    static constexpr int UNIT_CH = U * ROW_CH;
    static constexpr int pick_tile() {
        if (UNIT_CH <= MAXCH) return UNIT_CH;
        if (PC <= MAXCH) {  // whole pieces: the most that fit and divide the row
            for (int d = KS; d >= 1; --d)
                if (KS % d == 0 && PC * d <= MAXCH) return PC * d;
        }
        for (int t = MAXCH - MAXCH % 32; t >= 32; t -= 32)  // part of a piece, in whole lane rounds
            if (PC % t == 0) return t;
        return 0;
    }
    static constexpr int TILE_CH = pick_tile();
    static_assert(TILE_CH > 0, "decode1: no tile of this phase fits a ring slot");
    static constexpr int TPU = UNIT_CH / TILE_CH;  // tiles per unit
    static constexpr int FRAG = PC < TILE_CH ? PC : TILE_CH;  // chunks of one piece within one tile
    static constexpr int FPT = TILE_CH / FRAG;    // fragments per tile
    static constexpr int FPP = PC / FRAG;         // fragments per piece
    static constexpr int J = (FRAG + kWarp - 1) / kWarp;  // a lane's chunks per fragment
    static constexpr int NU = N / U;
    static_assert(N % U == 0);
};

__device__ __forceinline__ uint32_t ld_acquire(const unsigned* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Bulk copies (TMA, one lane issues a whole tile) completing on an mbarrier per ring slot.
__device__ __forceinline__ void mbar_init(uint32_t bar) { asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory"); }
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src),
                 "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

// Timestamps of a launch for SCR_CUDA_DECODE1_TRACE (block-level events, thread 0 records).
struct Trace {
    unsigned long long* t;
    int n = 0;
    static constexpr int kMax = 1024;
    __device__ __forceinline__ void mark() {
        if (t && threadIdx.x == 0 && n < kMax) {
            unsigned long long v;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
            t[size_t(blockIdx.x) * kMax + n] = v;
        }
        ++n;
    }
};

// The sync buffer: barrier arrivals, blocks finished, the barrier's release word (its own 128-byte
// line: the waiting blocks poll it, not the line the arrivals' atomics hit), per-head counters.
// The dataflow form's counters start at kFlow, counter i at kFlow + kLine i (M::kCounters of them).
enum SyncWord : int { kArrive = 0, kExit = 1, kRelease = 32, kHeads = 64, kFlow = 1024, kLine = 32 };

// The dataflow form's spin waits give up after 60 s (a step takes milliseconds; racecheck, which
// serializes the grid, may stretch a wait by 1,000x or more): a wait that never ends is a bug, and
// __trap() turns it into a launch error the caller reports instead of a hung process.
struct SpinGuard {
    unsigned long long t0 = 0;
    unsigned n = 0;
    __device__ __forceinline__ static unsigned long long now() {
        unsigned long long v;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
        return v;
    }
    __device__ __forceinline__ void check() {
        if ((++n & 1023u) != 0) return;
        if (t0 == 0) t0 = now();
        else if (now() - t0 > 60000000000ull) __trap();
    }
};

// Waits until every lane's counter (nullptr: none) holds at least `target`: the warp's lanes poll
// their counters at once, so n counters cost one L2 round trip per poll, not n.
__device__ __forceinline__ void wait_counts(const unsigned* ctr, unsigned target) {
    SpinGuard g;
    for (;;) {
        const bool ok = ctr == nullptr || ld_acquire(ctr) >= target;
        if (__all_sync(0xffffffffu, ok)) break;
        g.check();
    }
    __syncwarp();  // the lanes' acquires ordered before every lane's reads after this
}

// A produced row counted on its segment's counter, after the row's store (lane 0 stores and counts:
// release at gpu scope orders the store before the count for any block that acquires it).
__device__ __forceinline__ void count_row(unsigned* ctr, unsigned n = 1) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(ctr), "r"(n) : "memory");
}

// All blocks of the grid (one per SM, all resident) meet; writes before it are seen after it.
// Two forms (SCR_CUDA_DECODE1_SYNC, for A/B):
// - `count` (the default since session 50): each block adds its arrival with release semantics and
//   no return (red.release), and polls the arrival count itself against the barrier's cumulative
//   target (passed x blocks): one round trip after the last arrival, no full fence. Measured ~0.6 us
//   less per barrier than `publish`, +2.8 % (1B) / +1.3 % (8B) per step, same bits (docs/CUDA.md,
//   "Session 49").
// - `publish` (sessions 9-49): a fence, an atomic whose return tells the last block to arrive, which
//   publishes the barrier's number on its own line; the others poll that line. Two L2 round trips
//   after the last arrival (the atomic's return, then the publish seen by a poll).
__device__ __forceinline__ void grid_sync(unsigned* sync, unsigned& passed, Trace& tr, bool count) {
    __syncthreads();
    tr.mark();
    ++passed;
    if (threadIdx.x == 0) {
        if (count) {
            // Release at gpu scope is cumulative: the block's writes ordered before it by the
            // __syncthreads above are visible to any block whose acquire poll reads the sum.
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sync + kArrive) : "memory");
            const unsigned target = passed * gridDim.x;
            while (ld_acquire(sync + kArrive) < target) {
            }
        } else {
            __threadfence();
            const unsigned old = atomicAdd(sync + kArrive, 1u);
            if (old + 1 == passed * gridDim.x) {
                asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(sync + kRelease), "r"(passed) : "memory");
            } else {
                while (ld_acquire(sync + kRelease) < passed) {
                }
            }
        }
    }
    __syncthreads();
    tr.mark();
}

}  // namespace d1

template <int HID, int HQ, int HKV, int D, int ROT, int FFN, int VOCAB, int L, int BS, typename KVT>
struct Decode1 {
    static constexpr int kHid = HID, kHq = HQ, kD = D, kRot = ROT, kFfn = FFN, kL = L, kBS = BS;
    using KvT = KVT;
    static constexpr int G = HQ / HKV;
    static constexpr int NQ = HQ * D, NKV = HKV * D, NQKV = NQ + 2 * NKV;
    using PQkv = d1::Phase<HID, NQKV, 1, d1::gcd(NQ, NKV)>;
    using PO = d1::Phase<NQ, HID, 1, HID>;
    using PGu = d1::Phase<HID, FFN, 2, FFN>;
    using PDn = d1::Phase<FFN, HID, 1, HID>;
    using PHead = d1::Phase<HID, VOCAB, 1, VOCAB>;
    static constexpr int KMAX = HID > FFN ? (HID > NQ ? HID : NQ) : (FFN > NQ ? FFN : NQ);
    static constexpr int NWV = detail::attention_warps<G, D>();  // rope_attention_kernel's warps over KV blocks
    static constexpr int ATT_FLOATS = 3 * D + NWV * (D + 2);
    static_assert(64 + HQ <= 1024, "decode1: the sync buffer holds a counter per query head");
    // The phase's input, and (RMSNorm phases) the raw rows behind it at act + HID.
    static constexpr int ACT_NEED = KMAX > 2 * HID ? KMAX : 2 * HID;
    static constexpr int ACT_FLOATS = ACT_NEED > ATT_FLOATS ? ACT_NEED : ATT_FLOATS;
    static_assert(HID % 8 == 0 && NQ % 4 == 0 && FFN % 4 == 0);
    static constexpr int ACT_BYTES = (ACT_FLOATS * 4 + 127) / 128 * 128;
    static constexpr int RING_WARP = d1::kSlotsPerWarp * d1::kSlotBytes;
    static constexpr int NW_FIT = (d1::kSmemLimit - ACT_BYTES - 1024) / RING_WARP;
    static constexpr int NW = NW_FIT > 16 ? 16 : NW_FIT;
    static_assert(NW >= 4, "decode1: the activations leave too little shared memory for the weight rings");
    static constexpr int SMEM = ACT_BYTES + NW * RING_WARP;
    static constexpr int kPhasesPerLayer = 4;
    static constexpr int kLastPhase = kPhasesPerLayer * L;  // the lm_head
    static constexpr int UNITS_LAYER = PQkv::NU + PO::NU + PGu::NU + PDn::NU;
    using Params = Decode1Params<L, ROT / 2>;

    // The dataflow form (SCR_CUDA_DECODE1_SYNC=flow; d1::decode1_flow_kernel): a counter per
    // produced segment of rows, cumulative over the layers (a segment of SEG rows is final in
    // layer ly when its counter reaches (ly + 1) SEG). A segment is one consumer piece (the GEMV's K
    // pieces), so a piece waits on as few counters as possible:
    //   qkv rows: a segment per head (q heads, then k and v heads), read by that head's attention;
    //   attn rows: a segment per query head (the merge adds D), read by o's pieces;
    //   x1 (o + residual): gate / up's pieces; h (SwiGLU): down's pieces; x0 (down + residual): the
    //   next layer's QKV pieces (the lm_head's pieces are whole numbers of them).
    static constexpr int SEG_X1 = HID / PGu::KS, SEG_H = FFN / PDn::KS, SEG_X0 = HID / PQkv::KS;
    static constexpr int C_QKV = 0, C_ATT = C_QKV + HQ + 2 * HKV, C_X1 = C_ATT + HQ, C_H = C_X1 + PGu::KS, C_X0 = C_H + PDn::KS;
    static constexpr int kCounters = C_X0 + PQkv::KS;
    static_assert(1024 + 32 * kCounters <= int(kDecode1SyncBytes / 4), "decode1 flow: the counters fit the sync buffer");
    static_assert(NQKV % D == 0 && NQ % D == 0, "decode1 flow: head segments");
    static_assert(PQkv::KS % PHead::KS == 0, "decode1 flow: an lm_head piece is whole x0 segments");
    static_assert(NQ / PO::KS / D + 2 <= kWarp, "decode1 flow: an o piece's heads are polled by one warp");
};


namespace d1 {

// f(phase) with the Phase type of kind `kind` (0-3: QKV, o, gate / up, down; 4: the lm_head).
template <class M, class F>
__device__ __forceinline__ void with_phase(int kind, F&& f) {
    switch (kind) {
        case 0: f(typename M::PQkv{}); break;
        case 1: f(typename M::PO{}); break;
        case 2: f(typename M::PGu{}); break;
        case 3: f(typename M::PDn{}); break;
        default: f(typename M::PHead{}); break;
    }
}

// Units of phase q (layer q / 4, op q % 4; q = 4L the lm_head) and tiles per unit.
template <class M>
__device__ __forceinline__ void phase_shape(int q, int& nu, int& tpu) {
    with_phase<M>(q < M::kLastPhase ? q % M::kPhasesPerLayer : 4, [&](auto ph) {
        nu = decltype(ph)::NU;
        tpu = decltype(ph)::TPU;
    });
}

// Units of the step before phase q (q = 4L: every layer's).
template <class M>
__device__ __forceinline__ long long units_before(int q) {
    const int kind = q < M::kLastPhase ? q % M::kPhasesPerLayer : 0;
    long long b = (long long)(q / M::kPhasesPerLayer) * M::UNITS_LAYER;
    if (kind > 0) b += M::PQkv::NU;
    if (kind > 1) b += M::PO::NU;
    if (kind > 2) b += M::PGu::NU;
    return b;
}

// A warp's walk over its tiles of the step. Unit u of phase q is global warp (u + rot) % GW's, rot =
// the units of the step before the phase, so over the step the warps' shares differ by at most a
// unit per phase. (Claiming units from an atomic counter per phase instead measured much slower:
// 1.45 against 1.08 ms per 1B token; every claim's round trip stalls the warp; docs/CUDA.md.)
struct Loader {
    int q = 0, idx = 0, n = 0, first = 0, tpu = 1;
    int unit = 0, t = 0;  // the current tile
};
struct SlotInfo {
    int q, unit, t;
};
template <class M>
__device__ __forceinline__ void loader_enter(Loader& L, int q, int gw, int GW) {
    for (; q <= M::kLastPhase; ++q) {
        int nu, tpu;
        phase_shape<M>(q, nu, tpu);
        const int rot = int(units_before<M>(q) % GW);
        const int first = ((gw - rot) % GW + GW) % GW;
        if (first < nu) {
            L.q = q;
            L.first = first;
            L.idx = -1;
            L.n = ((nu - 1 - first) / GW + 1) * tpu;
            L.tpu = tpu;
            return;
        }
    }
    L.q = M::kLastPhase + 1;
}
template <class M>
__device__ __forceinline__ void loader_next(Loader& L, int gw, int GW) {
    if (L.q > M::kLastPhase) return;
    if (++L.idx >= L.n) {
        loader_enter<M>(L, L.q + 1, gw, GW);
        if (L.q > M::kLastPhase) return;
        L.idx = 0;
    }
    L.unit = L.first + (L.idx / L.tpu) * GW;
    L.t = L.idx % L.tpu;
}

// Where row `row`'s source `s` of phase kind `kind` (layer `ly`) starts.
template <class M>
__device__ __forceinline__ const bf16_t* row_ptr(const typename M::Params& p, int kind, int ly, int row, int s) {
    switch (kind) {
        case 0: {
            const Decode1Layer& w = p.layer[ly];
            if (row < M::NQ) return w.wq + size_t(row) * M::PQkv::kK;
            if (row < M::NQ + M::NKV) return w.wk + size_t(row - M::NQ) * M::PQkv::kK;
            return w.wv + size_t(row - M::NQ - M::NKV) * M::PQkv::kK;
        }
        case 1: return p.layer[ly].wo + size_t(row) * M::PO::kK;
        case 2: return (s == 0 ? p.layer[ly].wg : p.layer[ly].wu) + size_t(row) * M::PGu::kK;
        case 3: return p.layer[ly].wd + size_t(row) * M::PDn::kK;
        default: return p.lm_head + size_t(row) * M::PHead::kK;
    }
}

// Tile `t` of unit `unit` into `slot` (lane 0): the unit's rows are contiguous in memory and a tile
// is a contiguous chunk range of them, so one bulk copy per source, landing at s * TILE_CH * 16.
template <class M, class P>
__device__ __forceinline__ void issue_tile(const typename M::Params& p, int kind, int ly, int unit, int t, unsigned char* slot, uint32_t bar) {
    constexpr uint32_t kBytes = P::TILE_CH * 16;
    mbar_expect(bar, kBytes * P::kNsrc);
#pragma unroll
    for (int s = 0; s < P::kNsrc; ++s)
        bulk_copy(smem_addr(slot + size_t(s) * kBytes), row_ptr<M>(p, kind, ly, unit * P::U, s) + size_t(t) * P::TILE_CH * 8, kBytes, bar);
}

// The loader's next `n` tiles (the ones its ring has no room for yet) asked into L2 (lane 0): a
// warp about to idle (the attention) keeps HBM busy with the weights it streams next.
template <class M>
__device__ __forceinline__ void prefetch_ahead(const typename M::Params& p, Loader L, int n, int gw, int GW) {
    for (int i = 0; i < n && L.q <= M::kLastPhase; ++i, loader_next<M>(L, gw, GW)) {
        const int kind = L.q < M::kLastPhase ? L.q % M::kPhasesPerLayer : 4, ly = L.q / M::kPhasesPerLayer;
        with_phase<M>(kind, [&](auto phase) {
            using P = decltype(phase);
            constexpr uint32_t kBytes = P::TILE_CH * 16;
            for (int s = 0; s < P::kNsrc; ++s)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(row_ptr<M>(p, kind, ly, L.unit * P::U, s) +
                                                                              size_t(L.t) * P::TILE_CH * 8),
                             "r"(kBytes)
                             : "memory");
        });
    }
}

// The loader (lane 0; the other lanes skip): the loader's tile, if any, into `slot`, and what it
// is into `info` (the step's end: q = 4L + 1).
template <class M>
__device__ __forceinline__ void issue(const typename M::Params& p, const Loader& L, unsigned char* slot, uint32_t bar, SlotInfo* info,
                                      int lane) {
    if (lane != 0) return;
    *info = SlotInfo{L.q, L.unit, L.t};
    if (L.q > M::kLastPhase) return;
    const int kind = L.q < M::kLastPhase ? L.q % M::kPhasesPerLayer : 4;
    const int ly = L.q / M::kPhasesPerLayer;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the slot's earlier reads before the async writes
    with_phase<M>(kind, [&](auto ph) { issue_tile<M, decltype(ph)>(p, kind, ly, L.unit, L.t, slot, bar); });
}

// A warp's ring started: its slots' mbarriers set up and its first tiles in flight (they depend on
// nothing earlier, so both kernels issue them before pdl_wait); `ld` then holds the next tile.
template <class M>
__device__ __forceinline__ void ring_start(const typename M::Params& p, Loader& ld, unsigned char* ring, uint32_t bars, SlotInfo* info,
                                           int gw, int GW, int lane) {
    if (lane == 0)
        for (int s = 0; s < kSlotsPerWarp; ++s) mbar_init(bars + 8u * s);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
    loader_enter<M>(ld, 0, gw, GW);
    for (int s = 0; s < kSlotsPerWarp; ++s) {
        loader_next<M>(ld, gw, GW);
        issue<M>(p, ld, ring + size_t(s) * kSlotBytes, bars + 8u * s, info + s, lane);
    }
    loader_next<M>(ld, gw, GW);
    __syncwarp();
}

// Copies K floats of global `src` (written by other blocks before the last grid barrier: L2, not
// L1) into shared `dst`, every thread's 16-byte loads issued before any is stored.
template <int K, int NT>
__device__ __forceinline__ void stage(const float* src, float* dst) {
    constexpr int V = K / 4, PER = (V + NT - 1) / NT;
    float4 r[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = threadIdx.x + j * NT;
        if (i < V) r[j] = __ldcg(reinterpret_cast<const float4*>(src) + i);
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = threadIdx.x + j * NT;
        if (i < V) reinterpret_cast<float4*>(dst)[i] = r[j];
    }
}

// The 8 values of chunk c of a phase's input: float rows written by other blocks (from L2, not
// L1), or the bf16 embedding row.
template <typename XT>
__device__ __forceinline__ void load_chunk(const XT* x, int c, float (&v)[8]) {
    if constexpr (std::is_same_v<XT, float>) {
        const float4 a = __ldcg(reinterpret_cast<const float4*>(x) + 2 * c);
        const float4 b = __ldcg(reinterpret_cast<const float4*>(x) + 2 * c + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
        Vec16<XT>::unpack(*reinterpret_cast<const uint4*>(x + size_t(c) * 8), v);
    }
}
// The 8 RMSNorm weights of chunk c (read-only data).
__device__ __forceinline__ void load_weights8(const float* w, int c, float (&v)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(w) + 2 * c);
    const float4 b = __ldg(reinterpret_cast<const float4*>(w) + 2 * c + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// The input of a phase with a folded RMSNorm: act = x * w (as the GEMV's xf *= nw) and the raw x
// at act + K, then the GEMV's 1 / rms: each of the phase's KS pieces' sums of squares over
// lane-strided chunks, a butterfly, then the pieces in order. `x` is the residual stream, or (layer
// 0) the bf16 embedding row. Loads are all issued before use (one L2 / HBM latency, not K / NT).
template <class P, int NT, typename XT>
__device__ __forceinline__ float norm_act(const XT* x, const float* w, float eps, float* act, float* red) {
    constexpr int K = P::kK;
    constexpr int V = K / 8, PER = (V + NT - 1) / NT;  // 8-float chunks
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    float* xs = act + K;
    float xv[PER][8], wv[PER][8];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int c = threadIdx.x + j * NT;
        if (c >= V) continue;
        load_chunk(x, c, xv[j]);
        load_weights8(w, c, wv[j]);
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int c = threadIdx.x + j * NT;
        if (c >= V) continue;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            xs[c * 8 + i] = xv[j][i];
            act[c * 8 + i] = xv[j][i] * wv[j][i];
        }
    }
    __syncthreads();
    for (int s = warp; s < P::KS; s += NT / kWarp) {
        float ss = 0.0f;
        for (int c = s * P::PC + lane; c < (s + 1) * P::PC; c += kWarp)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float v = xs[c * 8 + i];
                ss += v * v;
            }
        ss = warp_sum(ss);
        if (lane == 0) red[s] = ss;
    }
    __syncthreads();
    float ss;
    if constexpr (P::KS > 1) {
        ss = 0.0f;
        for (int s = 0; s < P::KS; ++s) ss += red[s];
    } else {
        ss = red[0];
    }
    return 1.0f / sqrtf(ss / float(K) + eps);
}

// The dataflow form's view of a phase for its consumer warps (decode1_flow_kernel): the block's
// stager warp stages the phase's input piece by piece into `act` and counts the pieces in `staged`
// (cumulative over the step's phases: piece kp of this phase is there once staged > seq0 + kp); a
// norm phase's per-piece sums of squares land in `red`. Rows are counted on `ctr` (nullptr: the
// lm_head's, which nothing reads). `res0`: layer 0's o reads its residual from the embedding row.
struct FlowIn {
    const volatile unsigned* staged = nullptr;
    unsigned seq0 = 0;
    const float* red = nullptr;
    float eps = 0.0f;
    unsigned* ctr = nullptr;
    int seg = 1;
    const bf16_t* res0 = nullptr;
};

// Consumes this warp's tiles of phase q (kind KIND) from its ring: the GEMV's sums per row, then
// the epilogue by lane 0. Each consumed slot is refilled at once with the loader's next tile.
// FLOW (decode1_flow_kernel): each piece of the input is waited for as the warp first reaches it,
// a norm phase's 1 / rms is taken from the staged pieces' sums once a row is done (the same sum as
// norm_act's), and each finished row is counted for its readers.
template <class M, class P, int KIND, bool FLOW = false>
__device__ __forceinline__ void consume(const typename M::Params& p, int q, Loader& ld, int gw, int GW, SlotInfo* info,
                                        unsigned char* ring, uint32_t bars, unsigned& ci, const float* act, float inv,
                                        const FlowIn& fl = FlowIn{}) {
    const int lane = threadIdx.x % kWarp;
    constexpr int NS = P::kNsrc;
    float part[NS], v[NS];
#pragma unroll
    for (int s = 0; s < NS; ++s) part[s] = v[s] = 0.0f;
    float res = 0.0f;  // residual phases: x[row] of the unit's row `lane`, read ahead of its use
    int have = 0;      // FLOW: pieces of this phase known staged
    bool inv_known = false;  // FLOW, a norm phase: whether inv is taken from the staged sums yet
    for (;;) {
        const int slot = int(ci % d1::kSlotsPerWarp);
        const SlotInfo si = info[slot];
        if (si.q != q) break;
        const int unit = si.unit, t = si.t;
        if constexpr (!FLOW && (KIND == 1 || KIND == 3)) {
            if (t == 0 && lane < P::U) res = __ldcg(p.x + unit * P::U + lane);
        }
        const uint32_t bar = bars + 8u * slot;
        mbar_wait(bar, (ci / d1::kSlotsPerWarp) & 1u);
        unsigned char* tile = ring + size_t(slot) * d1::kSlotBytes;
#pragma unroll
        for (int f = 0; f < P::FPT; ++f) {
            const int gf = t * P::FPT + f, pi = gf / P::FPP, sub = gf % P::FPP;
            const int kp = pi % P::KS;
            const int cbase = kp * P::PC + sub * P::FRAG;
            if constexpr (FLOW) {
                if (sub == 0 && kp >= have) {  // the piece's input: staged by the block's stager warp
                    unsigned st;
                    SpinGuard g;
                    while ((st = *fl.staged) <= fl.seq0 + unsigned(kp)) g.check();
                    __syncwarp();
                    __threadfence_block();
                    have = min(int(st - fl.seq0), P::KS);
                }
                if constexpr (KIND == 1 || KIND == 3) {
                    // The residual row, read once the unit's first piece is in: every row of the
                    // phase's input is final by then (each came from rows that read all of x).
                    if (gf == 0 && lane < P::U) {
                        const int r = unit * P::U + lane;
                        res = fl.res0 ? to_f32(fl.res0[r]) : __ldcg(p.x + r);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < P::J; ++j) {
                const int c = lane + j * kWarp;
                if (P::FRAG % kWarp != 0 && c >= P::FRAG) break;
                const float4 x0 = *reinterpret_cast<const float4*>(act + (cbase + c) * 8);
                const float4 x1 = *reinterpret_cast<const float4*>(act + (cbase + c) * 8 + 4);
                const float xf[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int s = 0; s < NS; ++s) {
                    const uint4 wv = *reinterpret_cast<const uint4*>(tile + size_t(s * P::TILE_CH + f * P::FRAG + c) * 16);
                    float wf[8];
                    Vec16<bf16_t>::unpack(wv, wf);
#pragma unroll
                    for (int i = 0; i < 8; ++i) part[s] += xf[i] * wf[i];
                }
            }
            if (sub == P::FPP - 1) {  // a piece done: its butterfly, added in piece order
#pragma unroll
                for (int s = 0; s < NS; ++s) {
                    const float ps = warp_sum(part[s]);
                    part[s] = 0.0f;
                    if (kp == 0) v[s] = P::KS > 1 ? 0.0f + ps : ps;
                    else v[s] += ps;
                }
                if (kp == P::KS - 1) {  // a row done
                    const int row = unit * P::U + pi / P::KS;
                    float r0 = 0.0f;
                    if constexpr (KIND == 1 || KIND == 3) r0 = __shfl_sync(0xffffffffu, res, pi / P::KS);
                    if constexpr (FLOW && KIND != 1 && KIND != 3) {
                        if (!inv_known) {  // a norm phase: every piece is staged once a row is done
                            float ss;
                            if constexpr (P::KS > 1) {
                                ss = 0.0f;
                                for (int s = 0; s < P::KS; ++s) ss += fl.red[s];
                            } else {
                                ss = fl.red[0];
                            }
                            inv = 1.0f / sqrtf(ss / float(P::kK) + fl.eps);
                            inv_known = true;
                        }
                    }
                    if (lane != 0) {
                    } else if constexpr (KIND == 0) {
                        p.qkv[row] = v[0] * inv;
                    } else if constexpr (KIND == 1 || KIND == 3) {
                        p.x[row] = r0 + v[0];
                    } else if constexpr (KIND == 2) {
                        p.h[row] = silu(v[0] * inv) * (v[NS - 1] * inv);
                    } else {
                        p.logits[row] = v[0] * inv;
                    }
                    if constexpr (FLOW && KIND != 4) {
                        if (lane == 0) count_row(fl.ctr + size_t(row / fl.seg) * kLine);
                    }
                }
            }
        }
        __syncwarp();  // every lane is done with the slot (and its info) before it is refilled
        issue<M>(p, ld, tile, bar, info + slot, lane);
        loader_next<M>(ld, gw, GW);
        __syncwarp();  // the new info is seen by every lane
        ++ci;
    }
}

// Pulls into L2 the K/V rows this block's attention items will read (written by earlier steps), a
// phase ahead of the attention, so its key loop waits on L2 rather than HBM.
template <class M>
__device__ __forceinline__ void prefetch_kv(const typename M::Params& p, int ly, int tid, int nthreads) {
    constexpr int D = M::kD, G = M::G, NWV = M::NWV, BS = M::kBS;
    constexpr int kRowBytes = BS * D * int(sizeof(typename M::KvT));
    const AttnToken tk = attn_token(p.st, 0, AttnExtras{});
    const int nblocks = (tk.ctx + BS - 1) / BS;
    const int VS = max(1, min(NWV, int(gridDim.x) / M::kHq)), VPB = (NWV + VS - 1) / VS;
    const Decode1Layer& w = p.layer[ly];
    for (int item = blockIdx.x; item < M::kHq * VS; item += gridDim.x) {
        const int g = (item / VS) / G, part = item % VS;
        const int lines = kRowBytes / 128;
        for (int vw = part * VPB; vw < min(NWV, (part + 1) * VPB); ++vw)
            for (int i = tid; i < ((nblocks - vw + NWV - 1) / NWV) * lines; i += nthreads) {
                const int blk = vw + (i / lines) * NWV;
                if (blk >= nblocks) break;
                const std::byte* base = p.kv + int64_t(tk.table[blk]) * p.block_bytes + size_t(g) * kRowBytes + (i % lines) * 128;
                asm volatile("prefetch.global.L2 [%0];" ::"l"(base + w.k_off));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(base + w.v_off));
            }
    }
}

// Decode attention of layer `ly` for the step's one token: rope_attention_kernel's arithmetic
// (GS = G: one query head's work is the same in any grouping; warp_attend_vec where attend_vec_on,
// as the launches take with SCR_CUDA_ATTN_VEC unset, else a copy of attend_group's scalar loop)
// with its NWV warps over KV blocks spread over VS blocks per head, NWV / VS each, so that 4x more
// SMs share the latency-bound key
// loop. Every block of a head rotates q and k and writes the same K/V row to the slot (the same
// bits, as the GS split does), reads it back, and writes its warps' (max, sum, weighted V) to
// `part`; the head's block 0 waits for the others (a counter per head, not a grid barrier), then
// merges all NWV in warp order exactly as merge_warps does.
// FLOW (decode1_flow_kernel): an item waits for its head's q rows and its group's k and v rows
// (their counters) instead of a grid barrier, and the merged head is counted for o's pieces.
template <class M, bool FLOW = false>
__device__ __forceinline__ void attention(const typename M::Params& p, int ly, float* sm) {
    constexpr int D = M::kD, G = M::G, NWV = M::NWV, BS = M::kBS, ROT = M::kRot, kHalf = ROT / 2;
    constexpr int DPL = (D + kWarp - 1) / kWarp;
    constexpr int PS = D + 2;  // a warp's partial: acc[D], m, l
    using KVT = typename M::KvT;
    float* sq = sm;
    float* sk = sm + D;
    float* sv = sm + 2 * D;
    float* merge = sm + 3 * D;  // [NWV][PS]
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const AttnToken tk = attn_token(p.st, 0, AttnExtras{});
    const int nblocks = (tk.ctx + BS - 1) / BS;
    const Decode1Layer& w = p.layer[ly];
    const int VS = max(1, min(NWV, int(gridDim.x) / M::kHq));  // every item of a head runs at once: no block waits on itself
    const int VPB = (NWV + VS - 1) / VS;
    unsigned* head_done = p.sync + kHeads;
    for (int item = blockIdx.x; item < M::kHq * VS; item += gridDim.x) {
        const int h = item / VS, part = item % VS;
        const int g = h / G;
        if constexpr (FLOW) {
            if (warp == 0) {
                const int seg = lane == 0 ? h : lane == 1 ? M::kHq + g : M::kHq + M::NKV / D + g;
                wait_counts(lane < 3 ? p.sync + kFlow + size_t(M::C_QKV + seg) * kLine : nullptr, unsigned(ly + 1) * D);
            }
            __syncthreads();
        }
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            sq[i] = __ldcg(p.qkv + h * D + i);
            sk[i] = __ldcg(p.qkv + M::NQ + g * D + i);
            sv[i] = __ldcg(p.qkv + M::NQ + M::NKV + g * D + i);
        }
        __syncthreads();
        const float pos = float(tk.ctx - 1);
        for (int wi = threadIdx.x; wi < 2 * kHalf; wi += blockDim.x) {
            float* head = wi < kHalf ? sq : sk;
            const int i = wi % kHalf;
            float sn, cs;
            sincosf(pos * p.rope.inv_freq[i], &sn, &cs);
            detail::rotate_pair<ROT>(head, head, i, cs, sn);
        }
        __syncthreads();
        const int64_t slot = p.st.slot_mapping[0];
        if (slot >= 0) {
            std::byte* base = p.kv + (slot / BS) * p.block_bytes;
            KVT* kd = reinterpret_cast<KVT*>(base + w.k_off) + (size_t(g) * BS + slot % BS) * D;
            KVT* vd = reinterpret_cast<KVT*>(base + w.v_off) + (size_t(g) * BS + slot % BS) * D;
            for (int i = threadIdx.x; i < D; i += blockDim.x) {
                kd[i] = from_f32<KVT>(sk[i]);
                vd[i] = from_f32<KVT>(sv[i]);
            }
        }
        __syncthreads();  // the block's own K/V writes are visible to its threads: read back below
        for (int vw = part * VPB + warp; vw < min(NWV, (part + 1) * VPB); vw += M::NW) {
            float* out = p.part + (size_t(h) * NWV + vw) * PS;
            if constexpr (detail::attend_vec_on<G, D, BS, KVT>()) {
                // attend_group_vec's per-warp work, the same arithmetic as the launches take
                using L = detail::KvVec<D, KVT>;
                float m[1], l[1], acc[1][L::Vn];
                detail::VecAhead<1, D, BS, KVT> ahead;
                detail::warp_attend_vec<1, D, BS, KVT>(g, tk.ctx, tk.first, tk.table, tk.first / BS + vw, NWV, sq, p.kv, p.block_bytes,
                                                       w.k_off, w.v_off, p.scale, 0.0f, nullptr, nullptr, ahead, m, l, acc);
                if (lane < L::LPR) {
#pragma unroll
                    for (int e = 0; e < L::Vn; ++e) out[lane * L::Vn + e] = acc[0][e];
                }
                if (lane == 0) {
                    out[D] = m[0];
                    out[D + 1] = l[0];
                }
                continue;
            }
            float qr[DPL], acc[DPL], m = -INFINITY, l = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const int d = lane + i * kWarp;
                qr[i] = d < D ? sq[d] : 0.0f;
                acc[i] = 0.0f;
            }
            for (int blk = tk.first / BS + vw; blk < nblocks; blk += NWV) {
                const std::byte* base = p.kv + int64_t(tk.table[blk]) * p.block_bytes;
                const KVT* kb = reinterpret_cast<const KVT*>(base + w.k_off) + size_t(g) * BS * D;
                const KVT* vb = reinterpret_cast<const KVT*>(base + w.v_off) + size_t(g) * BS * D;
                const int j0 = max(0, tk.first - blk * BS), n = min(BS, tk.ctx - blk * BS);
                constexpr int kKeys = BS % 8 == 0 ? 8 : (BS % 4 == 0 ? 4 : 1);
                for (int jg = 0; jg < BS; jg += kKeys) {
                    if (jg >= n) break;
                    if (jg + kKeys <= j0) continue;
                    float kd[kKeys][DPL], vd[kKeys][DPL];
#pragma unroll
                    for (int jj = 0; jj < kKeys; ++jj) {
                        const int j = jg + jj;
                        const bool live = j >= j0 && j < n;
#pragma unroll
                        for (int i = 0; i < DPL; ++i) {
                            const int d = lane + i * kWarp;
                            kd[jj][i] = live && d < D ? to_f32(kb[size_t(j) * D + d]) : 0.0f;
                            vd[jj][i] = live && d < D ? to_f32(vb[size_t(j) * D + d]) : 0.0f;
                        }
                    }
                    float sc[kKeys];
                    float m_grp = m;
#pragma unroll
                    for (int jj = 0; jj < kKeys; ++jj) {
                        float s = 0.0f;
#pragma unroll
                        for (int i = 0; i < DPL; ++i) s += qr[i] * kd[jj][i];
                        s = warp_sum(s) * p.scale;
                        const int j = jg + jj;
                        sc[jj] = (j >= j0 && j < n) ? s : -INFINITY;
                        m_grp = fmaxf(m_grp, sc[jj]);
                    }
                    const float alpha = expf(m - m_grp);
                    l *= alpha;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) acc[i] *= alpha;
#pragma unroll
                    for (int jj = 0; jj < kKeys; ++jj) {
                        const float pr = expf(sc[jj] - m_grp);
                        l += pr;
#pragma unroll
                        for (int i = 0; i < DPL; ++i) acc[i] += pr * vd[jj][i];
                    }
                    m = m_grp;
                }
            }
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const int d = lane + i * kWarp;
                if (d < D) out[d] = acc[i];
            }
            if (lane == 0) {
                out[D] = m;
                out[D + 1] = l;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(head_done + h, 1u);
            if (part == 0)
                while (ld_acquire(head_done + h) < unsigned(ly + 1) * unsigned(VS)) {
                }
            __threadfence();
        }
        __syncthreads();
        if (part == 0) {
            for (int i = threadIdx.x; i < NWV * PS; i += blockDim.x) merge[i] = __ldcg(p.part + size_t(h) * NWV * PS + i);
            __syncthreads();
            for (int d = threadIdx.x; d < D; d += blockDim.x) {  // merge_combine, no sinks
                float mx = -INFINITY;
                for (int v = 0; v < NWV; ++v) mx = fmaxf(mx, merge[v * PS + D]);
                float sum = 0.0f, val = 0.0f;
                for (int v = 0; v < NWV; ++v) {
                    const float f = merge[v * PS + D + 1] > 0.0f ? expf(__fsub_rn(merge[v * PS + D], mx)) : 0.0f;
                    sum = __fmaf_rn(merge[v * PS + D + 1], f, sum);
                    val = __fmaf_rn(merge[v * PS + d], f, val);
                }
                p.attn[h * D + d] = __fdiv_rn(val, sum);
            }
        }
        __syncthreads();  // before the next item reuses the buffers
        if constexpr (FLOW) {
            if (part == 0 && threadIdx.x == 0) count_row(p.sync + kFlow + size_t(M::C_ATT + h) * kLine, D);
        }
    }
}

template <class M>
__global__ void __launch_bounds__(M::NW * kWarp, 1) decode1_kernel(const __grid_constant__ typename M::Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float red[8];
    constexpr int NT = M::NW * kWarp;
    float* act = reinterpret_cast<float*>(smem);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    unsigned char* ring = smem + M::ACT_BYTES + size_t(warp) * M::RING_WARP;

    // The weights depend on nothing earlier: the first tiles fly before the wait.
    __shared__ __align__(8) unsigned long long mbar[M::NW][kSlotsPerWarp];
    __shared__ SlotInfo slot_info[M::NW][kSlotsPerWarp];
    SlotInfo* info = &slot_info[warp][0];
    const int GW = int(gridDim.x) * M::NW, gw = int(blockIdx.x) * M::NW + warp;
    const uint32_t bars = smem_addr(&mbar[warp][0]);
    Loader ld;
    ring_start<M>(p, ld, ring, bars, info, gw, GW, lane);
    pdl_wait();
    unsigned ci = 0;  // this warp's tiles consumed: slot ci % kSlotsPerWarp, its mbarrier's parity (ci / kSlotsPerWarp) & 1
    unsigned passed = 0;
    Trace tr{p.trace};
    tr.mark();
    const int32_t token = p.st.token_ids[0];
    const bf16_t* erow = p.embed + size_t(token) * M::kHid;
    for (int ly = 0; ly < M::kL; ++ly) {
        const Decode1Layer& w = p.layer[ly];
        const int q = ly * M::kPhasesPerLayer;
        float inv;
        if (ly == 0) {
            // The embedding row is layer 0's input; each block also writes its share of x.
            inv = norm_act<typename M::PQkv, NT>(erow, w.ln_attn, p.eps, act, red);
            const int per = (M::kHid + gridDim.x - 1) / gridDim.x;
            for (int k = blockIdx.x * per + threadIdx.x; k < min(M::kHid, int(blockIdx.x + 1) * per); k += blockDim.x)
                p.x[k] = to_f32(erow[k]);
        } else {
            inv = norm_act<typename M::PQkv, NT>(p.x, w.ln_attn, p.eps, act, red);
        }
        __syncthreads();
        tr.mark();
        prefetch_kv<M>(p, ly, threadIdx.x, blockDim.x);
        consume<M, typename M::PQkv, 0>(p, q, ld, gw, GW, info, ring, bars, ci, act, inv);
        grid_sync(p.sync, passed, tr, p.sync_count);
        attention<M>(p, ly, act);
        grid_sync(p.sync, passed, tr, p.sync_count);
        stage<M::NQ, NT>(p.attn, act);
        __syncthreads();
        tr.mark();
        consume<M, typename M::PO, 1>(p, q + 1, ld, gw, GW, info, ring, bars, ci, act, 1.0f);
        grid_sync(p.sync, passed, tr, p.sync_count);
        inv = norm_act<typename M::PGu, NT>(p.x, w.ln_mlp, p.eps, act, red);
        __syncthreads();
        tr.mark();
        consume<M, typename M::PGu, 2>(p, q + 2, ld, gw, GW, info, ring, bars, ci, act, inv);
        grid_sync(p.sync, passed, tr, p.sync_count);
        stage<M::kFfn, NT>(p.h, act);
        __syncthreads();
        tr.mark();
        consume<M, typename M::PDn, 3>(p, q + 3, ld, gw, GW, info, ring, bars, ci, act, 1.0f);
        grid_sync(p.sync, passed, tr, p.sync_count);
    }
    const float inv = norm_act<typename M::PHead, NT>(p.x, p.final_norm, p.eps_final, act, red);
    __syncthreads();
    tr.mark();
    consume<M, typename M::PHead, 4>(p, M::kLastPhase, ld, gw, GW, info, ring, bars, ci, act, inv);
    __syncthreads();
    tr.mark();
    // The last block out zeroes the counters for the next launch (every block is past every barrier).
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(p.sync + kExit, 1u) == gridDim.x - 1) {
            for (int i = 0; i < kHeads + M::kHq; ++i) p.sync[i] = 0;
            __threadfence();
        }
    }
}

// ---- The dataflow form (SCR_CUDA_DECODE1_SYNC=flow) ----
// decode1_kernel's grid barriers replaced by counters: every produced row is counted on its
// segment's counter (Decode1::C_*), and a phase's input is staged piece by piece (the GEMV's K
// pieces) as the counters of that piece's rows fill, so a warp starts multiplying piece 0 while
// the slowest SMs still write the last rows of the piece the phase ends with, and no block waits
// for every other block. The block's last warp is its stager: for each phase in order it waits
// until the block's consumer warps are done with the previous phase's input (one act buffer), then
// polls the counters of the pieces not yet staged, stages the ready ones into shared memory (x * w
// and each piece's sum of squares for a norm phase, as norm_act computes them) and publishes them
// on a shared-memory word the consumer warps poll (stager_phase). The other warps stream and
// multiply their tiles as before
// (consume<..., FLOW>). The attention stays block-wide, its items waiting on their head's
// counters. Same bits as decode1_kernel (and so as the launches): the same sums in the same order.
//
// Why no buffer is overwritten early, with x rewritten in place by o and down: any row of a phase
// needs all of that phase's input, so (e.g.) once any o row is written every qkv row is, and every
// qkv row needed every piece of x staged by its block; the same chain covers h, attn, qkv and the
// attention's partials from layer to layer.

// Stages piece kp of a phase's input (rows [kp PC 8, (kp + 1) PC 8) of x) into act, as x * w with
// the piece's sum of squares in red[kp] (NORM: norm_act's lane-strided chunks in order and its
// butterfly), or as x. One warp; at most B chunks per lane loaded before they are stored. Used for
// layer 0's bf16 embedding row (stage_range takes every float input).
template <class P, bool NORM, typename XT>
__device__ __forceinline__ void stage_piece(const XT* x, const float* w, int kp, float* act, float* red, int lane) {
    constexpr int PER = (P::PC + kWarp - 1) / kWarp, B = NORM ? 4 : 8;
    float ss = 0.0f;
#pragma unroll
    for (int j0 = 0; j0 < PER; j0 += B) {
        float xv[B][8], wv[B][8];
#pragma unroll
        for (int j = 0; j < B; ++j) {
            const int i = lane + (j0 + j) * kWarp;
            if (j0 + j >= PER || i >= P::PC) continue;
            const int c = kp * P::PC + i;
            load_chunk(x, c, xv[j]);
            if constexpr (NORM) load_weights8(w, c, wv[j]);
        }
#pragma unroll
        for (int j = 0; j < B; ++j) {
            const int i = lane + (j0 + j) * kWarp;
            if (j0 + j >= PER || i >= P::PC) continue;
            const int c = kp * P::PC + i;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                act[c * 8 + e] = NORM ? xv[j][e] * wv[j][e] : xv[j][e];
                if constexpr (NORM) ss += xv[j][e] * xv[j][e];
            }
        }
    }
    if constexpr (NORM) {
        ss = warp_sum(ss);
        if (lane == 0) red[kp] = ss;
    }
}

// Pieces [k0, k1) staged as stage_piece stages each, as one range: every lane's chunks of them (the
// lane-strided chunks of each piece, as norm_act takes them) copied into act by cp.async (L2, no
// registers), a norm phase's weights beside them in act's second half (norm phases stage HID
// floats; act holds 2 HID), all in one round trip; then, for a norm phase, act = x * w in place and
// each piece's sum of squares over the same chunks in the same order, its butterfly into red[kp].
// (Layer 0's bf16 embedding row, which cp.async cannot convert, goes through stage_piece.)
template <class P, bool NORM, typename XT>
__device__ __forceinline__ void stage_range(const XT* x, const float* w, int k0, int k1, float* act, float* red, int lane) {
    if constexpr (!std::is_same_v<XT, float>) {
        for (int kp = k0; kp < k1; ++kp) stage_piece<P, NORM>(x, w, kp, act, red, lane);
    } else {
        float* const ws = act + P::kK;
        for (int c = k0 * P::PC + lane; c < k1 * P::PC; c += kWarp) {
            cp_async16(smem_addr(act + c * 8), x + size_t(c) * 8);
            cp_async16(smem_addr(act + c * 8 + 4), x + size_t(c) * 8 + 4);
            if constexpr (NORM) {
                cp_async16(smem_addr(ws + c * 8), w + size_t(c) * 8);
                cp_async16(smem_addr(ws + c * 8 + 4), w + size_t(c) * 8 + 4);
            }
        }
        cp_async_commit();
        cp_async_wait(0);
        __syncwarp();  // every lane's copies landed: the pass below reads chunks other lanes copied
        if constexpr (NORM) {
            for (int kp = k0; kp < k1; ++kp) {
                float ss = 0.0f;
                for (int c = kp * P::PC + lane; c < (kp + 1) * P::PC; c += kWarp) {
                    const float4 a = *reinterpret_cast<const float4*>(act + c * 8), b = *reinterpret_cast<const float4*>(act + c * 8 + 4);
                    const float4 u = *reinterpret_cast<const float4*>(ws + c * 8), v = *reinterpret_cast<const float4*>(ws + c * 8 + 4);
                    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}, wv[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
                    float out[8];
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        out[e] = xv[e] * wv[e];
                        ss += xv[e] * xv[e];
                    }
                    *reinterpret_cast<float4*>(act + c * 8) = make_float4(out[0], out[1], out[2], out[3]);
                    *reinterpret_cast<float4*>(act + c * 8 + 4) = make_float4(out[4], out[5], out[6], out[7]);
                }
                const float t = warp_sum(ss);
                if (lane == 0) red[kp] = t;
            }
        }
    }
}

// The stager's side of one phase: wait for the block's consumers to leave the previous phase,
// then, until every piece is out: poll the counters of all pieces not yet staged at once (range(kp)
// = {first, n}: piece kp's segments are counters first .. first + n - 1; one lane each, up to a
// warp's worth of them), stage the longest run of ready pieces as one range, publish it. (ctr
// nullptr: nothing to wait for.) Several pieces often land together (o's rows all end its phase),
// and then they cost one poll and one load round trip, not one of each per piece.
template <class P, bool NORM, typename XT, class Range>
__device__ __forceinline__ void stager_phase(const XT* x, const float* w, float* act, float* red, volatile unsigned* staged,
                                             unsigned& seq, const volatile unsigned* done, unsigned done_target, const unsigned* ctr,
                                             unsigned target, Range range, int lane) {
    SpinGuard g;
    while (*done < done_target) g.check();
    __syncwarp();
    __threadfence_block();
    for (int k0 = 0; k0 < P::KS;) {
        int k1 = P::KS;
        if (ctr) {
            SpinGuard gp;
            for (;;) {
                const unsigned* mine = nullptr;  // this lane's segment counter
                for (int kp = k0, at = 0; kp < P::KS; ++kp) {
                    const int2 r = range(kp);
                    if (lane >= at && lane < at + r.y) mine = ctr + size_t(r.x + lane - at) * kLine;
                    at += r.y;
                }
                const unsigned late = __ballot_sync(0xffffffffu, mine != nullptr && ld_acquire(mine) < target);
                k1 = k0;
                for (int kp = k0, at = 0; kp < P::KS; ++kp) {  // the ready run: pieces wholly polled, none late
                    const int2 r = range(kp);
                    if (at + r.y > kWarp) break;
                    const unsigned lanes = (r.y == kWarp ? 0xffffffffu : ((1u << r.y) - 1u)) << at;
                    if (late & lanes) break;
                    at += r.y;
                    k1 = kp + 1;
                }
                if (k1 > k0) break;
                gp.check();
            }
            __syncwarp();  // the lanes' acquires ordered before every lane's reads of the pieces
        }
        stage_range<P, NORM>(x, w, k0, k1, act, red, lane);
        __threadfence_block();
        __syncwarp();
        seq += unsigned(k1 - k0);
        if (lane == 0) *staged = seq;
        k0 = k1;
    }
}

template <class M>
__global__ void __launch_bounds__(M::NW * kWarp, 1) decode1_flow_kernel(const __grid_constant__ typename M::Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float red[8];
    __shared__ unsigned s_staged, s_done;
    constexpr int NWC = M::NW - 1;  // consumer warps; warp NWC is the stager
    static_assert(M::ACT_FLOATS >= 2 * M::kHid, "decode1 flow: a norm phase's weights are staged in act's second half");
    constexpr int D = M::kD;
    float* act = reinterpret_cast<float*>(smem);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const bool stager = warp == NWC;
    unsigned char* ring = smem + M::ACT_BYTES + size_t(warp) * M::RING_WARP;
    unsigned* const ctr = p.sync + kFlow;
    volatile unsigned* const staged = &s_staged;
    volatile unsigned* const done = &s_done;
    if (threadIdx.x == 0) s_staged = s_done = 0;

    __shared__ __align__(8) unsigned long long mbar[M::NW][kSlotsPerWarp];
    __shared__ SlotInfo slot_info[M::NW][kSlotsPerWarp];
    SlotInfo* info = &slot_info[warp][0];
    const int GW = int(gridDim.x) * NWC, gw = int(blockIdx.x) * NWC + warp;
    const uint32_t bars = smem_addr(&mbar[warp][0]);
    Loader ld;
    if (!stager) ring_start<M>(p, ld, ring, bars, info, gw, GW, lane);
    __syncthreads();  // s_staged / s_done initialized
    pdl_wait();
    unsigned ci = 0, seq = 0;
    Trace tr{p.trace};
    tr.mark();
    const int32_t token = p.st.token_ids[0];
    const bf16_t* erow = p.embed + size_t(token) * M::kHid;
    auto leave = [&] {  // a consumer warp is done reading this phase's input
        __syncwarp();
        if (lane == 0) {
            __threadfence_block();
            atomicAdd(&s_done, 1u);
        }
    };
    auto one = [](int kp) { return make_int2(kp, 1); };  // a piece is one segment
    for (int ly = 0; ly < M::kL; ++ly) {
        const Decode1Layer& w = p.layer[ly];
        const int q = ly * M::kPhasesPerLayer;
        const unsigned ph = unsigned(q) * NWC;  // consumer exits before this layer's QKV phase
        if (stager) {
            if (ly == 0)
                stager_phase<typename M::PQkv, true>(erow, w.ln_attn, act, red, staged, seq, done, ph, nullptr, 0u, one, lane);
            else
                stager_phase<typename M::PQkv, true>(p.x, w.ln_attn, act, red, staged, seq, done, ph, ctr + size_t(M::C_X0) * kLine,
                                                     unsigned(ly) * M::SEG_X0, one, lane);
            prefetch_kv<M>(p, ly, lane, kWarp);
        } else {
            FlowIn fl{staged, seq, red, p.eps, ctr + size_t(M::C_QKV) * kLine, D, nullptr};
            consume<M, typename M::PQkv, 0, true>(p, q, ld, gw, GW, info, ring, bars, ci, act, 0.0f, fl);
            seq += M::PQkv::KS;
            leave();
        }
        if (!stager && lane == 0 && p.l2_ahead > 0) prefetch_ahead<M>(p, ld, p.l2_ahead, gw, GW);
        __syncthreads();  // act is the attention's scratch now
        tr.mark();
        attention<M, true>(p, ly, act);
        tr.mark();
        if (stager) {
            constexpr int FPP = M::NQ / M::PO::KS;  // attn floats per o piece: the heads it overlaps
            auto heads = [](int kp) { return make_int2(kp * FPP / D, ((kp + 1) * FPP - 1) / D - kp * FPP / D + 1); };
            stager_phase<typename M::PO, false>(p.attn, static_cast<const float*>(nullptr), act, red, staged, seq, done, ph + NWC,
                                                ctr + size_t(M::C_ATT) * kLine, unsigned(ly + 1) * D, heads, lane);
        } else {
            FlowIn fl{staged, seq, red, 0.0f, ctr + size_t(M::C_X1) * kLine, M::SEG_X1, ly == 0 ? erow : nullptr};
            consume<M, typename M::PO, 1, true>(p, q + 1, ld, gw, GW, info, ring, bars, ci, act, 1.0f, fl);
            seq += M::PO::KS;
            leave();
            tr.mark();
        }
        if (stager) {
            stager_phase<typename M::PGu, true>(p.x, w.ln_mlp, act, red, staged, seq, done, ph + 2 * NWC, ctr + size_t(M::C_X1) * kLine,
                                                unsigned(ly + 1) * M::SEG_X1, one, lane);
            stager_phase<typename M::PDn, false>(p.h, static_cast<const float*>(nullptr), act, red, staged, seq, done, ph + 3 * NWC,
                                                 ctr + size_t(M::C_H) * kLine, unsigned(ly + 1) * M::SEG_H, one, lane);
        } else {
            FlowIn fg{staged, seq, red, p.eps, ctr + size_t(M::C_H) * kLine, M::SEG_H, nullptr};
            consume<M, typename M::PGu, 2, true>(p, q + 2, ld, gw, GW, info, ring, bars, ci, act, 0.0f, fg);
            seq += M::PGu::KS;
            leave();
            tr.mark();
            FlowIn fd{staged, seq, red, 0.0f, ctr + size_t(M::C_X0) * kLine, M::SEG_X0, nullptr};
            consume<M, typename M::PDn, 3, true>(p, q + 3, ld, gw, GW, info, ring, bars, ci, act, 1.0f, fd);
            seq += M::PDn::KS;
            leave();
            tr.mark();
        }
    }
    constexpr int R = M::PQkv::KS / M::PHead::KS;  // x0 segments per lm_head piece
    if (stager) {
        stager_phase<typename M::PHead, true>(p.x, p.final_norm, act, red, staged, seq, done, unsigned(M::kLastPhase) * NWC,
                                              ctr + size_t(M::C_X0) * kLine, unsigned(M::kL) * M::SEG_X0,
                                              [](int kp) { return make_int2(kp * R, R); }, lane);
    } else {
        FlowIn fl{staged, seq, red, p.eps_final, nullptr, 1, nullptr};
        consume<M, typename M::PHead, 4, true>(p, M::kLastPhase, ld, gw, GW, info, ring, bars, ci, act, 0.0f, fl);
    }
    __syncthreads();
    tr.mark();
    // The last block out zeroes the counters for the next launch (every block is past every wait).
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(p.sync + kExit, 1u) == gridDim.x - 1) {
            for (int i = 0; i < kHeads + M::kHq; ++i) p.sync[i] = 0;
            for (int i = 0; i < M::kCounters; ++i) ctr[size_t(i) * kLine] = 0;
            __threadfence();
        }
    }
}

}  // namespace d1

// Off by default: measured slower than the launch-per-op step on the H200 (docs/CUDA.md, "Session
// 9"): 1B 1.10 against 0.91 ms per token, 8B 4.63 against 4.28. SCR_CUDA_DECODE1=1 turns it on;
// tests flip decode1_override() (kernels/cuda/step.hpp).
inline bool decode1_on() {
    if (decode1_override() >= 0) return decode1_override() == 1;
    static const bool on = env_flag_switch("SCR_CUDA_DECODE1", false);
    return on;
}

namespace d1 {
// SCR_CUDA_DECODE1_TRACE=1: the kernel records per-block event times into a buffer kept for the
// process; at exit the last launch's phase times (averaged over layers; mean and max over blocks)
// go to stderr. For profiling only: the events cost a few instructions each.
struct TraceBuf {
    unsigned long long* dev = nullptr;
    int blocks = 0, per_layer = 0, layers = 0;
    static TraceBuf& get() {
        static TraceBuf b;
        return b;
    }
    static void report() {
        TraceBuf& b = get();
        if (!b.dev) return;
        std::vector<unsigned long long> h(size_t(b.blocks) * Trace::kMax);
        if (cudaDeviceSynchronize() != cudaSuccess ||
            cudaMemcpy(h.data(), b.dev, h.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess)
            return;
        static const char* barrier_names[] = {"qkv act", "qkv tiles", "barrier", "attention", "barrier", "o act", "o tiles", "barrier",
                                              "gate/up act", "gate/up tiles", "barrier", "down act", "down tiles", "barrier"};
        // The dataflow form (warp 0's view): each phase's end, its waits included.
        static const char* flow_names[] = {"qkv", "attention", "o", "gate/up", "down"};
        const char* const* names = b.per_layer == 5 ? flow_names : barrier_names;
        std::fprintf(stderr, "decode1 trace (last launch, %d blocks; us per layer, mean / max over blocks):\n", b.blocks);
        double total = 0;
        for (int e = 0; e < b.per_layer; ++e) {
            double mean = 0, mx = 0;
            for (int l = 0; l < b.layers; ++l) {
                double lmax = 0;
                for (int k = 0; k < b.blocks; ++k) {
                    const unsigned long long* t = h.data() + size_t(k) * Trace::kMax;
                    const int i = 1 + l * b.per_layer + e;
                    const double d = double(t[i] - t[i - 1]) / 1000.0;
                    mean += d;
                    lmax = std::max(lmax, d);
                }
                mx += lmax;
            }
            mean /= double(b.layers) * b.blocks;
            mx /= b.layers;
            total += mean;
            std::fprintf(stderr, "  %-14s %8.2f %8.2f\n", names[e], mean, mx);
        }
        const unsigned long long* t0 = h.data();
        const int end = 1 + b.layers * b.per_layer;
        if (b.per_layer == 5)  // flow: one event after the lm_head
            std::fprintf(stderr, "  layers %.1f us (sum of means %.1f per layer); lm_head %.1f us\n", double(t0[end - 1] - t0[0]) / 1000.0,
                         total, double(t0[end] - t0[end - 1]) / 1000.0);
        else
            std::fprintf(stderr, "  layers %.1f us (sum of means %.1f per layer); lm_head act %.1f, tiles %.1f us\n",
                         double(t0[end - 1] - t0[0]) / 1000.0, total, double(t0[end] - t0[end - 1]) / 1000.0,
                         double(t0[end + 1] - t0[end]) / 1000.0);
    }
};
}  // namespace d1

// One launch: the whole batch-1 step. False where the GPU cannot hold one block per SM (the
// caller then runs the launch-per-op step). The grid barriers need every block resident at once:
// one per SM of a GPU this process has to itself (not an MPS share of it). A cooperative launch
// would guarantee that or fail; it is not used yet (untested with programmatic dependent launch).
template <class M>
bool decode1(const Ctx& c, const typename M::Params& p) {
    static const int blocks = [] {
        int dev = 0, sms = 0, per_sm = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            return 0;
        for (auto kernel : {d1::decode1_kernel<M>, d1::decode1_flow_kernel<M>}) {
            if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, M::SMEM) != cudaSuccess)
                return 0;
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, M::NW * kWarp, M::SMEM) != cudaSuccess || per_sm < 1)
                return 0;
        }
        // One block per SM: all resident at once, as the grid barriers need. SCR_CUDA_DECODE1_BLOCKS
        // (A/B runs) takes fewer, e.g. 128 on a 132-SM GPU: with 2,048 warps each of the 8B's phases
        // and the 1B's gate / up and down give every warp the same number of units (same bits: a
        // row's sums do not depend on which warp makes them, nor the attention's on its blocks).
        const long long want = env_int_switch(
            "SCR_CUDA_DECODE1_BLOCKS", 0, [](long long b) { return b >= 0; }, "a block count (0: one per SM)");
        return want > 0 && want < sms ? int(want) : sms;
    }();
    if (blocks <= 0) {
        cudaGetLastError();
        return false;
    }
    static const bool trace = env_flag_switch("SCR_CUDA_DECODE1_TRACE", false);
    using Sync = Decode1Sync;
    static const Sync env_sync =
        env_choice_switch("SCR_CUDA_DECODE1_SYNC", Sync::count, {{"count", Sync::count}, {"publish", Sync::publish}, {"flow", Sync::flow}}, "count");
    const Sync sync = decode1_sync_override() >= 0 ? Sync(decode1_sync_override()) : env_sync;
    static const int l2_ahead = int(env_int_switch(
        "SCR_CUDA_DECODE1_L2AHEAD", 0, [](long long n) { return n >= 0 && n <= 64; }, "a tile count 0-64"));
    typename M::Params q = p;
    q.sync_count = sync != Sync::publish;
    q.l2_ahead = l2_ahead;
    if (trace) {
        d1::TraceBuf& b = d1::TraceBuf::get();
        if (!b.dev) {
            if (cudaMalloc(&b.dev, size_t(blocks) * d1::Trace::kMax * 8) != cudaSuccess) return false;
            b.blocks = blocks;
            b.per_layer = sync == Sync::flow ? 5 : 14;
            b.layers = M::kL;
            std::atexit(d1::TraceBuf::report);
        }
        q.trace = b.dev;
    }
    launch_smem(c, sync == Sync::flow ? d1::decode1_flow_kernel<M> : d1::decode1_kernel<M>, dim3(blocks), dim3(M::NW * kWarp), M::SMEM,
                q);
    return true;
}

}  // namespace scr::kernels::cuda
