// What CUDA kernels know of a step, in device memory. The runtime copies a step's arrays into one
// fixed device buffer before the kernels run, so the pointers below never change and a captured
// CUDA graph stays valid from step to step; the counts that do change are read from `header`.
// Plain C++ (no device code): the runtime includes it too.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace scr::kernels::cuda {

enum StepHeader : int {
    kHeaderTokens = 0,       // real tokens in the step (the launch may cover more: graph padding)
    kHeaderTableStride = 1,  // block_tables row stride of this step
    kHeaderSeqs = 2,
    kHeaderInts = 4,
};

// Decode steps of at most this many rows x query heads split each query group's heads over their
// own blocks in the fused decode attention (attention_split_max_blocks, kernels/cuda/attention.cuh);
// -1: SCR_CUDA_ATTN_SPLIT, else the SM count. Tests set it to run both launches (graphs are captured
// per model, so a model loaded after the change uses the new value).
inline int& attention_split_override() {
    static int v = -1;
    return v;
}

// MoE routing kernel (kernels/cuda/moe.cuh, moe_route_serial): -1: SCR_CUDA_MOE_ROUTE decides,
// 0: one warp per row, 1: the serial one-thread-per-row kernel. For tests, as above.
inline int& moe_route_override() {
    static int v = -1;
    return v;
}

// MoE expert MLPs (kernels/cuda/moe_gemm.cuh, moe_gemm_wanted): -1: SCR_CUDA_MOE_GEMM or the row
// rule decides, 0: per-(row, expert) GEMVs, 1: grouped GEMMs where the experts' dtype and shapes allow,
// 3: quantized experts on their tensor-core form, 4: expanded to bf16, where the shapes allow
// (MoeGemmMode; the caller's workspace must hold the expansion).
inline int& moe_gemm_override() {
    static int v = -1;
    return v;
}

// The quantized experts' tensor-core form's token tiles per chunk (kernels/cuda/moe_quant.cuh,
// moe_quant_mma_width): kRule: SCR_CUDA_MOE_QMMA_TN or the rule decides; kOne / kTwo / kFour: that
// many for every expert; kPerExpert / kPerExpertTwo: 4 for the experts with many pairs, 1 / 2 for
// the rest.
enum class MoeQmmaWidth { kRule, kOne, kTwo, kFour, kPerExpert, kPerExpertTwo };
inline MoeQmmaWidth& moe_quant_mma_width_override() {
    static MoeQmmaWidth v = MoeQmmaWidth::kRule;
    return v;
}

// Prefill-sized attention (kernels/cuda/attention_prefill.cuh, attention_prefill_mma_on): -1:
// SCR_CUDA_ATTN_PREFILL decides, 0: the key-per-lane kernel, 1: the tensor-core kernel where it fits.
inline int& attention_prefill_override() {
    static int v = -1;
    return v;
}

// Decode attention launches (kernels/cuda/attention.cuh, attention_vec_on): -1: SCR_CUDA_ATTN_VEC
// decides (on unless 0), 0: the scalar key loop, 1: the vector layout where the shape allows. For tests.
inline int& attention_vec_override() {
    static int v = -1;
    return v;
}

// Decode attention's context split (kernels/cuda/attention.cuh, attention_max_parts): -1:
// SCR_CUDA_ATTN_PARTS decides (kAttentionMaxParts unless set), n >= 1: at most n parts. For tests.
inline int& attention_parts_override() {
    static int v = -1;
    return v;
}
// ... every token's part count, whatever its context (the tiny test models' contexts are too short
// to take more than one): -1: by the context (attention_parts), n >= 1: n (at most the most). For tests.
inline int& attention_parts_every_token_override() {
    static int v = -1;
    return v;
}
// ... and how many blocks share a token's parts (gridDim.z): -1: as many as the SMs leave room for
// (attention_parts_for), n >= 1: n (at most the part count). For tests.
inline int& attention_part_blocks_override() {
    static int v = -1;
    return v;
}

// Bytes of the persistent decode kernel's sync buffer (kernels/cuda/decode1.cuh: d1::SyncWord; the
// dataflow form's counters each on their own 128-byte line), zero between launches.
constexpr size_t kDecode1SyncBytes = 64 * 1024;

// Batch-1 decode as one persistent kernel (kernels/cuda/decode1.cuh): -1: SCR_CUDA_DECODE1 decides
// (off unless 1), 0: the launch-per-op step, 1: the persistent kernel where the model has one. For tests.
inline int& decode1_override() {
    static int v = -1;
    return v;
}
// ... and the form of its waits: -1: SCR_CUDA_DECODE1_SYNC decides, else a Decode1Sync. For tests.
enum class Decode1Sync { count, publish, flow };
inline int& decode1_sync_override() {
    static int v = -1;
    return v;
}

// Decode rows whose bf16 linears run the GEMV (kernels/cuda/linear.cuh: kMmaMinRows is one more);
// the MMA linear takes 2-32 rows. Within each of the two regimes a sequence's bits do not depend on
// the batch (the decode attention's context split keeps to the first: kAttentionPartsRows; bf16 MoE
// layers also switch to grouped expert GEMMs by a row rule of their own, moe_gemm_wanted). Plain
// C++ so that host tests can tell which regime a step's graph bucket falls in.
constexpr int kGemvRegimeRows = 1;

struct DevStep {
    const int32_t* header = nullptr;        // [kHeaderInts]
    const int32_t* token_ids = nullptr;     // [launch rows]; padding rows hold 0
    const int32_t* positions = nullptr;     // [launch rows]; padding rows hold 0
    const int64_t* slot_mapping = nullptr;  // [launch rows]; padding rows hold -1 (no KV write)
    const int32_t* seq_of_token = nullptr;  // [launch rows]
    const int32_t* logit_rows = nullptr;    // [launch logit rows]; padding rows name a valid row
    const int32_t* block_tables = nullptr;  // [num_seqs * header[kHeaderTableStride]]
};

// Weight ranges the launches after this one will read, for a latency-bound launch to pull into L2
// while HBM would sit idle (kernels/cuda/common.cuh: l2_plan). Generated by the CUDA emitter, which
// knows the op order; ranges of one `stage` are read together by one launch (gate and up), stages
// in launch order. Empty: no prefetch.
constexpr int kL2MaxRanges = 12;
struct L2Range {
    const void* ptr = nullptr;
    int64_t bytes = 0;
    int stage = 0;
};
struct L2Prefetch {
    L2Range r[kL2MaxRanges];
    int n = 0;
};

// A second stream and the events that fork it from a step's stream and join it back (fork_join,
// kernels/cuda/common.cuh). Plain handles; OwnedSideStream makes and frees them.
struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    explicit operator bool() const { return stream != nullptr; }
};

// Owns a SideStream: `create()` makes the stream and its events (the first failure is returned and
// what was made is freed by the destructor); an uncreated one is an empty SideStream.
class OwnedSideStream {
public:
    OwnedSideStream() = default;
    OwnedSideStream(const OwnedSideStream&) = delete;
    OwnedSideStream& operator=(const OwnedSideStream&) = delete;
    ~OwnedSideStream() {
        if (s_.fork) cudaEventDestroy(s_.fork);
        if (s_.join) cudaEventDestroy(s_.join);
        if (s_.stream) cudaStreamDestroy(s_.stream);
    }
    cudaError_t create() {
        cudaError_t e = cudaStreamCreateWithFlags(&s_.stream, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s_.fork, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s_.join, cudaEventDisableTiming);
        return e;
    }
    const SideStream& get() const { return s_; }

private:
    SideStream s_;
};

// Everything a kernel launcher needs besides its operands.
struct Ctx {
    cudaStream_t stream = nullptr;
    DevStep step;
    bool pdl = false;  // launch kernels as programmatic dependents (kernels/cuda/common.cuh: launch)
    // Every sequence of the step has exactly one token (decode): a token's new K/V row is then read
    // by its own attention block only, so RoPE + KV append can run inside the attention launch.
    bool one_token_per_seq = false;
    // Upcoming weights this launch may prefetch into L2 (attention and the GEMV take it).
    L2Prefetch l2;
    // The decode attention's workspace for its context split (kernels/cuda/attention.cuh:
    // attention_workspace_floats; tickets zero between launches), or null: no split.
    float* attn_ws = nullptr;
    // The quantized 33-256-row kernel's prep output and its global K split's partials and arrival
    // counters (kernels/cuda/quant_wide.cuh: quant_wide_model_workspace_bytes; zeroed once when
    // allocated), or null: those launches take the other kernels.
    void* qwide_ws = nullptr;
    int64_t qwide_ws_bytes = 0;
    // A second stream for the independent launches of one op (fork_join, kernels/cuda/common.cuh:
    // the quantized MoE's per-expert widths); none: those launches run on `stream`, one after the other.
    SideStream side;
    Ctx with_l2(const L2Prefetch& p) const {
        Ctx c = *this;
        c.l2 = p;
        return c;
    }
};

}  // namespace scr::kernels::cuda
