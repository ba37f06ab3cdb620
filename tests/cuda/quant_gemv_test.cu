// scr_cuda_quant_gemv: the quantized decode GEMVs of kernels/cuda/quant_linear.cuh on the GPU, all three
// kernels: the tensor-core one ("mma", the default), the shared-memory SIMT one for 1-8 rows ("smem",
// SCR_CUDA_QUANT_GEMV=smem; its launches of more rows run the tensor-core kernel, and its batch
// invariance is checked over 8 rows, its regime) and the first SIMT one ("simt").
//   * correctness: random non-zero packed weights, scales, biases and activations at Llama-3.2-1B /
//     Llama-3.1-8B shapes, each output checked against a float64 host reference of the same
//     dequantization (w = scale * q + bias; int8, fp8: w = scale * q), for 1, 2, 3, 4, 8, 13, 16, 33,
//     64 and 256 token rows (the reference covers token rows 0-12, 32, 63, 100 and 255) and for 5
//     rows with a bias and a residual; fp8 e4m3 per channel and per tensor with random bytes, so every code appears
//     (negative, subnormal, +-448; the NaN codes 0x7f/0xff read as +-480, as the kernels document);
//     outputs are poisoned with NaN first, so an unwritten element fails. Bounds per output, with
//     B = sum_k |x_k| (|s q_k| + |b|): simt |err| <= 1e-5 B; mma |err| <= 2e-5 B + 1e-6 (x enters
//     the tensor cores as bf16 hi + lo, ~2^-17 relative; float32 accumulation);
//   * batch invariance: every row of a 256-row launch has exactly the bits of that row launched alone
//     (the tc1 path: of a 2-row launch, its regime; the one-row MLX int4 kernel, quant_mma1_kernel,
//     takes 1-2 rows; above, each regime of the tc1 path: staged_regimes; quant_wide_kernel's 33-128
//     rows (by default; SCR_CUDA_QUANT_WIDE=256: 33-256) against launches of 33; int8 / fp8 on the tc1
//     path at the rows SCR_CUDA_QUANT_WIDE_CODES gives quant_wide_kernel, by default 33-64);
//   * quant_wide_kernel (when on) as a programmatic dependent in a chain of launches, against the
//     same chain without PDL (wide_pdl_check);
//   * the fused variants (quant_linear_fused: grouped Q/K/V with biases, SwiGLU, folded RMSNorm, and
//     their combinations) against the float64 reference of the unfused math, same bounds, and their
//     batch invariance;
//   * prefill-sized calls (300 rows, the automatic path: dequantized weights on cuBLASLt,
//     quant_prefill.cuh) of every format and the fused cases a prefill meets, against the same
//     float64 reference and bound, asserting that the cuBLASLt path ran;
//   * fp8: the cvt.rn.f16x2.e4m3x2 conversion variant has the bits of the default one (bench runs);
//   * the one-row MLX int4 kernel's two x-load forms (PRED and the zero block) give the same bits on
//     random and extreme inputs (tc1_form_checks);
//   * host self-test (also without a GPU): the unpacking bit tricks, a warp of the tensor-core
//     kernel emulated on the host from its own per-lane functions against the float64 reference, and
//     the split-K choice (qmma_split) against its rule;
//   * the tensor-core kernel runs with the split of SCR_CUDA_QUANT_SPLITK (0, the default: the original
//     one-block split; 1: one wave of warps, clusters of blocks along K where the row tiles are few),
//     printed as "warps x blocks" in the check lines and the table: run the binary once per
//     value to check and time both;
//   * timing (unless --no-bench): CUDA events around a captured graph of back-to-back launches that
//     rotate over enough weight copies to miss L2; GB/s of the bytes the kernel must read (packed
//     weights + scales + biases) beside the device copy bandwidth and the existing bf16 linear
//     (linear.cuh) on the same shape, in the same process.
// Exit: 0 all checks passed, 1 a check failed, 77 no GPU (ctest skips).
//   scr_cuda_quant_gemv [--no-bench] [--shapes NxK,NxK,...] [--formats a,b,...] [--host-selftest]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/quant_linear.cuh"
#include "kernels/cuda/moe_quant.cuh"
#include "kernels/cuda/quant_ops.cuh"

using namespace scr::kernels::cuda;
using scr::bf16_t;

namespace {

// printf-style text: fmt does not compile in nvcc's C++20 host pass.
template <typename... A>
std::string text(const char* f, A... a) {
    char buf[512];
    std::snprintf(buf, sizeof buf, f, a...);
    return buf;
}
[[noreturn]] void die(const std::string& what) { throw std::runtime_error(what); }
void check_cuda(cudaError_t e, const char* what, int line) {
    if (e != cudaSuccess) die(text("CUDA error '%s' at quant_gemv_test.cu:%d: %s", cudaGetErrorString(e), line, what));
}
#define CK(call) check_cuda((call), #call, __LINE__)

enum class Fmt { int4_g32, int4_g64, int4_g128, int8, fp8, fp8_tensor, fp8_cvt, bf16 };
constexpr Fmt kQuantFormats[] = {Fmt::int4_g32, Fmt::int4_g64, Fmt::int4_g128, Fmt::int8, Fmt::fp8, Fmt::fp8_tensor};

const char* name_of(Fmt f) {
    switch (f) {
        case Fmt::int4_g32: return "mlx-int4-g32";
        case Fmt::int4_g64: return "mlx-int4-g64";
        case Fmt::int4_g128: return "mlx-int4-g128";
        case Fmt::int8: return "int8";
        case Fmt::fp8: return "fp8";
        case Fmt::fp8_tensor: return "fp8-tensor";
        case Fmt::fp8_cvt: return "fp8(cvt)";
        default: return "bf16";
    }
}
int group_of(Fmt f) { return f == Fmt::int4_g32 ? 32 : f == Fmt::int4_g64 ? 64 : f == Fmt::int4_g128 ? 128 : 0; }
bool is_int4(Fmt f) { return group_of(f) > 0; }
// The formats this run checks (--formats; default: all of kQuantFormats).
std::vector<Fmt> g_formats(std::begin(kQuantFormats), std::end(kQuantFormats));
bool is_fp8(Fmt f) { return f == Fmt::fp8 || f == Fmt::fp8_tensor || f == Fmt::fp8_cvt; }
// fp8 e4m3 (OCP e4m3fn) from its definition: (1 + m/8) 2^(e-7), subnormals m/8 2^-6. The NaN codes
// S.1111.111 as +-480: what the kernels (and the CPU target's F16C path) read them as.
double fp8_value(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(double(8 + m), e - 10);
    return (b & 0x80) ? -v : v;
}

struct Sizes {
    size_t q = 0, scales = 0, biases = 0;  // bytes
    size_t total() const { return q + scales + biases; }
};
Sizes sizes_of(Fmt f, int n, int k) {
    Sizes s;
    if (is_int4(f)) {
        s.q = size_t(n) * k / 2;
        s.scales = s.biases = size_t(n) * (k / group_of(f)) * 2;
    } else if (f == Fmt::int8 || is_fp8(f)) {
        s.q = size_t(n) * k;
        s.scales = f == Fmt::fp8_tensor ? 2 : size_t(n) * 2;
    } else {
        s.q = size_t(n) * k * 2;
    }
    return s;
}

// ---- Random data, generated on the device (fast for GB-sized weight sets) ----
__host__ __device__ uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__global__ void fill_u32(uint32_t* p, size_t n, uint64_t seed) {
    const uint64_t base = mix64(seed);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        p[i] = uint32_t(mix64(base + i) >> 16);
}
// Uniform in [lo, hi); bf16 rounded to nearest even, as the checkpoints hold them.
__global__ void fill_uniform(void* out, bool bf16, size_t n, uint64_t seed, float lo, float hi) {
    const uint64_t base = mix64(seed);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const float u = float(mix64(base + i) >> 40) * (1.0f / 16777216.0f);
        const float v = lo + (hi - lo) * u;
        if (bf16) static_cast<bf16_t*>(out)[i] = from_f32<bf16_t>(v);
        else static_cast<float*>(out)[i] = v;
    }
}
// fp8 NaN codes S.1111.111 -> +-448 (S.1111.110): the cvt conversion reads them as NaN, the bit path as +-480.
__global__ void clear_fp8_nan_codes(uint8_t* p, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        if ((p[i] & 0x7f) == 0x7f) p[i] -= 1;
}
void fill_words(void* p, size_t bytes, uint64_t seed) {
    fill_u32<<<1024, 256>>>(static_cast<uint32_t*>(p), bytes / 4, seed);
    CK(cudaGetLastError());
}
void fill_values(void* p, bool bf16, size_t n, uint64_t seed, float lo, float hi) {
    fill_uniform<<<1024, 256>>>(p, bf16, n, seed, lo, hi);
    CK(cudaGetLastError());
}

// One weight set (copy) of a format on the device.
struct DevWeights {
    void *q = nullptr, *scales = nullptr, *biases = nullptr;
};
DevWeights make_weights(Fmt f, int n, int k, uint64_t seed) {
    const Sizes s = sizes_of(f, n, k);
    DevWeights w;
    CK(cudaMalloc(&w.q, s.q));
    if (f == Fmt::bf16) fill_values(w.q, true, s.q / 2, seed * 7 + 2, -0.05f, 0.05f);
    else fill_words(w.q, s.q, seed * 7 + 1);  // random bits: every nibble / int8 value, -128 too
    if (s.scales) {
        CK(cudaMalloc(&w.scales, s.scales));
        // MLX: scale = (max - min) / 15 > 0, bias = min < 0; int8: a positive per-channel scale.
        if (is_int4(f)) fill_values(w.scales, true, s.scales / 2, seed * 7 + 3, 0.004f, 0.012f);
        else if (is_fp8(f)) fill_values(w.scales, true, s.scales / 2, seed * 7 + 3, 0.0001f, 0.0003f);  // ~ max|w| / 448
        else fill_values(w.scales, true, s.scales / 2, seed * 7 + 3, 0.0005f, 0.0015f);
    }
    if (s.biases) {
        CK(cudaMalloc(&w.biases, s.biases));
        fill_values(w.biases, true, s.biases / 2, seed * 7 + 4, -0.1f, -0.03f);
    }
    return w;
}
void free_weights(DevWeights& w) {
    cudaFree(w.q);
    cudaFree(w.scales);
    cudaFree(w.biases);
    w = {};
}

constexpr int kMaxRows = 256;  // token rows of the largest check (quant_wide_kernel's four 64-row tiles)
// The workspace of quant_wide_kernel (33-256 rows), for every format and K here, with the global
// split's slots at its end as a model allocates them; zeroed once, set on every Ctx.
void* g_qwide_ws = nullptr;
constexpr int64_t kQwidePrepBytes = std::max(qdetail::qwide_workspace_bytes_for<qdetail::MlxInt4<32, bf16_t>>(32768),
                                             qdetail::qwide_workspace_bytes_for<qdetail::Int8Channel<bf16_t>>(32768));
int64_t g_qwide_ws_bytes = 0;
Ctx ctx_on(cudaStream_t st) {
    Ctx c;
    c.stream = st;
    c.qwide_ws = g_qwide_ws;
    c.qwide_ws_bytes = g_qwide_ws ? g_qwide_ws_bytes : 0;
    return c;
}
constexpr QuantGemvPath kPaths[] = {QuantGemvPath::smem, QuantGemvPath::mma, QuantGemvPath::simt, QuantGemvPath::tc1};
const char* name_of(QuantGemvPath p) {
    return p == QuantGemvPath::mma ? "mma" : p == QuantGemvPath::smem ? "smem" : p == QuantGemvPath::tc1 ? "tc1" : "simt";
}
// Token rows whose bits must not depend on the batch: the smem kernel's regime is 1-8 rows (more
// rows run on the tensor-core kernel), the others' any number. tc1 (quant_mma1_kernel) takes 1 to
// qmma1_max_rows() rows (2; more run on the tensor-core kernel), its SwiGLU form one row only (2
// rows of SwiGLU: the grouped launch, qlinear_swiglu), where the check is the same launch twice.
// A SwiGLU case on the tc1 path at 2 rows runs as the model runs it: qlinear_swiglu's grouped
// launch of the gate and up rows, then silu * mul (qdetail::swiglu_grouped); its rows' bits are
// those of the grouped launch, not the one-row fused launch's, so its invariance check is the same
// 2-row launch twice (the grouped cases check the grouped launch's 2 rows against each alone).
int tc1_rows() { return qdetail::qmma1_max_rows(); }
// The tc1 path's MLX int4 launches of 3-256 rows (17+ in passes of 16; SCR_CUDA_QUANT_STAGED_UPTO
// moves the top) run quant_staged_kernel (x staged once per block) where its rule takes them,
// quant_mma_kernel otherwise: tc1 checks reach up to here (the buffers: kMaxRows).
int tc1_top() {
    return std::max({qdetail::qstaged_on() ? qdetail::qstaged_max_rows() : tc1_rows(), qdetail::qwide_max_rows_of(true),
                     qdetail::qwide_max_rows_of(false)});
}
int invariance_rows(QuantGemvPath p) { return p == QuantGemvPath::smem ? 8 : p == QuantGemvPath::tc1 ? tc1_rows() : kMaxRows; }
int invariance_alone_rows(QuantGemvPath p, bool swiglu) { return p == QuantGemvPath::tc1 && swiglu && tc1_rows() >= 2 ? 2 : 1; }
// Whether format f is one quant_wide_kernel takes (the kernel's own rule, qwide_format_ok), and
// whether it takes a launch of `rows` rows of f (its switch: SCR_CUDA_QUANT_WIDE or _CODES).
bool wide_format(Fmt f);
bool wide_takes(Fmt f, int rows) {
    return wide_format(f) && rows >= qdetail::qwide_min_rows() && rows <= qdetail::qwide_max_rows_of(is_int4(f));
}
// The tc1 path (the model's decode routing, without cuBLASLt): the one-row tensor-core and staged
// kernels exist for the MLX int4 formats only; int8 / fp8 take it where quant_wide_kernel is on for
// them (SCR_CUDA_QUANT_WIDE_CODES, by default 33-64 rows), at its rows only (tc1_row_applies).
bool path_applies(QuantGemvPath p, Fmt f) { return p != QuantGemvPath::tc1 || is_int4(f) || qdetail::qwide_max_rows_of(false) > 0; }
bool tc1_row_applies(Fmt f, int rows) { return is_int4(f) || wide_takes(f, rows); }
// tc1 must really run when asked for: its launcher records a split, cleared before each launch.
// quant_staged_kernel must run where its rule takes the launch (tiles: 16-row tiles, SwiGLU's twice;
// chunks: 128-k chunks per row).
// quant_wide_kernel must run where F is a format it takes and its switch takes the rows; the other
// kernels exist for MLX int4 only.
template <class F>
void expect_tc1_ran(QuantGemvPath path, int rows, int tiles, int chunks, bool fused) {
    constexpr bool wide = qdetail::qwide_format_ok<F>(), int4 = F::kAffine;
    if (path != QuantGemvPath::tc1) return;
    if (wide && rows >= qdetail::qwide_min_rows() && rows <= qdetail::qwide_max_rows_of(int4)) {
        if (qdetail::qwide_last_plan().slices == 0) die(text("quant_wide_kernel declined a launch of %d rows", rows));
        return;
    }
    if (!int4 || rows > tc1_top()) return;
    if (rows <= tc1_rows() && qdetail::qmma1_last_split().warps == 0) die(text("quant_mma1_kernel declined a launch of %d rows", rows));
    if (rows > tc1_rows() && qdetail::qstaged_takes(rows, tiles, chunks, fused) && qdetail::qstaged_last_plan().slices == 0)
        die(text("quant_staged_kernel declined a launch of %d rows (%d tiles)", rows, tiles));
}
// The MLX int4 regimes of the tc1 path above 2 rows (quant_staged.cuh, qstaged_takes: each on one
// kernel per shape), checked up to kMaxRows rows, for a launch of `tiles` 16-row tiles (SwiGLU's
// twice) of `chunks` 128-k chunks, `fused` (SwiGLU or a folded norm) or plain: [3, 8];
// [9, qstaged_max_rows()] on the staged kernel (17+ in passes of 16: [9, 17] checks a pass of one
// row, the 17th, against the same row in a launch of 9), except where the size rule keeps 17-32
// rows on quant_mma_kernel: then [9, 16], [17, 32] there, and [9, qstaged_max_rows()] again (33+
// rows in passes have the staged kernel's bits).
struct Regime {
    int lo, hi;
};
// With `wide` (a format quant_wide_kernel takes, and the kernel on) 33+ rows are its own regime
// [33, kMaxRows] (one 64-row tile against launches of 33, the other tiles' rows too), and the
// staged regimes stop at 32. int8 / fp8 (not int4) on the tc1 path: the wide regime only.
std::vector<Regime> staged_regimes(int tiles, int chunks, bool fused, bool wide, bool int4 = true) {
    const int pass = qdetail::kQsMaxRows;
    const int wlo = qdetail::qwide_min_rows();
    const int wtop = qdetail::qwide_max_rows_of(int4);
    wide = wide && wlo <= wtop;
    if (!int4) return wide ? std::vector<Regime>{{wlo, std::min(wtop, kMaxRows)}} : std::vector<Regime>{};
    if (wide && wlo <= pass + 1) {  // SCR_CUDA_QUANT_WIDE_FROM below 18: the staged regimes end before it
        std::vector<Regime> r;
        if (wlo > 8) r.push_back({3, 8});
        if (wlo > 9) r.push_back({9, wlo - 1});
        r.push_back({wlo, std::min(wtop, kMaxRows)});
        return r;
    }
    const int top = std::min(std::min(qdetail::qstaged_max_rows(), kMaxRows), wide ? wlo - 1 : kMaxRows);
    std::vector<Regime> r;
    if (top <= pass) r = {{3, 8}, {9, top}};
    else if (qdetail::qstaged_takes(pass + 1, tiles, chunks, fused)) r = {{3, 8}, {9, top}, {9, pass + 1}};
    else if (top <= 2 * pass) r = {{3, 8}, {9, pass}, {pass + 1, top}};
    else r = {{3, 8}, {9, pass}, {pass + 1, 2 * pass}, {9, top}};
    if (wide) r.push_back({wlo, std::min(wtop, kMaxRows)});
    return r;
}
// A batch-invariance comparison: outputs whose bits differ between the batched launch and the
// launches of fewer rows, of how many, and the batched launch's split (split_of).
struct Invariance {
    size_t differ = 0, total = 0;
    std::string how;
    void add(const float* dev_batched, const float* dev_alone, size_t count) {
        std::vector<float> a(count), b(count);
        CK(cudaMemcpy(a.data(), dev_batched, sizeof(float) * count, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.data(), dev_alone, sizeof(float) * count, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 ? 1 : 0;
        total += count;
    }
    const char* verdict() const { return differ ? "FAILED" : "ok"; }
};

// The tensor-core path must really run when asked for (quant_linear would quietly take the SIMT one).
template <class F>
void launch_as(const Ctx& c, const QuantLinearArgs& a, QuantGemvPath path) {
    if (path == QuantGemvPath::mma && !qdetail::quant_mma_fits<F>(a))
        die(text("the tensor-core path does not take %dx%d (or the pointers' alignment)", a.n, a.k));
    if (path == QuantGemvPath::smem && a.rows <= 8 && !qdetail::quant_smem_fits<F>(qdetail::fused_of(a)))
        die(text("the shared-memory path does not take %dx%d (or the pointers' alignment)", a.n, a.k));
    qdetail::qmma1_last_split() = {0, 0};
    qdetail::qstaged_last_plan() = {};  // a launch that never reaches the staged kernel prints no stale plan
    qdetail::qwide_last_plan() = {};
    quant_linear<F>(c, a, path);
    expect_tc1_ran<F>(path, a.rows, (a.n + 15) / 16, a.k / 128, false);
}

// The tensor-core kernel's K split in the last launch (SCR_CUDA_QUANT_SPLITK, qmma_split): "warps x
// blocks per cluster", for the check lines and the timing table.
std::string split_of(QuantGemvPath path, int rows = 1) {
    if (path == QuantGemvPath::smem && rows <= 8)
        return qdetail::qsmem_last_depth() ? text(" ks%d d%d", qdetail::qsmem_last_split(), qdetail::qsmem_last_depth())
                                           : text(" ks%d", qdetail::qsmem_last_split());
    if (path == QuantGemvPath::simt) return "";
    if (path == QuantGemvPath::tc1 && qdetail::qwide_last_plan().slices > 0)
        return text(" wide s%dg%d%s", qdetail::qwide_last_plan().slices, qdetail::qwide_last_plan().row_groups,
                    qdetail::qwide_last_plan().global ? "x" : "");
    if (path == QuantGemvPath::tc1 && rows > tc1_rows() && rows <= tc1_top() && qdetail::qstaged_last_plan().slices > 0) {
        const qdetail::QStagedPlan& p = qdetail::qstaged_last_plan();
        return text(" s%dw%dg%d", p.slices, p.waves, p.row_groups);
    }
    const qdetail::QMmaSplit s = path == QuantGemvPath::tc1 && rows <= tc1_rows() ? qdetail::qmma1_last_split() : qdetail::qmma_last_split();
    return text(" %dx%d", s.warps, s.blocks);
}

// Calls fn.template operator()<F>() with the format type of f (the one place a runtime Fmt becomes
// its compile-time format); `who` names the caller in the error for a format it has no type for.
// The fp8 conversion variant (fp8_cvt) only where kCvt asks for it (the unfused launches' A/B).
template <bool kCvt = false, class Fn>
void with_format(Fmt f, const char* who, Fn&& fn) {
    switch (f) {
        case Fmt::int4_g32: fn.template operator()<qdetail::MlxInt4<32, bf16_t>>(); break;
        case Fmt::int4_g64: fn.template operator()<qdetail::MlxInt4<64, bf16_t>>(); break;
        case Fmt::int4_g128: fn.template operator()<qdetail::MlxInt4<128, bf16_t>>(); break;
        case Fmt::int8: fn.template operator()<qdetail::Int8Channel<bf16_t>>(); break;
        case Fmt::fp8: fn.template operator()<qdetail::Fp8E4M3<bf16_t, false>>(); break;
        case Fmt::fp8_tensor: fn.template operator()<qdetail::Fp8E4M3<bf16_t, true>>(); break;
        case Fmt::fp8_cvt:
            if constexpr (kCvt) {
                fn.template operator()<qdetail::Fp8E4M3<bf16_t, false, true>>();
                break;
            }
            [[fallthrough]];
        default: die(text("%s: no case for format %s", who, name_of(f)));
    }
}

bool wide_format(Fmt f) {
    bool ok = false;
    if (f != Fmt::bf16) with_format<true>(f, "wide_format", [&]<class F>() { ok = qdetail::qwide_format_ok<F>(); });
    return ok;
}

void launch(Fmt f, QuantGemvPath path, cudaStream_t st, const QuantLinearArgs& a) {
    Ctx c = ctx_on(st);
    with_format<true>(f, "launch", [&]<class F>() { launch_as<F>(c, a, path); });
}

// The existing bf16 GEMV, for the shapes of this test (its N and K are template constants).
template <int N, int K>
void dense_bf16(cudaStream_t st, int rows, const float* x, const void* w, float* y) {
    Ctx c = ctx_on(st);
    linear<N, K, bf16_t>(c, rows, x, static_cast<const bf16_t*>(w), nullptr, nullptr, y);
}
// False when no bf16 GEMV is compiled for the shape (then only the quantized kernels run).
bool launch_bf16(cudaStream_t st, int n, int k, int rows, const float* x, const void* w, float* y) {
#define SCR_SHAPE(N, K) \
    if (n == N && k == K) return w ? (dense_bf16<N, K>(st, rows, x, w, y), true) : true;
    SCR_SHAPE(2048, 2048) SCR_SHAPE(8192, 2048) SCR_SHAPE(2048, 8192) SCR_SHAPE(4096, 4096)
    SCR_SHAPE(14336, 4096) SCR_SHAPE(4096, 14336) SCR_SHAPE(128256, 2048)
#undef SCR_SHAPE
    return false;
}

// ---- float64 host reference of the same dequantization ----
double bf16_to_double(uint16_t b) {
    const uint32_t bits = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

struct HostWeights {
    std::vector<uint8_t> q;
    std::vector<uint16_t> scales, biases;
};
HostWeights download(Fmt f, int n, int k, const DevWeights& w) {
    const Sizes s = sizes_of(f, n, k);
    HostWeights h;
    h.q.resize(s.q);
    h.scales.resize(s.scales / 2);
    h.biases.resize(s.biases / 2);
    CK(cudaMemcpy(h.q.data(), w.q, s.q, cudaMemcpyDeviceToHost));
    if (s.scales) CK(cudaMemcpy(h.scales.data(), w.scales, s.scales, cudaMemcpyDeviceToHost));
    if (s.biases) CK(cudaMemcpy(h.biases.data(), w.biases, s.biases, cudaMemcpyDeviceToHost));
    return h;
}

// Row n dequantized straight from the layout definition; `bound` gets the magnitudes the
// factored kernel sums (|scale*q| + |bias| per weight), which set its float32 rounding.
void dequant_row(Fmt f, const HostWeights& h, int k, int n, std::vector<double>& w, std::vector<double>& bound) {
    for (int i = 0; i < k; ++i) {
        if (is_int4(f)) {
            const int g = group_of(f);
            uint32_t word;
            std::memcpy(&word, &h.q[(size_t(n) * (k / 8) + i / 8) * 4], 4);
            const double q = double((word >> (4 * (i % 8))) & 15u);
            const double s = bf16_to_double(h.scales[size_t(n) * (k / g) + i / g]);
            const double b = bf16_to_double(h.biases[size_t(n) * (k / g) + i / g]);
            w[i] = s * q + b;
            bound[i] = std::fabs(s * q) + std::fabs(b);
        } else if (is_fp8(f)) {
            w[i] = bf16_to_double(h.scales[f == Fmt::fp8_tensor ? 0 : n]) * fp8_value(h.q[size_t(n) * k + i]);
            bound[i] = std::fabs(w[i]);
        } else {
            const double q = double(int8_t(h.q[size_t(n) * k + i]));
            w[i] = bf16_to_double(h.scales[n]) * q;
            bound[i] = std::fabs(w[i]);
        }
    }
}

// Token rows the reference covers: 0-12 (checks of 1, 3, 5, 8, 13 rows), 32 and 63 (the ends of the
// 33- and 64-row checks), 100 and the last (quant_wide_kernel's second and fourth 64-row tiles).
constexpr int kRefTokens[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 32, 63, 100, kMaxRows - 1};
constexpr int kRefRows = int(sizeof(kRefTokens) / sizeof(kRefTokens[0]));
int ref_token(int slot) { return kRefTokens[slot]; }
int ref_slot(int token) {
    for (int s = 0; s < kRefRows; ++s)
        if (kRefTokens[s] == token) return s;
    return -1;
}

// Tolerances (see the top): the SIMT kernel's, and the tensor-core kernel's.
constexpr double kSimtTol = 1e-5;
constexpr double kMmaTolRel = 2e-5, kMmaTolAbs = 1e-6;

struct Reference {
    std::vector<int> rows_checked;    // output rows n with a reference
    std::vector<double> y, bound;     // [kRefRows][rows_checked]
};

Reference reference(Fmt f, const HostWeights& h, int n, int k, const std::vector<float>& x) {
    Reference r;
    const bool all = size_t(n) * k <= size_t(4096) * 4096;
    for (int i = 0; i < n; ++i)
        if (all || i % 11 == 0 || i < 64 || i >= n - 64) r.rows_checked.push_back(i);
    const size_t m = r.rows_checked.size();
    r.y.assign(kRefRows * m, 0.0);
    r.bound.assign(kRefRows * m, 0.0);
    const int nthreads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int tid = 0; tid < nthreads; ++tid)
        pool.emplace_back([&, tid] {
            std::vector<double> w(k), bound(k);
            for (size_t j = tid; j < m; j += nthreads) {
                dequant_row(f, h, k, r.rows_checked[j], w, bound);
                for (int t = 0; t < kRefRows; ++t) {
                    double acc = 0.0, mag = 0.0;
                    const float* xt = x.data() + size_t(ref_token(t)) * k;
                    for (int i = 0; i < k; ++i) {
                        acc += double(xt[i]) * w[i];
                        mag += std::fabs(double(xt[i])) * bound[i];
                    }
                    r.y[t * m + j] = acc;
                    r.bound[t * m + j] = mag;
                }
            }
        });
    for (auto& th : pool) th.join();
    return r;
}

// ---- Timing ----
double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Microseconds per launch: a graph of `launches` back-to-back launches, median of 7 replays.
template <class Launch>
double time_us(cudaStream_t st, int launches, Launch&& one) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < launches; ++i) one(i);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(exec, st));  // warm-up
    std::vector<double> us;
    for (int rep = 0; rep < 7; ++rep) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(exec, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        us.push_back(ms * 1e3 / launches);
    }
    CK(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return median(us);
}

// Device copy bandwidth, read + write counted (as scr_cuda_bench and docs/CUDA.md count it).
double copy_gbs() {
    const size_t bytes = size_t(2) << 30;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; ++i) CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    std::vector<double> ms;
    for (int i = 0; i < 9; ++i) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * double(bytes) / (median(ms) * 1e-3) / 1e9;
}

struct Shape {
    int n, k;
    const char* what;
};

// ---- Host emulation of the tensor-core kernel's warp (quant_mma_kernel) ----
// The per-lane pieces (load offsets, the lane transpose, unpacking, x hi/lo split, the k each word
// stands for) are the kernel's own __host__ __device__ functions; the shuffles and mma.m16n8k16 are
// emulated from their definitions (PTX ISA fragment layout of m16n8k16 .bf16: a0 = (row g, k 2t..2t+1),
// a1 = (g + 8, 2t..), a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..); b0 = (k 2t..2t+1, col g),
// b1 = (2t + 8.., g); c0 = (g, 2t), c1 = (g, 2t + 1), c2 = (g + 8, 2t), c3 = (g + 8, 2t + 1)).
double bf16_half(uint32_t reg, int half) { return bf16_to_double(uint16_t(half ? reg >> 16 : reg & 0xffffu)); }

void mma_emulate(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], float (&c)[32][4]) {
    double A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int h = 0; h < 2; ++h) {
            A[g][2 * t + h] = bf16_half(a[l][0], h);
            A[g + 8][2 * t + h] = bf16_half(a[l][1], h);
            A[g][2 * t + 8 + h] = bf16_half(a[l][2], h);
            A[g + 8][2 * t + 8 + h] = bf16_half(a[l][3], h);
            B[2 * t + h][g] = bf16_half(b[l][0], h);
            B[2 * t + 8 + h][g] = bf16_half(b[l][1], h);
        }
    }
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int e = 0; e < 4; ++e) {
            const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
            double d = c[l][e];
            for (int k = 0; k < 16; ++k) d += A[row][k] * B[k][col];
            c[l][e] = float(d);
        }
    }
}

// One warp over all of K for 16 weight rows and 8 token rows, as quant_mma_kernel's warp 0 with
// nw = 1 computes it. q: the row-major packed bytes; scales/biases: bf16 bits. Returns y[8][16].
template <class F>
std::vector<double> emulate_warp(int k, const std::vector<uint8_t>& q, const std::vector<uint16_t>& scales,
                                 const std::vector<uint16_t>& biases, const std::vector<float>& x) {
    constexpr int CK = F::kMmaChunk;
    const size_t row_bytes = size_t(k) / CK * 64;
    float acc[32][4] = {};
    for (int c = 0; c < k / CK; ++c) {
        uint32_t v[32][2][4];  // lane, row g / g + 8, word
        for (int l = 0; l < 32; ++l)
            for (int h = 0; h < 2; ++h)
                std::memcpy(v[l][h], &q[size_t(l / 4 + 8 * h) * row_bytes + size_t(c) * 64 + 16 * (l % 4)], 16);
        if constexpr (F::kAffine) {
            constexpr int G = F::kGroup, WPG = F::kWordsPerGroup, GPC = CK / G;
            for (int m = 1; m <= 2; m *= 2) {  // qxpose, with __shfl_xor_sync emulated
                if (!(F::kSwap & m)) continue;
                for (int i = 0; i < 2; ++i) {
                    const int a = qdetail::qxpose_word(m, i);
                    uint32_t sent[32][2];
                    for (int l = 0; l < 32; ++l)
                        for (int h = 0; h < 2; ++h) sent[l][h] = qdetail::qxpose_send(v[l][h], l % 4, m, a);
                    for (int l = 0; l < 32; ++l)
                        for (int h = 0; h < 2; ++h) qdetail::qxpose_recv(v[l][h], l % 4, m, a, sent[l ^ m][h]);
                }
            }
            float cg[32][4] = {}, xs[32] = {};
            for (int wd = 0; wd < 4; ++wd) {
                if (wd % WPG == 0)
                    for (int l = 0; l < 32; ++l) {
                        xs[l] = 0.0f;
                        for (float& e : cg[l]) e = 0.0f;
                    }
                uint32_t a01[32][4], a23[32][4], bh[32][2], bl[32][2], bh2[32][2], bl2[32][2];
                for (int l = 0; l < 32; ++l) {
                    const int g = l / 4, t = l % 4;
                    uint32_t a0[4], a8[4];
                    qdetail::qunpack_u4_bf16(v[l][0][wd], a0);
                    qdetail::qunpack_u4_bf16(v[l][1][wd], a8);
                    a01[l][0] = a0[0], a01[l][1] = a8[0], a01[l][2] = a0[1], a01[l][3] = a8[1];
                    a23[l][0] = a0[2], a23[l][1] = a8[2], a23[l][2] = a0[3], a23[l][3] = a8[3];
                    const int kk = c * CK + qdetail::qmma_word_k<F::kSwap>(t, wd);
                    const float* xv = &x[size_t(g) * k + kk];
                    for (int i = 0; i < 8; ++i) xs[l] += xv[i];
                    uint32_t h4[4], l4[4];
                    for (int p = 0; p < 4; ++p) qdetail::qsplit_bf16x2(xv[p], xv[p + 4], h4[p], l4[p]);
                    bh[l][0] = h4[0], bh[l][1] = h4[1], bh2[l][0] = h4[2], bh2[l][1] = h4[3];
                    bl[l][0] = l4[0], bl[l][1] = l4[1], bl2[l][0] = l4[2], bl2[l][1] = l4[3];
                }
                mma_emulate(a01, bh, cg);
                mma_emulate(a23, bh2, cg);
                mma_emulate(a01, bl, cg);
                mma_emulate(a23, bl2, cg);
                if (wd % WPG != WPG - 1) continue;
                const int grp = wd / WPG;
                float xr[32], xq[32];  // the two xor-shuffle rounds
                for (int l = 0; l < 32; ++l) xr[l] = xs[l] + xs[l ^ 1];
                for (int l = 0; l < 32; ++l) xq[l] = xr[l] + xr[l ^ 2];
                for (int l = 0; l < 32; ++l) {
                    const int g = l / 4, t = l % 4;
                    for (int e = 0; e < 4; ++e) {
                        const int row = g + 8 * (e / 2);
                        const size_t at = size_t(row) * (k / G) + size_t(c) * GPC + grp;
                        const float sc = float(bf16_to_double(scales[at])), bi = float(bf16_to_double(biases[at]));
                        const float xc = xq[8 * t + 4 * (e % 2)];
                        acc[l][e] = std::fma(bi, xc, std::fma(sc, cg[l][e], acc[l][e]));
                    }
                }
            }
        } else {
            for (int wd = 0; wd < 4; ++wd) {
                uint32_t a[32][4], bh[32][2], bl[32][2];
                for (int l = 0; l < 32; ++l) {
                    const int g = l / 4, t = l % 4;
                    uint32_t a0[2], a8[2];
                    qdetail::qunpack_row_bf16<F>(v[l][0][wd], a0);
                    qdetail::qunpack_row_bf16<F>(v[l][1][wd], a8);
                    a[l][0] = a0[0], a[l][1] = a8[0], a[l][2] = a0[1], a[l][3] = a8[1];
                    const float* xv = &x[size_t(g) * k + c * CK + 16 * t + 4 * wd];
                    qdetail::qsplit_bf16x2(xv[0], xv[1], bh[l][0], bl[l][0]);
                    qdetail::qsplit_bf16x2(xv[2], xv[3], bh[l][1], bl[l][1]);
                }
                mma_emulate(a, bh, acc);
                mma_emulate(a, bl, acc);
            }
        }
    }
    std::vector<double> y(8 * 16);
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int e = 0; e < 4; ++e) {
            const int row = g + 8 * (e / 2), tok = 2 * t + e % 2;
            double v = acc[l][e];
            if constexpr (!F::kAffine) v = float(v) * float(bf16_to_double(scales[F::kPerTensor ? 0 : row]));
            y[tok * 16 + row] = v;
        }
    }
    return y;
}

// The transpose leaves word w of lane t holding k = qmma_word_k(t, w), inside group w / (G / 32).
template <int G>
int check_transpose_map() {
    using F = qdetail::MlxInt4<G, bf16_t>;
    uint32_t v[4][4];
    for (int t = 0; t < 4; ++t)
        for (int w = 0; w < 4; ++w) v[t][w] = 32 * t + 8 * w;  // as loaded: lane t holds block t
    for (int m = 1; m <= 2; m *= 2) {
        if (!(F::kSwap & m)) continue;
        for (int i = 0; i < 2; ++i) {
            const int a = qdetail::qxpose_word(m, i);
            uint32_t sent[4];
            for (int t = 0; t < 4; ++t) sent[t] = qdetail::qxpose_send(v[t], t, m, a);
            for (int t = 0; t < 4; ++t) qdetail::qxpose_recv(v[t], t, m, a, sent[t ^ m]);
        }
    }
    int bad = 0;
    bool seen[16] = {};
    for (int t = 0; t < 4; ++t)
        for (int w = 0; w < 4; ++w) {
            const int k = int(v[t][w]);
            if (k != qdetail::qmma_word_k<F::kSwap>(t, w) || k / G != w / F::kWordsPerGroup || seen[k / 8]) ++bad;
            seen[k / 8] = true;
        }
    return bad;
}

// One format through emulate_warp against the float64 reference, with the GPU test's bound.
template <class F>
int check_emulation(Fmt f, int k, uint32_t seed, double& worst, bool perturb = false) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> ux(-1.0f, 1.0f), us(0.004f, 0.012f), ub(-0.1f, -0.03f);
    HostWeights h;
    h.q.resize(is_int4(f) ? size_t(16) * k / 2 : size_t(16) * k);
    for (auto& b : h.q) b = uint8_t(rng());
    const int nscales = is_int4(f) ? 16 * (k / group_of(f)) : f == Fmt::fp8_tensor ? 1 : 16;
    for (int i = 0; i < nscales; ++i) {
        h.scales.push_back(uint16_t(qdetail::qbf16_bits(is_int4(f) ? us(rng) : us(rng) / (is_fp8(f) ? 400 : 8))));
        if (is_int4(f)) h.biases.push_back(uint16_t(qdetail::qbf16_bits(ub(rng))));
    }
    std::vector<float> x(size_t(8) * k);
    for (auto& v : x) v = ux(rng);
    x[5] = 1e-30f;  // tiny and huge activations: the hi/lo split must keep them
    x[k + 7] = 3000.0f;
    std::vector<float> xe = x;
    if (perturb) std::swap(xe[0], xe[9]);  // negative control: a k permutation B does not share with A
    const std::vector<double> y = emulate_warp<F>(k, h.q, h.scales, h.biases, xe);
    std::vector<double> w(k), bound(k);
    int bad = 0;
    for (int n = 0; n < 16; ++n) {
        dequant_row(f, h, k, n, w, bound);
        for (int t = 0; t < 8; ++t) {
            double ref = 0.0, mag = 0.0;
            for (int i = 0; i < k; ++i) {
                ref += double(x[size_t(t) * k + i]) * w[i];
                mag += std::fabs(double(x[size_t(t) * k + i])) * bound[i];
            }
            const double e = std::fabs(y[t * 16 + n] - ref), tol = kMmaTolRel * mag + kMmaTolAbs;
            if (!(e <= tol)) ++bad;
            if (!perturb) worst = std::max(worst, e / tol);
        }
    }
    return bad;
}

// ---- Host emulation of quant_wide_kernel's data path (kernels/cuda/quant_wide.cuh) ----
// One block (row group 0, token tile 0, one K slice) of a plain launch of `n` weight rows (n < 256:
// the last warps' rows clamp to the last row) over K = k and `rows` real tokens of the 64-token tile
// (the rest padding): the prep's placement of x's fragments and (int4) group sums (qw_prep_frag /
// qw_prep_frag_codes, qw_xsum), the producer's weight copies (qw_copy_row, qw_row_of), the warps'
// reads (qw_lane_row, qw_xfrag / qw_xfrag_codes), the MMAs and group sums (emulated as emulate_warp
// does), and the epilogue's output positions (codes: the row scale). Returns y[rows][n] (NaN where
// nothing was written; a position written twice counts in `twice`).
template <class F>
std::vector<double> emulate_wide_block(int n, int k, int rows, const HostWeights& h, const std::vector<float>& x, int& twice) {
    using Q = qdetail::QwFmt<F>;
    constexpr int CK = Q::kCK, SK = Q::kSubK, GPC = Q::kGpc, TN = qdetail::kQwTN, TP = qdetail::kQwTokens;
    const int chunks = k / CK;
    const size_t row_bytes = size_t(k) / CK * 64;
    constexpr int kFragWords = Q::kFragBytes / 4;
    // The prep: x's B fragments and group sums per chunk.
    std::vector<uint32_t> X(size_t(chunks) * kFragWords, 0xdeadbeefu);
    std::vector<float> XS(size_t(chunks) * std::max(GPC, 1) * TP, std::nanf(""));
    for (int c = 0; c < chunks; ++c)
        for (int tok = 0; tok < TP; ++tok) {
            float gsum[std::max(GPC, 1)] = {};
            for (int sub = 0; sub < 16; ++sub) {
                float xv[SK];
                for (int i = 0; i < SK; ++i) xv[i] = tok < rows ? x[size_t(tok) * k + c * CK + SK * sub + i] : 0.0f;
                uint32_t* frag = &X[size_t(c) * kFragWords];
                if constexpr (Q::kInt4) {
                    float gs = 0.0f;
                    for (int i = 0; i < 8; ++i) gs += xv[i];
                    gsum[8 * sub / F::kGroup] += gs;
                    uint32_t bh[4], bl[4];
                    for (int q = 0; q < 4; ++q) qdetail::qsplit_bf16x2(xv[q], xv[q + 4], bh[q], bl[q]);
                    const int at = qdetail::qw_prep_frag<F::kSwap>(tok, sub);
                    for (int q = 0; q < 4; ++q) {
                        frag[size_t(at) * 4 + q] = bh[q];
                        frag[size_t(at + 32) * 4 + q] = bl[q];
                    }
                } else {
                    uint32_t bh[2], bl[2];
                    qdetail::qsplit_bf16x2(xv[0], xv[1], bh[0], bl[0]);
                    qdetail::qsplit_bf16x2(xv[2], xv[3], bh[1], bl[1]);
                    const int at = qdetail::qw_prep_frag_codes(tok, sub);
                    frag[size_t(at) * 4 + 0] = bh[0], frag[size_t(at) * 4 + 1] = bh[1];
                    frag[size_t(at) * 4 + 2] = bl[0], frag[size_t(at) * 4 + 3] = bl[1];
                }
            }
            for (int gi = 0; gi < GPC; ++gi) XS[size_t(c) * GPC * TP + qdetail::qw_xsum(gi, tok)] = gsum[gi];
        }
    // The producer: each stage's weight rows and (int4) parameters as the block's threads copy them.
    std::vector<uint8_t> W(size_t(chunks) * qdetail::kQwRows * 64, 0xee);
    std::vector<uint16_t> PS(size_t(chunks) * qdetail::kQwRows * GPC), PB(PS.size());
    for (int c = 0; c < chunks; ++c)
        for (int tid = 0; tid < 256; ++tid) {
            for (int q = 0; q < 4; ++q) {
                const int r = qdetail::qw_copy_row(tid, q), row = std::min(qdetail::qw_row_of<false>(0, r), n - 1);
                std::memcpy(&W[(size_t(c) * qdetail::kQwRows + r) * 64 + (tid % 4) * 16], &h.q[size_t(row) * row_bytes + size_t(c) * 64 + (tid % 4) * 16], 16);
            }
            if constexpr (Q::kInt4) {
                const int row = std::min(qdetail::qw_row_of<false>(0, tid), n - 1);
                for (int j = 0; j < GPC; ++j) {
                    PS[(size_t(c) * qdetail::kQwRows + tid) * GPC + j] = h.scales[size_t(row) * (k / F::kGroup) + c * GPC + j];
                    PB[(size_t(c) * qdetail::kQwRows + tid) * GPC + j] = h.biases[size_t(row) * (k / F::kGroup) + c * GPC + j];
                }
            }
        }
    // The warps.
    std::vector<double> y(size_t(rows) * n, std::nan(""));
    twice = 0;
    for (int warp = 0; warp < qdetail::kQwWarps; ++warp)
        for (int m = 0; m < 2; ++m) {
            static float acc[TN][32][4];
            for (auto& a : acc)
                for (auto& l : a)
                    for (float& e : l) e = 0.0f;
            for (int c = 0; c < chunks; ++c) {
                uint32_t v[32][2][4];
                for (int l = 0; l < 32; ++l)
                    for (int hh = 0; hh < 2; ++hh)
                        std::memcpy(v[l][hh], &W[(size_t(c) * qdetail::kQwRows + qdetail::qw_lane_row(warp, m, l / 4, hh)) * 64 + 16 * (l % 4)], 16);
                const uint32_t* frag = &X[size_t(c) * kFragWords];
                if constexpr (!Q::kInt4) {
                    for (int wd = 0; wd < 4; ++wd) {
                        uint32_t a[32][4];
                        for (int l = 0; l < 32; ++l) {
                            uint32_t a0[2], a8[2];
                            qdetail::qunpack_row_bf16<F>(v[l][0][wd], a0);
                            qdetail::qunpack_row_bf16<F>(v[l][1][wd], a8);
                            a[l][0] = a0[0], a[l][1] = a8[0], a[l][2] = a0[1], a[l][3] = a8[1];
                        }
                        for (int nt = 0; nt < TN; ++nt) {
                            uint32_t bh[32][2], bl[32][2];
                            for (int l = 0; l < 32; ++l) {
                                const uint32_t* b = &frag[size_t(qdetail::qw_xfrag_codes(wd, nt, l)) * 4];
                                bh[l][0] = b[0], bh[l][1] = b[1], bl[l][0] = b[2], bl[l][1] = b[3];
                            }
                            mma_emulate(a, bh, acc[nt]);
                            mma_emulate(a, bl, acc[nt]);
                        }
                    }
                } else {
                for (int mm = 1; mm <= 2; mm *= 2) {  // qxpose, __shfl_xor_sync emulated
                    if (!(F::kSwap & mm)) continue;
                    for (int i = 0; i < 2; ++i) {
                        const int a = qdetail::qxpose_word(mm, i);
                        uint32_t sent[32][2];
                        for (int l = 0; l < 32; ++l)
                            for (int hh = 0; hh < 2; ++hh) sent[l][hh] = qdetail::qxpose_send(v[l][hh], l % 4, mm, a);
                        for (int l = 0; l < 32; ++l)
                            for (int hh = 0; hh < 2; ++hh) qdetail::qxpose_recv(v[l][hh], l % 4, mm, a, sent[l ^ mm][hh]);
                    }
                }
                static float cg[TN][32][4];
                for (int wd = 0; wd < 4; ++wd) {
                    if (wd % F::kWordsPerGroup == 0)
                        for (auto& a : cg)
                            for (auto& l : a)
                                for (float& e : l) e = 0.0f;
                    uint32_t a01[32][4], a23[32][4];
                    for (int l = 0; l < 32; ++l) {
                        uint32_t a0[4], a8[4];
                        qdetail::qunpack_u4_bf16(v[l][0][wd], a0);
                        qdetail::qunpack_u4_bf16(v[l][1][wd], a8);
                        a01[l][0] = a0[0], a01[l][1] = a8[0], a01[l][2] = a0[1], a01[l][3] = a8[1];
                        a23[l][0] = a0[2], a23[l][1] = a8[2], a23[l][2] = a0[3], a23[l][3] = a8[3];
                    }
                    for (int nt = 0; nt < TN; ++nt) {
                        uint32_t bh[32][2], bh2[32][2], bl[32][2], bl2[32][2];
                        for (int l = 0; l < 32; ++l) {
                            const uint32_t* vh = &frag[size_t(qdetail::qw_xfrag(wd, nt, l)) * 4];
                            const uint32_t* vl = &frag[size_t(qdetail::qw_xfrag(wd, nt, l) + 32) * 4];
                            bh[l][0] = vh[0], bh[l][1] = vh[1], bh2[l][0] = vh[2], bh2[l][1] = vh[3];
                            bl[l][0] = vl[0], bl[l][1] = vl[1], bl2[l][0] = vl[2], bl2[l][1] = vl[3];
                        }
                        mma_emulate(a01, bh, cg[nt]);
                        mma_emulate(a23, bh2, cg[nt]);
                        mma_emulate(a01, bl, cg[nt]);
                        mma_emulate(a23, bl2, cg[nt]);
                    }
                    if (wd % F::kWordsPerGroup != F::kWordsPerGroup - 1) continue;
                    const int grp = wd / F::kWordsPerGroup;
                    for (int nt = 0; nt < TN; ++nt)
                        for (int l = 0; l < 32; ++l) {
                            const int g = l / 4, t = l % 4;
                            for (int e = 0; e < 4; ++e) {
                                const int r = qdetail::qw_lane_row(warp, m, g, e / 2);
                                const float sc = float(bf16_to_double(PS[(size_t(c) * qdetail::kQwRows + r) * GPC + grp]));
                                const float bi = float(bf16_to_double(PB[(size_t(c) * qdetail::kQwRows + r) * GPC + grp]));
                                const float xc = XS[size_t(c) * GPC * TP + qdetail::qw_xsum(grp, nt * 8 + 2 * t + e % 2)];
                                acc[nt][l][e] = std::fma(bi, xc, std::fma(sc, cg[nt][l][e], acc[nt][l][e]));
                            }
                        }
                }
                }
            }
            for (int nt = 0; nt < TN; ++nt)
                for (int l = 0; l < 32; ++l) {
                    const int g = l / 4, t = l % 4;
                    for (int e = 0; e < 4; ++e) {
                        const int tok = nt * 8 + 2 * t + (e & 1);
                        const int row = qdetail::qw_row_of<false>(0, qdetail::qw_lane_row(warp, m, g, e >> 1));
                        if (tok >= rows || row >= n) continue;
                        double& out = y[size_t(tok) * n + row];
                        twice += std::isnan(out) ? 0 : 1;
                        out = acc[nt][l][e];
                        if constexpr (!Q::kInt4) out = float(out) * float(bf16_to_double(h.scales[F::kPerTensor ? 0 : row]));
                    }
                }
        }
    return y;
}

// emulate_wide_block against the float64 reference (the GPU test's bound); `perturb`: a negative
// control (x permuted in the emulation's input only), which must fail.
template <class F>
int check_wide_emulation(Fmt f, int n, int k, int rows, uint32_t seed, double& worst, bool perturb = false) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> ux(-1.0f, 1.0f), us(0.004f, 0.012f), ub(-0.1f, -0.03f);
    HostWeights h;
    h.q.resize(is_int4(f) ? size_t(n) * k / 2 : size_t(n) * k);
    for (auto& b : h.q) b = uint8_t(rng());
    const int nscales = is_int4(f) ? n * (k / group_of(f)) : f == Fmt::fp8_tensor ? 1 : n;
    for (int i = 0; i < nscales; ++i) {
        h.scales.push_back(uint16_t(qdetail::qbf16_bits(is_int4(f) ? us(rng) : us(rng) / (is_fp8(f) ? 400 : 8))));
        if (is_int4(f)) h.biases.push_back(uint16_t(qdetail::qbf16_bits(ub(rng))));
    }
    std::vector<float> x(size_t(rows) * k);
    for (auto& v : x) v = ux(rng) * 2.0f;
    std::vector<float> xe = x;
    if (perturb) std::swap(xe[size_t(rows - 1) * k + 3], xe[size_t(rows - 1) * k + 77]);
    int twice = 0;
    const std::vector<double> y = emulate_wide_block<F>(n, k, rows, h, xe, twice);
    int bad = twice;
    std::vector<double> w(k), bound(k);
    for (int r = 0; r < n; ++r) {
        dequant_row(f, h, k, r, w, bound);
        for (int t = 0; t < rows; ++t) {
            double ref = 0.0, mag = 0.0;
            for (int i = 0; i < k; ++i) {
                ref += double(x[size_t(t) * k + i]) * w[i];
                mag += std::fabs(double(x[size_t(t) * k + i])) * bound[i];
            }
            const double e = std::fabs(y[size_t(t) * n + r] - ref), tol = kMmaTolRel * mag + kMmaTolAbs;
            if (!(e <= tol)) ++bad;  // NaN: never written
            if (!perturb) worst = std::max(worst, e / tol);
        }
    }
    return bad;
}

// ---- Host emulation of the quantized MoE experts' GEMVs (kernels/cuda/moe_quant.cuh) ----
// E = 3 random experts in format F (gate / up [FF][H], down [H][FF]) laid out as the weight table
// holds them (each projection's codes, scales and MLX biases adjacent, the table's pointers in
// apply.cpp's order); one token row x, each expert picked: act = silu(x . Wg) * (x . Wu) and
// y = act . Wd through qexpert + qdot_lane (32 lanes summed in warp_sum's xor-butterfly order) +
// qdot_finish, against float64 from the layout definition (dequant_row); the kernels' own forms
// (grouped: several x rows; per pair: x staged swizzled, several matrix rows) bit for bit that one. perturb: the kernel reads the experts' table shifted by one
// expert (a negative control: must fail).
template <class F, int H, int FF>
int check_moe_qdot(Fmt f, uint32_t seed, double& worst, bool perturb = false) {
    constexpr int E = 3;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> ux(-1.0f, 1.0f), us(0.004f, 0.012f), ub(-0.1f, -0.03f);
    auto random_weights = [&](int n, int k) {
        HostWeights h;
        h.q.resize(is_int4(f) ? size_t(n) * k / 2 : size_t(n) * k);
        for (auto& b : h.q) b = uint8_t(rng());
        if (is_fp8(f))
            for (auto& b : h.q)
                if ((b & 0x7f) == 0x7f) b -= 1;  // no NaN codes (scr quantize never writes them)
        const int nscales = is_int4(f) ? n * (k / group_of(f)) : f == Fmt::fp8_tensor ? 1 : n;
        for (int i = 0; i < nscales; ++i) {
            h.scales.push_back(uint16_t(qdetail::qbf16_bits(is_int4(f) ? us(rng) : us(rng) / (is_fp8(f) ? 400 : 8))));
            if (is_int4(f)) h.biases.push_back(uint16_t(qdetail::qbf16_bits(ub(rng))));
        }
        return h;
    };
    std::vector<HostWeights> mats;  // expert e's projection j at 3 e + j
    std::vector<const void*> table;
    for (int e = 0; e < E; ++e)
        for (int j = 0; j < 3; ++j) mats.push_back(j < 2 ? random_weights(FF, H) : random_weights(H, FF));
    for (const HostWeights& m : mats) {
        table.push_back(m.q.data());
        table.push_back(m.scales.data());
        if (is_int4(f)) table.push_back(m.biases.data());
    }
    std::vector<float> x(H);
    for (auto& v : x) v = ux(rng);
    auto warp_dot = [&](const QuantW& w, int n, const float* xr, int k) {
        float lane[32];
        for (int l = 0; l < 32; ++l) lane[l] = k == H ? qdetail::qdot_lane<H, F>(w, n, xr, l) : qdetail::qdot_lane<FF, F>(w, n, xr, l);
        for (int o = 16; o > 0; o >>= 1) {  // warp_sum: every lane adds its xor partner's value
            float next[32];
            for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ o];
            std::memcpy(lane, next, sizeof lane);
        }
        return qdetail::qdot_finish<F>(w, n, lane[0]);
    };
    const void* const* experts = table.data() + (perturb ? 3 * qdetail::kQuantTensors<F> : 0);
    int bad = 0;
    if (!perturb) {
        // The grouped kernels' form (qdot_lanes over 5 rows of a chunk of 8): every lane's part of
        // every row has the bits of the one-row form.
        std::vector<float> xg(size_t(5) * H);
        for (auto& v : xg) v = ux(rng);
        const float* rows[qdetail::kMoeQuantChunk];
        for (int r = 0; r < qdetail::kMoeQuantChunk; ++r) rows[r] = &xg[size_t(std::min(r, 4)) * H];
        const QuantW gate = qdetail::qexpert<F>(experts, 1, 0), up = qdetail::qexpert<F>(experts, 1, 1);
        // The per-pair kernels' form: x staged swizzled (as moe_quant_stage_x), gate and up rows n
        // and n + 1 in one call (M = 4, qdot_x4<true>).
        std::vector<float4> staged(qdetail::kMoeQuantStagedFloats<H> / 4);
        for (int q = 0; q < H / 4; ++q) staged[qdetail::qdot_x_slot(q)] = float4{xg[4 * q], xg[4 * q + 1], xg[4 * q + 2], xg[4 * q + 3]};
        const float* const staged_row[1] = {reinterpret_cast<const float*>(staged.data())};
        for (int n = 0; n < FF; n += 7)
            for (int l = 0; l < 32; ++l) {
                const QuantW g1[1] = {gate};
                const int n1[1] = {n};
                float part[1][qdetail::kMoeQuantChunk];
                qdetail::qdot_lanes<H, F, qdetail::kMoeQuantChunk>(g1, n1, rows, 5, l, part);
                for (int r = 0; r < 5; ++r) {
                    const float one = qdetail::qdot_lane<H, F>(gate, n, rows[r], l);
                    bad += std::memcmp(&one, &part[0][r], 4) != 0;
                }
                const int n2 = n + 1 < FF ? n + 1 : n;
                const QuantW w4[4] = {gate, up, gate, up};
                const int n4[4] = {n, n, n2, n2};
                float four[4][1];
                qdetail::qdot_lanes<H, F, 1, 4, true>(w4, n4, staged_row, 1, l, four);
                for (int m = 0; m < 4; ++m) {
                    const float one = qdetail::qdot_lane<H, F>(w4[m], n4[m], rows[0], l);
                    bad += std::memcmp(&one, &four[m][0], 4) != 0;
                }
            }
    }
    std::vector<double> w(std::max(H, FF)), bound(std::max(H, FF)), wu(H), bu(H);
    for (int e = 0; e < (perturb ? E - 1 : E); ++e) {
        // act: the kernel's float values, and float64 with its bound
        std::vector<float> act(FF);
        for (int i = 0; i < FF; ++i) {
            const float g = warp_dot(qdetail::qexpert<F>(experts, e, 0), i, x.data(), H);
            const float u = warp_dot(qdetail::qexpert<F>(experts, e, 1), i, x.data(), H);
            act[i] = g * (1.0f / (1.0f + std::exp(-g))) * u;
            dequant_row(f, mats[3 * e], H, i, w, bound);
            dequant_row(f, mats[3 * e + 1], H, i, wu, bu);
            double gr = 0, ur = 0, gm = 0, um = 0;
            for (int k = 0; k < H; ++k) {
                gr += double(x[k]) * w[k];
                ur += double(x[k]) * wu[k];
                gm += std::fabs(double(x[k])) * bound[k];
                um += std::fabs(double(x[k])) * bu[k];
            }
            const double sg = gr / (1.0 + std::exp(-gr)), ref = sg * ur;
            // |d silu| <= 1.1 |dg|: the bound on act from the dots' bounds (2e-5 B + 1e-6 each) and its own rounding
            const double tg = kMmaTolRel * gm + kMmaTolAbs, tu = kMmaTolRel * um + kMmaTolAbs;
            const double tol = 1.1 * tg * (std::fabs(ur) + tu) + std::fabs(sg) * tu + 1e-6 * std::fabs(ref) + 1e-9;
            const double err = std::fabs(double(act[i]) - ref);
            if (!(err <= tol)) ++bad;
            if (!perturb) worst = std::max(worst, err / tol);
        }
        for (int h = 0; h < H; ++h) {
            const float y = warp_dot(qdetail::qexpert<F>(experts, e, 2), h, act.data(), FF);
            dequant_row(f, mats[3 * e + 2], FF, h, w, bound);
            double ref = 0, mag = 0;
            for (int k = 0; k < FF; ++k) {
                ref += double(act[k]) * w[k];  // the kernel's act in: this checks the down GEMV alone
                mag += std::fabs(double(act[k])) * bound[k];
            }
            const double tol = kMmaTolRel * mag + kMmaTolAbs;
            const double err = std::fabs(double(y) - ref);
            if (!(err <= tol)) ++bad;
            if (!perturb) worst = std::max(worst, err / tol);
        }
    }
    return bad;
}

// Exactness of the bit tricks on the host (runs here, no GPU): every nibble and every int8 value;
// then the tensor-core kernel's mapping, emulated.
int host_selftest() {
    int bad = 0;
    const uint32_t pattern = 0xa5c3e1f7u;  // the other elements of the word: every nibble different
    for (int pos = 0; pos < 8; ++pos)
        for (uint32_t v = 0; v < 16; ++v) {
            const uint32_t w = (pattern & ~(0xfu << (4 * pos))) | (v << (4 * pos));
            float q[8];
            qdetail::unpack_u4x8(w, q);
            for (int i = 0; i < 8; ++i)
                if (q[i] != float((w >> (4 * i)) & 15u)) ++bad;
        }
    for (int pos = 0; pos < 4; ++pos)
        for (int v = -128; v < 128; ++v) {
            const uint32_t w = (pattern & ~(0xffu << (8 * pos))) | (uint32_t(uint8_t(int8_t(v))) << (8 * pos));
            float q[4];
            qdetail::unpack_s8x4(w, q);
            for (int i = 0; i < 4; ++i)
                if (q[i] != float(int8_t(uint8_t(w >> (8 * i))))) ++bad;
        }
    // The smem kernel's int4 denormals: nibble i of a word (half-word i / 4, masked in place) times
    // x staged with qs_x_scale(i % 4) is x q 2^-60 exactly, for x across the float range it meets.
    for (int pos = 0; pos < 8; ++pos)
        for (uint32_t v = 0; v < 16; ++v) {
            const uint32_t w = (pattern & ~(0xfu << (4 * pos))) | (v << (4 * pos));
            float q[4];
            qdetail::qs_u4_half(pos >= 4 ? w >> 16 : w & 0xffffu, q);
            for (float x : {1.0f, -0.7071f, 3.0e-7f, 1234.5f, 1.0e9f}) {
                const volatile float xs = x * qdetail::qs_x_scale(pos % 4);  // volatile: computed at run time
                const double got = double(xs * q[pos % 4]) * 0x1p60;
                if (got != double(float(double(x) * v))) ++bad;
            }
        }
    // The MMA operands: nibble pairs (p, p + 4) and int8 byte pairs as exact bf16x2.
    for (int pos = 0; pos < 8; ++pos)
        for (uint32_t v = 0; v < 16; ++v) {
            const uint32_t w = (pattern & ~(0xfu << (4 * pos))) | (v << (4 * pos));
            uint32_t a[4];
            qdetail::qunpack_u4_bf16(w, a);
            for (int i = 0; i < 8; ++i)
                if (bf16_half(a[i % 4], i / 4) != double((w >> (4 * i)) & 15u)) ++bad;
        }
    for (int pos = 0; pos < 4; ++pos)
        for (int v = -128; v < 128; ++v) {
            const uint32_t w = (pattern & ~(0xffu << (8 * pos))) | (uint32_t(uint8_t(int8_t(v))) << (8 * pos));
            uint32_t a[2];
            qdetail::qunpack_s8_bf16(w, a);
            for (int i = 0; i < 4; ++i)
                if (bf16_half(a[i / 2], i % 2) != double(int8_t(uint8_t(w >> (8 * i))))) ++bad;
        }
    // fp8 e4m3: every byte at every position, as bf16x2 (the MMA operands) and as floats (SIMT).
    for (int pos = 0; pos < 4; ++pos)
        for (uint32_t v = 0; v < 256; ++v) {
            const uint32_t w = (pattern & ~(0xffu << (8 * pos))) | (v << (8 * pos));
            uint32_t a[2];
            qdetail::qunpack_fp8_bf16(w, a);
            float q[4];
            qdetail::unpack_fp8x4(w, q);
            for (int i = 0; i < 4; ++i) {
                const double want = fp8_value(uint8_t(w >> (8 * i)));
                if (bf16_half(a[i / 2], i % 2) != want || double(q[i]) != want) ++bad;
            }
        }
    // x = hi + lo to ~2^-16 relative (bf16 rounding of lo), over magnitudes from 1e-30 to 1e30.
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> um(-1.0f, 1.0f), ue(-69.0f, 69.0f);
    for (int i = 0; i < 100000; ++i) {
        const float x0 = um(rng) * std::exp(ue(rng)), x1 = um(rng);
        uint32_t hi, lo;
        qdetail::qsplit_bf16x2(x0, x1, hi, lo);
        if (std::fabs(bf16_half(hi, 0) + bf16_half(lo, 0) - x0) > 0x1p-16 * std::fabs(x0)) ++bad;
        if (std::fabs(bf16_half(hi, 1) + bf16_half(lo, 1) - x1) > 0x1p-16 * std::fabs(x1)) ++bad;
    }
    std::printf("host selftest (int4 / int8 / fp8 unpacking to float and to bf16x2, every value at every position; x hi/lo split): %s\n",
                bad ? "FAILED" : "ok");
    const int xbad = check_transpose_map<32>() + check_transpose_map<64>() + check_transpose_map<128>();
    std::printf("host selftest (lane transpose: word w of lane t holds k = qmma_word_k(t, w), in group w / (G / 32)): %s\n",
                xbad ? "FAILED" : "ok");
    double worst = 0.0;
    int ebad = 0, control = 0;
    ebad += check_emulation<qdetail::MlxInt4<32, bf16_t>>(Fmt::int4_g32, 512, 1, worst);
    ebad += check_emulation<qdetail::MlxInt4<64, bf16_t>>(Fmt::int4_g64, 512, 2, worst);
    ebad += check_emulation<qdetail::MlxInt4<128, bf16_t>>(Fmt::int4_g128, 384, 3, worst);
    ebad += check_emulation<qdetail::Int8Channel<bf16_t>>(Fmt::int8, 320, 4, worst);
    ebad += check_emulation<qdetail::Fp8E4M3<bf16_t, false>>(Fmt::fp8, 320, 5, worst);
    ebad += check_emulation<qdetail::Fp8E4M3<bf16_t, true>>(Fmt::fp8_tensor, 192, 6, worst);
    // The negative control must fail for every format (the check sees a k permutation error).
    constexpr int kWarpControls = 6;
    double unused = 0.0;
    control += check_emulation<qdetail::MlxInt4<32, bf16_t>>(Fmt::int4_g32, 512, 1, unused, true) > 0;
    control += check_emulation<qdetail::MlxInt4<64, bf16_t>>(Fmt::int4_g64, 512, 2, unused, true) > 0;
    control += check_emulation<qdetail::MlxInt4<128, bf16_t>>(Fmt::int4_g128, 384, 3, unused, true) > 0;
    control += check_emulation<qdetail::Int8Channel<bf16_t>>(Fmt::int8, 320, 4, unused, true) > 0;
    control += check_emulation<qdetail::Fp8E4M3<bf16_t, false>>(Fmt::fp8, 320, 5, unused, true) > 0;
    control += check_emulation<qdetail::Fp8E4M3<bf16_t, true>>(Fmt::fp8_tensor, 192, 6, unused, true) > 0;
    std::printf("host selftest (tensor-core warp emulated, int4 g32/g64/g128 + int8 + fp8 channel/tensor, 16 rows x 8 tokens, "
                "against float64, bound 2e-5 B + 1e-6): worst err/bound %.3g, %d wrong; negative control caught %d/%d: %s\n",
                worst, ebad, control, kWarpControls, ebad == 0 && control == kWarpControls ? "ok" : "FAILED");
    // quant_wide_kernel's data path (int8 / fp8 too, off by default): 40 rows (warps 2-7
    // clamp to the last row), 37 real tokens of the 64-token tile, 3 chunks; g32 and g64. The
    // SwiGLU row map sends a lane's gate and up tiles to the same output rows, every row once.
    double wworst = 0.0;
    int wbad = 0, wcontrol = 0;
    constexpr int kWideControls = 5;  // the negative controls below: each must fail
    wbad += check_wide_emulation<qdetail::MlxInt4<32, bf16_t>>(Fmt::int4_g32, 40, 384, 37, 7, wworst);
    wbad += check_wide_emulation<qdetail::MlxInt4<64, bf16_t>>(Fmt::int4_g64, 40, 384, 37, 8, wworst);
    wbad += check_wide_emulation<qdetail::Int8Channel<bf16_t>>(Fmt::int8, 40, 384, 37, 9, wworst);
    wbad += check_wide_emulation<qdetail::Fp8E4M3<bf16_t, false>>(Fmt::fp8, 40, 384, 37, 10, wworst);
    wbad += check_wide_emulation<qdetail::Fp8E4M3<bf16_t, true>>(Fmt::fp8_tensor, 40, 320, 37, 11, wworst);
    wcontrol += check_wide_emulation<qdetail::MlxInt4<32, bf16_t>>(Fmt::int4_g32, 40, 384, 37, 7, unused, true) > 0;
    wcontrol += check_wide_emulation<qdetail::MlxInt4<64, bf16_t>>(Fmt::int4_g64, 40, 384, 37, 8, unused, true) > 0;
    wcontrol += check_wide_emulation<qdetail::Int8Channel<bf16_t>>(Fmt::int8, 40, 384, 37, 9, unused, true) > 0;
    wcontrol += check_wide_emulation<qdetail::Fp8E4M3<bf16_t, false>>(Fmt::fp8, 40, 384, 37, 10, unused, true) > 0;
    wcontrol += check_wide_emulation<qdetail::Fp8E4M3<bf16_t, true>>(Fmt::fp8_tensor, 40, 320, 37, 11, unused, true) > 0;
    {
        std::vector<int> seen(2 * qdetail::kQwRows / 2, 0);  // two row groups of 128 output rows
        for (int rg = 0; rg < 2; ++rg)
            for (int warp = 0; warp < qdetail::kQwWarps; ++warp)
                for (int g = 0; g < 8; ++g)
                    for (int hh = 0; hh < 2; ++hh) {
                        const int gate = qdetail::qw_row_of<true>(rg, qdetail::qw_lane_row(warp, 0, g, hh));
                        const int up = qdetail::qw_row_of<true>(rg, qdetail::qw_lane_row(warp, 1, g, hh));
                        if (gate != up || gate < 0 || gate >= int(seen.size())) ++wbad;
                        else ++seen[size_t(gate)];
                    }
        for (int c : seen) wbad += c != 1;
    }
    std::printf("host selftest (quant_wide_kernel's block emulated: prep placement, weight copies, warp reads, MMAs, epilogue "
                "positions; int4 g32/g64, int8, fp8 channel/tensor, 40 rows x 37 of 64 tokens x 384 (fp8 tensor 320) k, against "
                "float64, bound 2e-5 B + 1e-6): worst err/bound %.3g, %d wrong; negative control caught %d/%d: %s\n",
                wworst, wbad, wcontrol, kWideControls, wbad == 0 && wcontrol == kWideControls ? "ok" : "FAILED");
    // The split-K choice (qmma_split): a valid launch for every shape (whole chunks per warp, at most
    // 8 warps and 8 blocks per cluster), mode 0 is the original split, mode 1 fits one wave (row tiles
    // x slices <= resident warps, or 1 slice) and could not double without leaving it.
    int sbad = 0;
    for (int mode = 0; mode <= 1; ++mode)
        for (int resident : {1056, 2112, 16384})
            for (int tiles : {1, 7, 64, 128, 192, 512, 8016})
                for (int chunks : {1, 3, 6, 16, 24, 64, 112, 256}) {
                    const qdetail::QMmaSplit sp = qdetail::qmma_split(tiles, chunks, mode, resident);
                    const int slices = sp.warps * sp.blocks, old = qdetail::qmma_warps(chunks);
                    if (sp.warps < 1 || sp.warps > 8 || sp.blocks < 1 || sp.blocks > 8 || chunks % slices != 0) ++sbad;
                    if (mode == 0 && (sp.warps != old || sp.blocks != 1)) ++sbad;
                    if (mode == 1 && slices > 1 && int64_t(tiles) * slices > resident) ++sbad;  // a second wave
                    if (mode == 1 && slices < 64 && chunks % (2 * slices) == 0 && int64_t(tiles) * 2 * slices <= resident) ++sbad;
                    if (mode == 1 && sp.blocks > 1 && sp.warps != 8) ++sbad;  // clusters only once blocks are full
                }
    // The 1B shapes of the timing table on the H200 (132 SMs x 16 warps), by hand from the rule
    // (int4: chunks of 128 k): q/o and down one cluster of 2 full blocks, gate/up 4 warps, lm_head 1.
    const auto split_is = [](int n, int k, int warps, int blocks) {
        const qdetail::QMmaSplit sp = qdetail::qmma_split((n + 15) / 16, k / 128, 1, 132 * 16);
        return sp.warps == warps && sp.blocks == blocks;
    };
    sbad += !split_is(2048, 2048, 8, 2) + !split_is(2048, 8192, 8, 2) + !split_is(8192, 2048, 4, 1) + !split_is(128256, 2048, 1, 1) +
            !split_is(3072, 2048, 8, 1);
    std::printf("host selftest (split-K choice, 336 tile/chunk/mode/resident cases + the 1B shapes): %d wrong: %s\n", sbad,
                sbad ? "FAILED" : "ok");

    // quant_wide_kernel's K split (qwide_choose) on two residency models (clusters of 1 / 2 / 4 / 8:
    // an H100 / H200 as measured, 132 / 132 / 120 / 120 blocks, and a small 16 / 16 / 16 / 8): a
    // valid split (a power of two up to 8 dividing the chunks); a global split only with more than one
    // slice, within the one-wave limit, and only where the cluster of the same size would not fit in
    // one wave (the same split as a cluster costs less); with rule 0 or no global split allowed, the
    // cluster-only rule of session 36 (restated here); rules 2 and 3 the split of rule 1, through
    // global memory wherever one wave holds it (2) or as clusters (3). The 8B / 1B MLX int4 shapes on
    // the H100 / H200 model, by hand from the rule: 4096x4096 and 4096x14336 (16 row groups) global 8
    // instead of a cluster of 4 (64 of 132 SMs); the 8B's qkv (24 row groups) a cluster of 4; the
    // 1B's (12 row groups) a cluster of 8; int8 (6 stages of 64-k chunks): 4096x4096 stays a cluster
    // of 4, 4096x14336 global 8.
    int qbad = 0, qcases = 0;
    static int s_model = 0;
    const auto resident = [](int c) {
        static const int big[] = {132, 132, 0, 120, 0, 0, 0, 120}, small[] = {16, 16, 0, 16, 0, 0, 0, 8};
        return (s_model == 0 ? big : small)[c - 1];
    };
    for (s_model = 0; s_model <= 1; ++s_model)
        for (int stages : {4, 6})
            for (int global_blocks : {0, 16, 132})
                for (int rg : {1, 2, 8, 12, 16, 24, 33, 56, 112, 500})
                    for (int chunks : {1, 3, 8, 16, 24, 32, 64, 112, 224}) {
                        ++qcases;
                        const qdetail::QWidePlan pl = qdetail::qwide_choose(rg, chunks, stages, stages == 4 ? 1.0 : 3.0, resident, global_blocks, 1, 0);
                        const qdetail::QWidePlan p0 = qdetail::qwide_choose(rg, chunks, stages, stages == 4 ? 1.0 : 3.0, resident, global_blocks, 0, 0);
                        const qdetail::QWidePlan p2 = qdetail::qwide_choose(rg, chunks, stages, stages == 4 ? 1.0 : 3.0, resident, global_blocks, 2, 0);
                        const qdetail::QWidePlan p3 = qdetail::qwide_choose(rg, chunks, stages, stages == 4 ? 1.0 : 3.0, resident, global_blocks, 3, 0);
                        const int c = pl.slices;
                        if (p2.slices != c || p3.slices != c || p3.global || p2.global != (c > 1 && rg * c <= global_blocks)) ++qbad;
                        if (c != 1 && c != 2 && c != 4 && c != 8) { ++qbad; continue; }
                        if (chunks % c != 0 || pl.row_groups != rg) ++qbad;
                        if (pl.global && (c == 1 || rg * c > global_blocks || rg * c <= resident(c))) ++qbad;
                        // The cluster-only rule: the least waves x (chunks per slice + fill) + 1.5 per meeting.
                        int want = 0;
                        double best = 1e30;
                        for (int cc = 1; cc <= 8; cc *= 2) {
                            if (chunks % cc != 0 || resident(cc) < cc) continue;
                            const int waves = (rg * cc + resident(cc) - 1) / resident(cc);
                            const double cost = waves * (chunks / cc + stages - 1.0) + (cc > 1 ? 1.5 : 0.0);
                            if (cost < best) best = cost, want = cc;
                        }
                        if (global_blocks == 0 && (pl.global || c != want)) ++qbad;
                        if (p0.global || p0.slices != want) ++qbad;
                    }
    s_model = 0;
    const auto wide_is = [&](bool int4, int rg, int k, int slices, bool global) {
        const qdetail::QWidePlan pl = int4 ? qdetail::qwide_choose(rg, k / 128, 4, 1.0, resident, 132, 1, 0)
                                           : qdetail::qwide_choose(rg, k / 64, 6, 3.0, resident, 132, 1, 0);
        return pl.slices == slices && pl.global == global;
    };
    qbad += !wide_is(true, 16, 4096, 8, true) + !wide_is(true, 16, 14336, 8, true) + !wide_is(true, 24, 4096, 4, false) +
            !wide_is(true, 12, 2048, 8, false) + !wide_is(false, 16, 4096, 4, false) + !wide_is(false, 16, 14336, 8, true);
    std::printf("host selftest (quant_wide_kernel's K split, %d row group / chunk / stage / residency cases + the 8B and 1B shapes): "
                "%d wrong: %s\n", qcases, qbad, qbad ? "FAILED" : "ok");
    sbad += qbad;

    // The one-row tensor-core kernel's launch shapes for the Llama 1B / 8B at one token row on the
    // H200 (132 SMs x 16 resident warps), by hand from the rules (docs/CUDA.md "Session 20" and
    // "Session 21"; no switches set): {warps of the instance, W, row tiles per block}.
    int bbad = 0;
    const auto block_is = [&](const char* what, bool swiglu, int n, int k, qdetail::QMma1Block want) {
        const int tiles = (n + 15) / 16, chunks = k / 128;
        const int parts = qdetail::qmma1_parts(tiles, chunks, 132 * 16);
        const qdetail::QMma1Block b = qdetail::qmma1_block_shape(swiglu, parts, false, tiles, chunks, 132);
        if (b.warps == want.warps && b.parts == want.parts && b.tiles == want.tiles) return;
        ++bbad;
        std::printf("host selftest: %s: block %d warps, W %d, %d tiles; want %d, %d, %d\n", what, b.warps, b.parts, b.tiles,
                    want.warps, want.parts, want.tiles);
    };
    block_is("1B qkv", false, 3072, 2048, {16, 8, 2});
    block_is("1B o", false, 2048, 2048, {16, 8, 1});                 // fill: 128 blocks of 1 x 8
    block_is("1B gate/up", true, 8192, 2048, {8, 4, 2});
    block_is("1B down", false, 2048, 8192, {16, 16, 1});             // W = 16
    block_is("1B lm_head", false, 128256, 2048, {8, 1, 8});
    block_is("8B qkv", false, 6144, 4096, {16, 4, 3});               // fill: 128 blocks of 3 x 4
    block_is("8B o", false, 4096, 4096, {16, 8, 2});
    block_is("8B gate/up", true, 14336, 4096, {16, 2, 7});           // fill: 128 blocks of 7 x 2
    block_is("8B down", false, 4096, 14336, {16, 8, 2});
    block_is("8B lm_head", false, 128256, 4096, {8, 1, 8});
    std::printf("host selftest (one-row block shapes, 10 Llama launches): %d wrong: %s\n", bbad, bbad ? "FAILED" : "ok");
    // The quantized MoE experts' GEMVs: the tiny Qwen3-MoE's widths (96 / 64), the 30B-A3B's (2048 /
    // 768), and 4224 (a second round of 4 chunks per lane) for every format.
    double mworst = 0.0;
    int mbad = 0, mcontrol = 0, mcases = 0;
    const auto moe_case = [&]<class F, int H, int FF>(Fmt f, uint32_t seed) {
        double unused = 0.0;
        mbad += check_moe_qdot<F, H, FF>(f, seed, mworst);
        mcontrol += check_moe_qdot<F, H, FF>(f, seed, unused, true) > 0;
        ++mcases;
    };
    moe_case.template operator()<qdetail::MlxInt4<32, bf16_t>, 96, 64>(Fmt::int4_g32, 21);
    moe_case.template operator()<qdetail::Int8Channel<bf16_t>, 96, 64>(Fmt::int8, 22);
    moe_case.template operator()<qdetail::Fp8E4M3<bf16_t, false>, 96, 64>(Fmt::fp8, 23);
    moe_case.template operator()<qdetail::Fp8E4M3<bf16_t, true>, 96, 64>(Fmt::fp8_tensor, 24);
    moe_case.template operator()<qdetail::MlxInt4<64, bf16_t>, 2048, 768>(Fmt::int4_g64, 25);
    moe_case.template operator()<qdetail::MlxInt4<128, bf16_t>, 2048, 768>(Fmt::int4_g128, 26);
    moe_case.template operator()<qdetail::Int8Channel<bf16_t>, 2048, 768>(Fmt::int8, 27);
    moe_case.template operator()<qdetail::MlxInt4<32, bf16_t>, 4224, 128>(Fmt::int4_g32, 28);
    moe_case.template operator()<qdetail::Fp8E4M3<bf16_t, false>, 4224, 128>(Fmt::fp8, 29);
    std::printf("host selftest (quantized MoE experts' GEMVs emulated, 32 lanes: gate/up/down of 3 experts through the experts' "
                "table, %d format/width cases, against float64, bound 2e-5 B + 1e-6; the grouped form's 5 of 8 rows and the per-pair "
                "form's staged x (gate and up of 2 rows in one pass) bit for bit the one-row form's): worst err/bound %.3g, %d wrong; negative control (table shifted by one expert) caught "
                "%d/%d: %s\n",
                mcases, mworst, mbad, mcontrol, mcases, mbad == 0 && mcontrol == mcases ? "ok" : "FAILED");
    bbad += mbad + (mcases - mcontrol);
    return bad || xbad || ebad || control != kWarpControls || wbad || wcontrol != kWideControls || sbad || bbad ? 1 : 0;
}

}  // namespace

// ---- Fused variants (quant_linear_fused): grouped Q/K/V, SwiGLU, folded RMSNorm ----
// Each against the float64 reference of the unfused math: the norm (x * w / sqrt(mean(x^2) + eps),
// in double) applied to x first, then each matrix's dot products; SwiGLU silu(g) * u from the two
// references. Token rows get different magnitudes, so a sum of squares taken from the wrong token
// fails. Batch invariance as above: a 64-row launch against each row alone, bit for bit.
template <class F>
void launch_fused_as(const Ctx& c, const QuantFusedArgs& a, bool swiglu, QuantGemvPath path) {
    if (path == QuantGemvPath::smem && a.rows <= 8 && !qdetail::quant_smem_fits<F>(a))
        die(text("the shared-memory path declined k = %d", a.k));
    bool ran;
    qdetail::qstaged_last_plan() = {};
    qdetail::qwide_last_plan() = {};
    qdetail::qmma1_last_split() = {0, 0};
    if (swiglu && path == QuantGemvPath::tc1 && a.rows >= 2 && a.rows <= tc1_rows()) {
        // As the model's qlinear_swiglu: the gate and up rows grouped into a scratch, then silu * mul.
        static float* tmp = nullptr;
        static size_t tmp_floats = 0;
        const size_t need = 2 * size_t(a.rows) * a.mat[0].n;
        if (need > tmp_floats) {
            cudaFree(tmp);
            CK(cudaMalloc(&tmp, need * sizeof(float)));
            tmp_floats = need;
        }
        const auto w = [&](int m) { return QuantW{a.mat[m].q, a.mat[m].scales, a.mat[m].biases}; };
        const RmsIn norm{a.x, a.norm_w, a.eps};
        // With the norm the input is norm.x: x is passed as null, so reading it would fault.
        ran = a.norm_w ? qdetail::swiglu_grouped<0, F, true>(c, a.rows, a.mat[0].n, a.k, nullptr, w(0), w(1), tmp, a.mat[0].y, norm)
                       : qdetail::swiglu_grouped<0, F, false>(c, a.rows, a.mat[0].n, a.k, a.x, w(0), w(1), tmp, a.mat[0].y, norm);
        if (!ran) die(text("the grouped SwiGLU path declined %d rows, k = %d", a.rows, a.k));
        expect_tc1_ran<F>(path, a.rows, 0, 0, true);
        return;
    }
    if (swiglu) ran = a.norm_w ? quant_linear_fused<F, true, true>(c, a, path) : quant_linear_fused<F, true, false>(c, a, path);
    else ran = a.norm_w ? quant_linear_fused<F, false, true>(c, a, path) : quant_linear_fused<F, false, false>(c, a, path);
    if (!ran) die(text("the fused path declined k = %d", a.k));
    int n_total = 0;  // as the kernel stacks the rows; SwiGLU's tiles count twice (gate and up)
    for (int m = 0; m < a.nmat; ++m) n_total += a.mat[m].n;
    const int tiles = swiglu ? (a.mat[0].n + 15) / 16 * 2 : (n_total + 15) / 16;
    if (!swiglu || a.rows == 1 || a.rows > tc1_rows())
        expect_tc1_ran<F>(path, a.rows, tiles, a.k / 128, swiglu || a.norm_w);
}
void launch_fused(Fmt f, cudaStream_t st, const QuantFusedArgs& a, bool swiglu, QuantGemvPath path) {
    Ctx c = ctx_on(st);
    with_format(f, "launch_fused", [&]<class F>() { launch_fused_as<F>(c, a, swiglu, path); });
}

struct FusedCase {
    const char* what;
    int k;
    int n[3];  // matrices' rows (n[2] = 0: two); SwiGLU: gate = up = n[0]
    bool swiglu, norm, bias;
};

// The input of a fused case: `rows` token rows of x with a magnitude that changes from row to row,
// the norm weight around 1, and what the float64 reference multiplies (rmsnorm(x) * w rounded to
// float, or x itself when the case folds no norm); x and the norm weight also on the device.
struct FusedInput {
    std::vector<float> hx, hnw, hxn;
    float* x = nullptr;
    float* nw = nullptr;
};
FusedInput make_fused_input(const FusedCase& fc, int rows, uint32_t seed, float eps) {
    const int k = fc.k;
    FusedInput in;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    in.hx.resize(size_t(rows) * k);
    in.hnw.resize(k);
    in.hxn.resize(in.hx.size());
    for (int t = 0; t < rows; ++t)
        for (int i = 0; i < k; ++i) in.hx[size_t(t) * k + i] = uni(rng) * (0.05f + 0.3f * float(t % 7));
    for (int i = 0; i < k; ++i) in.hnw[i] = 1.0f + 0.5f * uni(rng);
    for (int t = 0; t < rows; ++t) {
        const float* xt = in.hx.data() + size_t(t) * k;
        double ss = 0.0;
        for (int i = 0; i < k; ++i) ss += double(xt[i]) * xt[i];
        const double inv = 1.0 / std::sqrt(ss / k + double(eps));
        for (int i = 0; i < k; ++i) in.hxn[size_t(t) * k + i] = fc.norm ? float(double(xt[i]) * in.hnw[i] * inv) : xt[i];
    }
    CK(cudaMalloc(&in.x, sizeof(float) * in.hx.size()));
    CK(cudaMalloc(&in.nw, sizeof(float) * k));
    CK(cudaMemcpy(in.x, in.hx.data(), sizeof(float) * in.hx.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(in.nw, in.hnw.data(), sizeof(float) * k, cudaMemcpyHostToDevice));
    return in;
}
void free_fused_input(FusedInput& in) {
    cudaFree(in.x);
    cudaFree(in.nw);
}

// A fused case's matrices in one format: weights (device and host copies), outputs of `rows` rows
// set to NaN (an unwritten output fails its check), and biases when the case has them.
struct FusedMats {
    int nmat = 0;
    DevWeights w[3];
    HostWeights hw[3];
    float* y[3] = {};
    float* bias[3] = {};
    std::vector<float> hbias[3];
};
int fused_nmat(const FusedCase& fc) { return fc.swiglu ? 2 : fc.n[2] > 0 ? 3 : fc.n[1] > 0 ? 2 : 1; }
FusedMats make_fused_mats(const FusedCase& fc, Fmt f, int rows, uint64_t weight_seed, uint64_t bias_seed) {
    FusedMats mats;
    mats.nmat = fused_nmat(fc);
    for (int m = 0; m < mats.nmat; ++m) {
        const int n = fc.n[m];
        mats.w[m] = make_weights(f, n, fc.k, weight_seed + 31 * m + fc.k);
        mats.hw[m] = download(f, n, fc.k, mats.w[m]);
        CK(cudaMalloc(&mats.y[m], sizeof(float) * rows * n));
        CK(cudaMemset(mats.y[m], 0xff, sizeof(float) * rows * n));
        if (fc.bias) {
            CK(cudaMalloc(&mats.bias[m], sizeof(float) * n));
            fill_values(mats.bias[m], false, n, bias_seed + 7 * m + n, -0.5f, 0.5f);
            mats.hbias[m].resize(n);
            CK(cudaMemcpy(mats.hbias[m].data(), mats.bias[m], sizeof(float) * n, cudaMemcpyDeviceToHost));
        }
    }
    return mats;
}
void free_fused_mats(FusedMats& mats) {
    for (int m = 0; m < mats.nmat; ++m) {
        free_weights(mats.w[m]);
        cudaFree(mats.y[m]);
        cudaFree(mats.bias[m]);
    }
}

// The residual a single-matrix case adds: [rows][n] in [-2, 2), on the device and in `host`.
float* make_residual(int rows, int n, uint64_t seed, std::vector<float>& host) {
    float* residual = nullptr;
    CK(cudaMalloc(&residual, sizeof(float) * rows * n));
    fill_values(residual, false, size_t(rows) * n, seed, -2.0f, 2.0f);
    host.resize(size_t(rows) * n);
    CK(cudaMemcpy(host.data(), residual, sizeof(float) * host.size(), cudaMemcpyDeviceToHost));
    return residual;
}

// What a fused output should be, and how far it may be off, from the float64 sums x.w (r) and
// |x|.|w| (its bound rb; u and ub: SwiGLU's up matrix): the tensor-core kernels' bound on each sum,
// carried through silu(r) * u for SwiGLU; otherwise r plus the bias and residual (`added`) with
// float32 rounding of the sum.
struct Expected {
    double value, tol;
};
Expected fused_expected(bool swiglu, double r, double rb, double u, double ub, double added) {
    double tol = kMmaTolRel * rb + kMmaTolAbs;
    if (swiglu) {
        const double tu = kMmaTolRel * ub + kMmaTolAbs, sg = r / (1.0 + std::exp(-r));
        tol = 1.1 * std::fabs(u) * tol + std::fabs(sg) * tu + 1e-6 * std::fabs(sg * u);
        return {sg * u, tol};
    }
    const double value = r + added;
    return {value, tol + 1e-7 * std::fabs(value)};
}

int fused_checks(cudaStream_t st) {
    const FusedCase cases[] = {
        {"1B qkv grouped", 2048, {2048, 512, 512}, false, false, true},
        {"1B qkv grouped + norm", 2048, {2048, 512, 512}, false, true, false},
        {"1B gate/up swiglu", 2048, {8192, 8192, 0}, true, false, false},
        {"1B gate/up swiglu + norm", 2048, {8192, 8192, 0}, true, true, false},
        {"odd k/v grouped + norm", 384, {1001, 200, 56}, false, true, true},
        {"odd swiglu + norm", 384, {1001, 1001, 0}, true, true, false},
        {"odd pair grouped", 384, {72, 1001, 0}, false, false, true},
        {"1B single + norm + bias + residual", 2048, {2048, 0, 0}, false, true, true},
        // The 8B's fused launches: at one row, 16-warp instances running fewer tiles per block
        // (qmma1_block_shape's fill: 3 x 4 and 7 x 2 warps).
        {"8B qkv grouped + norm", 4096, {4096, 1024, 1024}, false, true, false},
        {"8B gate/up swiglu + norm", 4096, {14336, 14336, 0}, true, true, false},
    };
    const int check_rows[] = {1, 2, 3, 4, 5, 8, 13, 16, 33, 64, kMaxRows};
    const float eps = 1e-5f;
    int failures = 0;
    for (const FusedCase& fc : cases) {
        const int k = fc.k;
        const int nmat = fused_nmat(fc);
        const bool residual_on = nmat == 1;
        FusedInput in = make_fused_input(fc, kMaxRows, 4242 + k + nmat, eps);
        float* const x = in.x;
        float* const nw = in.nw;
        const std::vector<float>& hxn = in.hxn;
        for (Fmt f : g_formats) {
            if (is_int4(f) && k % 128 != 0) continue;
            FusedMats mats = make_fused_mats(fc, f, kMaxRows, 900, 5000);
            const DevWeights* w = mats.w;
            float* const* bias = mats.bias;
            const std::vector<float>* hbias = mats.hbias;
            float* const(&y)[3] = mats.y;
            Reference ref[3];
            float* y_alone[3] = {};
            for (int m = 0; m < nmat; ++m) {
                ref[m] = reference(f, mats.hw[m], fc.n[m], k, hxn);
                CK(cudaMalloc(&y_alone[m], sizeof(float) * kMaxRows * fc.n[m]));
            }
            std::vector<float> hres;
            float* residual = residual_on ? make_residual(kMaxRows, fc.n[0], 6000 + k, hres) : nullptr;
            auto args = [&](int rows, int row0, float* const (&ys)[3]) {
                QuantFusedArgs a;
                for (int m = 0; m < nmat; ++m)
                    a.mat[m] = QuantMat{w[m].q, w[m].scales, w[m].biases, bias[m], ys[m] + size_t(row0) * fc.n[m], fc.n[m]};
                if (fc.swiglu) a.mat[1].y = a.mat[0].y;  // SwiGLU writes mat[0].y only
                a.nmat = nmat;
                a.x = x + size_t(row0) * k;
                a.residual = residual ? residual + size_t(row0) * fc.n[0] : nullptr;
                a.norm_w = fc.norm ? nw : nullptr;
                a.eps = eps;
                a.k = k;
                a.rows = rows;
                return a;
            };
            const int nout = fc.swiglu ? 1 : nmat;
            for (QuantGemvPath path : {QuantGemvPath::smem, QuantGemvPath::mma, QuantGemvPath::tc1}) {
            if (!path_applies(path, f)) continue;
            for (int rows : check_rows) {
                if (path == QuantGemvPath::tc1 && (rows > tc1_top() || !tc1_row_applies(f, rows))) continue;
                for (int m = 0; m < nout; ++m) CK(cudaMemset(y[m], 0xff, sizeof(float) * kMaxRows * fc.n[m]));
                launch_fused(f, st, args(rows, 0, y), fc.swiglu, path);
                CK(cudaGetLastError());
                CK(cudaStreamSynchronize(st));
                size_t unwritten = 0, wrong = 0, checked = 0;
                double worst = 0.0;
                std::vector<float> hy[3];
                for (int m = 0; m < nout; ++m) {
                    hy[m].resize(size_t(rows) * fc.n[m]);
                    CK(cudaMemcpy(hy[m].data(), y[m], sizeof(float) * hy[m].size(), cudaMemcpyDeviceToHost));
                    for (float v : hy[m]) unwritten += std::isnan(v) ? 1 : 0;
                }
                for (int t = 0; t < rows; ++t) {
                    const int slot = ref_slot(t);
                    if (slot < 0) continue;
                    for (int m = 0; m < nout; ++m) {
                        const size_t cnt = ref[m].rows_checked.size();
                        for (size_t j = 0; j < cnt; ++j) {
                            const int nn = ref[m].rows_checked[j];
                            const double out = hy[m][size_t(t) * fc.n[m] + nn];
                            // SwiGLU: ref[1] (the up matrix) has the same rows checked (same n).
                            const size_t at = slot * cnt + j;
                            const double added = (fc.bias ? hbias[m][nn] : 0.0) + (residual_on ? hres[size_t(t) * fc.n[0] + nn] : 0.0);
                            const Expected ex = fc.swiglu ? fused_expected(true, ref[0].y[at], ref[0].bound[at], ref[1].y[at], ref[1].bound[at], 0.0)
                                                          : fused_expected(false, ref[m].y[at], ref[m].bound[at], 0.0, 0.0, added);
                            const double e = std::fabs(out - ex.value);
                            if (!(e <= ex.tol)) ++wrong;
                            worst = std::max(worst, e / ex.tol);
                            ++checked;
                        }
                    }
                }
                const bool ok = unwritten == 0 && wrong == 0 && checked > 0;
                failures += ok ? 0 : 1;
                std::printf("check fused %-34s k %4d %-13s %-4s%s rows %2d: %zu outputs checked, err/tol max %.2e, wrong %zu, "
                            "unwritten %zu -> %s\n",
                            fc.what, k, name_of(f), name_of(path), split_of(path, rows).c_str(), rows, checked, worst, wrong,
                            unwritten, ok ? "ok" : "FAILED");
            }
            // Batch invariance: `rows` rows in one launch against each row as the first of a launch
            // of `alone` rows (a launch every `step` rows; later launches never write that row), the
            // last rows' in the launch of the last `alone` rows (the buffers hold kMaxRows).
            auto invariance = [&](int rows, int alone, int step) {
                Invariance v;
                for (int m = 0; m < nout; ++m) {
                    CK(cudaMemset(y[m], 0xff, sizeof(float) * kMaxRows * fc.n[m]));
                    CK(cudaMemset(y_alone[m], 0xff, sizeof(float) * kMaxRows * fc.n[m]));
                }
                launch_fused(f, st, args(rows, 0, y), fc.swiglu, path);
                v.how = split_of(path, rows);
                for (int r = 0; r < rows; r += step) launch_fused(f, st, args(alone, std::min(r, rows - alone), y_alone), fc.swiglu, path);
                CK(cudaGetLastError());
                CK(cudaStreamSynchronize(st));
                for (int m = 0; m < nout; ++m) v.add(y[m], y_alone[m], size_t(rows) * fc.n[m]);
                failures += v.differ ? 1 : 0;
                return v;
            };
            // kMaxRows rows (smem: 8, tc1: 2) vs each row alone (tc1's SwiGLU: vs launches of 2 rows,
            // invariance_alone_rows).
            const int inv_rows = invariance_rows(path), alone = invariance_alone_rows(path, fc.swiglu);
            if (tc1_row_applies(f, inv_rows)) {  // int8 / fp8 on tc1: the wide regime's check below only
                const Invariance all = invariance(inv_rows, alone, alone);
                std::printf("check fused %-34s k %4d %-13s %-4s batch invariance (%d rows vs launches of %d): %zu of %zu outputs differ -> %s\n",
                            fc.what, k, name_of(f), name_of(path), inv_rows, alone, all.differ, all.total, all.verdict());
            }
            const int chunks = k / 128, tiles = fc.swiglu ? (fc.n[0] + 15) / 16 * 2 : (fc.n[0] + fc.n[1] + fc.n[2] + 15) / 16;
            for (const Regime& rg : staged_regimes(tiles, chunks, fc.swiglu || fc.norm, wide_format(f), is_int4(f))) {
                if (path != QuantGemvPath::tc1 || rg.hi > tc1_top()) continue;
                // A regime above 2 rows: its largest batch against each row as the first of a launch of its smallest.
                const Invariance v = invariance(rg.hi, rg.lo, 1);
                std::printf("check fused %-34s k %4d %-13s %-4s%s batch invariance (%d rows vs launches of %d): %zu of %zu outputs "
                            "differ -> %s\n",
                            fc.what, k, name_of(f), name_of(path), v.how.c_str(), rg.hi, rg.lo, v.differ, v.total, v.verdict());
            }
            if (path == QuantGemvPath::smem) {
                // One token row through the cp.async ring at every depth: the register path's bits.
                for (int depth : {0, 2, 3, 4}) {
                    qdetail::qsmem_pipe_override() = depth;
                    for (int m = 0; m < nout; ++m) CK(cudaMemset(depth == 0 ? y_alone[m] : y[m], 0xff, sizeof(float) * fc.n[m]));
                    launch_fused(f, st, depth == 0 ? args(1, 0, y_alone) : args(1, 0, y), fc.swiglu, path);
                    CK(cudaGetLastError());
                    CK(cudaStreamSynchronize(st));
                    if (depth == 0) continue;
                    const int ran = qdetail::qsmem_last_depth();
                    size_t diff = 0, cnt = 0;
                    for (int m = 0; m < nout; ++m) {
                        std::vector<float> a(fc.n[m]), b(fc.n[m]);
                        CK(cudaMemcpy(a.data(), y[m], sizeof(float) * a.size(), cudaMemcpyDeviceToHost));
                        CK(cudaMemcpy(b.data(), y_alone[m], sizeof(float) * b.size(), cudaMemcpyDeviceToHost));
                        for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], 4) != 0 ? 1 : 0;
                        cnt += a.size();
                    }
                    failures += diff ? 1 : 0;
                    std::printf("check fused %-34s k %4d %-13s smem ring depth %d (ran %d) vs register path, 1 row: %zu of %zu "
                                "outputs differ -> %s\n",
                                fc.what, k, name_of(f), depth, ran, diff, cnt, diff ? "FAILED" : "ok");
                }
                qdetail::qsmem_pipe_override() = -2;
            }
            }
            for (int m = 0; m < nmat; ++m) cudaFree(y_alone[m]);
            free_fused_mats(mats);
            cudaFree(residual);
        }
        free_fused_input(in);
    }
    return failures;
}

// Prefill-sized calls (quant_prefill.cuh: dequantized hi + lo weights on cuBLASLt, above the decode buckets):
// 300 token rows of every format through quant_linear / quant_linear_fused's automatic path, the
// cases of fused_checks that a model's prefill runs, against the float64 reference at token rows
// 0, 1, 137 and 299 with the tensor-core bound; every output of the 300 rows must be written.
int prefill_checks(cudaStream_t st) {
    const FusedCase cases[] = {
        {"1B qkv grouped + norm + bias", 2048, {2048, 512, 512}, false, true, true},
        {"1B gate/up swiglu + norm", 2048, {8192, 8192, 0}, true, true, false},
        {"1B single + bias + residual", 2048, {2048, 0, 0}, false, false, true},
        {"odd k/v grouped + norm", 384, {1001, 200, 56}, false, true, true},
    };
    constexpr int kRows = 300;
    const int toks[] = {0, 1, 137, kRows - 1};
    const float eps = 1e-5f;
    int failures = 0;
    for (const FusedCase& fc : cases) {
        const int k = fc.k;
        const int nmat = fused_nmat(fc);
        const int nout = fc.swiglu ? 1 : nmat;
        FusedInput in = make_fused_input(fc, kRows, 777 + k + nmat, eps);
        std::vector<float> hres;
        float* residual = nmat == 1 ? make_residual(kRows, fc.n[0], 6100 + k, hres) : nullptr;
        for (Fmt f : g_formats) {
            if (is_int4(f) && k % group_of(f) != 0) continue;
            FusedMats mats = make_fused_mats(fc, f, kRows, 1900, 5100);
            QuantFusedArgs a;
            for (int m = 0; m < nmat; ++m)
                a.mat[m] = QuantMat{mats.w[m].q, mats.w[m].scales, mats.w[m].biases, mats.bias[m], mats.y[m], fc.n[m]};
            if (fc.swiglu) a.mat[1].y = a.mat[0].y;
            a.nmat = nmat;
            a.x = in.x;
            a.residual = residual;
            a.norm_w = fc.norm ? in.nw : nullptr;
            a.eps = eps;
            a.k = k;
            a.rows = kRows;
            const int before = qdetail::quant_prefill_calls();
            launch_fused(f, st, a, fc.swiglu, QuantGemvPath::automatic);
            CK(cudaGetLastError());
            CK(cudaStreamSynchronize(st));
            const bool ran = qdetail::quant_prefill_calls() == before + 1;
            size_t unwritten = 0, wrong = 0, checked = 0;
            double worst = 0.0;
            std::vector<float> hy[3];
            for (int m = 0; m < nout; ++m) {
                hy[m].resize(size_t(kRows) * fc.n[m]);
                CK(cudaMemcpy(hy[m].data(), mats.y[m], sizeof(float) * hy[m].size(), cudaMemcpyDeviceToHost));
                for (float v : hy[m]) unwritten += std::isnan(v) ? 1 : 0;
            }
            std::vector<double> wr(k), br(k), wu(k), bu(k);
            for (int m = 0; m < nout; ++m)
                for (int nn = 0; nn < fc.n[m]; nn += (nn < 16 || nn >= fc.n[m] - 16) ? 1 : 7) {
                    dequant_row(f, mats.hw[m], k, nn, wr, br);
                    if (fc.swiglu) dequant_row(f, mats.hw[1], k, nn, wu, bu);
                    for (int t : toks) {
                        const float* xt = in.hxn.data() + size_t(t) * k;
                        double r = 0.0, rb = 0.0, u = 0.0, ub = 0.0;
                        for (int i = 0; i < k; ++i) {
                            r += double(xt[i]) * wr[i];
                            rb += std::fabs(double(xt[i])) * br[i];
                            if (fc.swiglu) {
                                u += double(xt[i]) * wu[i];
                                ub += std::fabs(double(xt[i])) * bu[i];
                            }
                        }
                        const double added = (fc.bias ? mats.hbias[m][nn] : 0.0) + (nmat == 1 ? hres[size_t(t) * fc.n[0] + nn] : 0.0);
                        const Expected ex = fused_expected(fc.swiglu, r, rb, u, ub, added);
                        const double e = std::fabs(double(hy[m][size_t(t) * fc.n[m] + nn]) - ex.value);
                        if (!(e <= ex.tol)) ++wrong;
                        worst = std::max(worst, e / ex.tol);
                        ++checked;
                    }
                }
            const bool ok = ran && unwritten == 0 && wrong == 0 && checked > 0;
            failures += ok ? 0 : 1;
            std::printf("check prefill %-32s k %4d %-13s rows %d%s: %zu outputs checked, err/tol max %.2e, wrong %zu, unwritten %zu -> %s\n",
                        fc.what, k, name_of(f), kRows, ran ? "" : " (cuBLASLt path did NOT run)", checked, worst, wrong, unwritten,
                        ok ? "ok" : "FAILED");
            free_fused_mats(mats);
        }
        free_fused_input(in);
        cudaFree(residual);
    }
    return failures;
}

// The one-row kernel's x loads in its two forms (quant_mma1_kernel's PRED, the default: only the 4
// lanes of the B column that holds x load it; SCR_CUDA_QUANT_TC1_VARIANT=zero: every lane loads, the
// others from a zero block) must give the same bits. Checked on random inputs and at the ends of the
// integer digit sums' range (every nibble 15, every |x| at its group's top, of one sign or of
// alternating sign by parity: sums near +-G 15 2^20), each output also against float64 where no norm
// is folded (the tensor-core bound). The default form also runs 2 rows (x and -x; not SwiGLU, which
// takes one row) at the same extremes: each row against the row launched alone, bit for bit.
template <class F, bool SWIGLU, bool NORM, bool PRED>
void launch_tc1_form(const Ctx& c, const QuantFusedArgs& a) {
    constexpr bool kWide = qdetail::QMma1Shape<F>::GPC >= 2;  // as launch_quant_mma1: 32-bit scale loads (cudaMalloc'd: aligned)
    qdetail::qmma1_last_split() = {0, 0};
    if (!qdetail::launch_quant_mma1_v<F, SWIGLU, NORM, kWide, false, qdetail::kQmma1XBatch<SWIGLU, NORM>, PRED>(c, a))
        die("the one-row kernel declined a form check");
}
int tc1_form_checks(cudaStream_t st) {
    const FusedCase cases[] = {
        {"single", 2048, {1040, 0, 0}, false, false, false},
        {"single, K = 14336", 14336, {272, 0, 0}, false, false, false},
        {"grouped + norm", 2048, {512, 128, 128}, false, true, false},
        {"swiglu + norm", 4096, {1024, 1024, 0}, true, true, false},
        {"swiglu", 2048, {528, 528, 0}, true, false, false},
    };
    const char* modes[] = {"random", "wide range", "q 15, x +top", "q 15, x -top", "q 15, x +-top by parity"};
    int failures = 0, checks = 0;
    Ctx c = ctx_on(st);
    for (Fmt f : g_formats) {
        if (!is_int4(f)) continue;
        for (const FusedCase& cs : cases) {
            const int k = cs.k, nmat = fused_nmat(cs), nout = cs.swiglu ? 1 : nmat;
            const bool float64 = !cs.norm && !cs.swiglu;  // the plain sums have a reference here
            for (int mode = 0; mode < 5; ++mode) {
                std::mt19937 rng(77 + mode + k);
                std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
                std::vector<float> hx(k), hnw(k, 1.0f);
                for (int i = 0; i < k; ++i) {
                    const float top = 0.999f;  // below 2^0: every group's digits reach ~2^20
                    hx[i] = mode == 0 ? uni(rng) * 0.7f
                            : mode == 1 ? std::copysign(std::pow(10.0f, 4.5f * uni(rng) - 1.5f), uni(rng))
                            : mode == 2 ? top
                            : mode == 3 ? -top
                                        : (i % 2 ? -top : top);
                    if (cs.norm && mode < 2) hnw[i] = 1.0f + 0.5f * uni(rng);
                }
                float *x = nullptr, *nw = nullptr;
                CK(cudaMalloc(&x, sizeof(float) * k));
                CK(cudaMalloc(&nw, sizeof(float) * k));
                CK(cudaMemcpy(x, hx.data(), sizeof(float) * k, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(nw, hnw.data(), sizeof(float) * k, cudaMemcpyHostToDevice));
                FusedMats mats = make_fused_mats(cs, f, 2, 300 + mode, 0);  // outputs for 2 rows
                for (int m = 0; m < nmat && mode >= 2; ++m) {  // every nibble 15
                    CK(cudaMemset(mats.w[m].q, 0xff, sizes_of(f, cs.n[m], k).q));
                    if (float64) mats.hw[m] = download(f, cs.n[m], k, mats.w[m]);
                }
                // Both forms into the same outputs, NaN first (an unwritten output fails): PRED, then zero.
                std::vector<float> y[2][3];
                qdetail::QMmaSplit split[2];
                for (int form = 0; form < 2; ++form) {
                    QuantFusedArgs a;
                    for (int m = 0; m < nmat; ++m) {
                        CK(cudaMemset(mats.y[m], 0xff, sizeof(float) * cs.n[m]));
                        a.mat[m] = QuantMat{mats.w[m].q, mats.w[m].scales, mats.w[m].biases, nullptr, mats.y[m], cs.n[m]};
                    }
                    if (cs.swiglu) a.mat[1].y = a.mat[0].y;
                    a.nmat = nmat;
                    a.x = x;
                    a.norm_w = cs.norm ? nw : nullptr;
                    a.eps = 1e-5f;
                    a.k = k;
                    a.rows = 1;
                    with_format(f, "tc1_form_checks", [&]<class G>() {
                        if constexpr (!G::kAffine) {
                            die("tc1_form_checks: not an MLX int4 format");
                        } else {
                            const auto run = [&]<bool PRED>() {
                                if (cs.swiglu && cs.norm) launch_tc1_form<G, true, true, PRED>(c, a);
                                else if (cs.swiglu) launch_tc1_form<G, true, false, PRED>(c, a);
                                else if (cs.norm) launch_tc1_form<G, false, true, PRED>(c, a);
                                else launch_tc1_form<G, false, false, PRED>(c, a);
                            };
                            if (form == 0) run.template operator()<true>();
                            else run.template operator()<false>();
                        }
                    });
                    split[form] = qdetail::qmma1_last_split();
                    CK(cudaGetLastError());
                    CK(cudaStreamSynchronize(st));
                    for (int m = 0; m < nout; ++m) {
                        y[form][m].resize(cs.n[m]);
                        CK(cudaMemcpy(y[form][m].data(), mats.y[m], sizeof(float) * cs.n[m], cudaMemcpyDeviceToHost));
                    }
                }
                // The default form at 2 rows (not SwiGLU, which takes one row): x and -x, at the same
                // extremes of the digit sums. Row 0 must have the one-row launch's bits; row 1 those of
                // -x launched alone (and -ref from float64, below).
                std::vector<float> y2[3], y2alone[3];
                size_t differ2 = 0;
                if (!cs.swiglu) {
                    std::vector<float> hx2(2 * size_t(k));
                    for (int i = 0; i < k; ++i) hx2[i] = hx[i], hx2[k + i] = -hx[i];
                    float* x2 = nullptr;
                    CK(cudaMalloc(&x2, sizeof(float) * 2 * k));
                    CK(cudaMemcpy(x2, hx2.data(), sizeof(float) * 2 * k, cudaMemcpyHostToDevice));
                    for (int pass = 0; pass < 2; ++pass) {  // 2 rows, then row 1 alone
                        QuantFusedArgs a;
                        for (int m = 0; m < nmat; ++m) {
                            CK(cudaMemset(mats.y[m], 0xff, sizeof(float) * 2 * cs.n[m]));
                            a.mat[m] = QuantMat{mats.w[m].q, mats.w[m].scales, mats.w[m].biases, nullptr, mats.y[m], cs.n[m]};
                        }
                        a.nmat = nmat;
                        a.x = pass == 0 ? x2 : x2 + k;
                        a.norm_w = cs.norm ? nw : nullptr;
                        a.eps = 1e-5f;
                        a.k = k;
                        a.rows = pass == 0 ? 2 : 1;
                        with_format(f, "tc1_form_checks", [&]<class G>() {
                            if constexpr (G::kAffine) {
                                if (cs.norm) launch_tc1_form<G, false, true, true>(c, a);
                                else launch_tc1_form<G, false, false, true>(c, a);
                            }
                        });
                        CK(cudaGetLastError());
                        CK(cudaStreamSynchronize(st));
                        for (int m = 0; m < nout; ++m) {
                            std::vector<float>& to = pass == 0 ? y2[m] : y2alone[m];
                            to.resize(size_t(a.rows) * cs.n[m]);
                            CK(cudaMemcpy(to.data(), mats.y[m], sizeof(float) * to.size(), cudaMemcpyDeviceToHost));
                        }
                    }
                    cudaFree(x2);
                    for (int m = 0; m < nout; ++m)
                        for (int n = 0; n < cs.n[m]; ++n) {
                            differ2 += std::memcmp(&y2[m][n], &y[0][m][n], 4) != 0 ? 1 : 0;
                            differ2 += std::memcmp(&y2[m][cs.n[m] + n], &y2alone[m][n], 4) != 0 ? 1 : 0;
                        }
                }
                size_t differ = 0, unwritten = 0, wrong = 0, outs = 0;
                double worst = 0.0;
                for (int m = 0; m < nout && !cs.swiglu; ++m)
                    for (float v : y2[m]) unwritten += std::isnan(v) ? 1 : 0;
                std::vector<double> wrow(k), brow(k);
                for (int m = 0; m < nout; ++m)
                    for (int n = 0; n < cs.n[m]; ++n) {
                        const float yp = y[0][m][n], yz = y[1][m][n];
                        ++outs;
                        unwritten += std::isnan(yp) || std::isnan(yz) ? 1 : 0;
                        differ += std::memcmp(&yp, &yz, sizeof(float)) != 0 ? 1 : 0;
                        if (!float64) continue;
                        dequant_row(f, mats.hw[m], k, n, wrow, brow);
                        double ref = 0.0, mag = 0.0;
                        for (int i = 0; i < k; ++i) {
                            ref += double(hx[i]) * wrow[i];
                            mag += std::fabs(double(hx[i])) * brow[i];
                        }
                        const double tol = kMmaTolRel * mag + kMmaTolAbs, e = std::fabs(double(yp) - ref);
                        if (!(e <= tol)) ++wrong;
                        worst = std::max(worst, e / tol);
                        // Row 1 of the 2-row launch holds -x: its reference is -ref.
                        if (!cs.swiglu) {
                            const double e2 = std::fabs(double(y2[m][cs.n[m] + n]) + ref);
                            if (!(e2 <= tol)) ++wrong;
                            worst = std::max(worst, e2 / tol);
                        }
                    }
                const bool ok = differ == 0 && differ2 == 0 && unwritten == 0 && wrong == 0;
                failures += ok ? 0 : 1;
                ++checks;
                std::printf("tc1 pred/zero %-9s %-18s %-24s k %5d (%dx%d, %dx%d): %zu outputs, %zu differ, %s, %zu unwritten, "
                            "%zu off float64 (worst %.2f of the bound) %s\n",
                            name_of(f), cs.what, modes[mode], k, split[0].warps, split[0].blocks, split[1].warps, split[1].blocks, outs,
                            differ, cs.swiglu ? "1 row only" : text("2 rows (x, -x) vs each alone: %zu differ", differ2).c_str(), unwritten,
                            wrong, worst, ok ? "ok" : "FAILED");
                free_fused_mats(mats);
                cudaFree(x);
                cudaFree(nw);
            }
        }
    }
    std::printf("tc1 pred/zero: %d of %d checks passed\n", checks - failures, checks);
    return failures;
}

// One token row of the fused launches a Llama layer makes, as the model calls them (bench runs only):
// grouped QKV and gate/up + SwiGLU, each with the folded RMSNorm, at the 1B and 8B shapes, through the
// automatic path. Weights cold: copies past 4x the L2, cycled. GB/s counts the packed weights, scales
// and biases of every matrix of the launch; % of the device copy bandwidth.
void fused_bench(cudaStream_t st, size_t l2_bytes, double copy) {
    const FusedCase cases[] = {
        {"1B qkv grouped + norm", 2048, {2048, 512, 512}, false, true, false},
        {"1B gate/up swiglu + norm", 2048, {8192, 8192, 0}, true, true, false},
        {"8B qkv grouped + norm", 4096, {4096, 1024, 1024}, false, true, false},
        {"8B gate/up swiglu + norm", 4096, {14336, 14336, 0}, true, true, false},
    };
    const float eps = 1e-5f;
    std::printf("\nfused launches of 1, 4, 8 and 16 token rows (automatic path, weights cold):\n");
    for (const FusedCase& fc : cases) {
        const int k = fc.k, nmat = fused_nmat(fc);
        FusedInput in = make_fused_input(fc, 16, 515 + k, eps);
        for (Fmt f : g_formats) {
            if (is_int4(f) && k % group_of(f) != 0) continue;
            size_t bytes = 0;
            for (int m = 0; m < nmat; ++m) bytes += sizes_of(f, fc.n[m], k).total();
            const int copies = int(std::clamp<size_t>((4 * l2_bytes + bytes - 1) / bytes, 2, 64));
            std::vector<std::array<DevWeights, 3>> ws(copies);
            for (int c = 0; c < copies; ++c)
                for (int m = 0; m < nmat; ++m) ws[c][m] = make_weights(f, fc.n[m], k, 300 + 17 * c + m);
            float* y[3] = {};
            for (int m = 0; m < nmat; ++m) CK(cudaMalloc(&y[m], sizeof(float) * 16 * fc.n[m]));
            for (int rows : {1, 4, 8, 16}) {
            const double us = time_us(st, std::max(2 * copies, 24), [&](int i) {
                QuantFusedArgs a;
                for (int m = 0; m < nmat; ++m) {
                    const DevWeights& w = ws[i % copies][m];
                    a.mat[m] = QuantMat{w.q, w.scales, w.biases, nullptr, y[m], fc.n[m]};
                }
                if (fc.swiglu) a.mat[1].y = a.mat[0].y;
                a.nmat = nmat;
                a.x = in.x;
                a.norm_w = fc.norm ? in.nw : nullptr;
                a.eps = eps;
                a.k = k;
                a.rows = rows;
                launch_fused(f, st, a, fc.swiglu, QuantGemvPath::automatic);
            });
            const double gbs = double(bytes) / (us * 1e-6) / 1e9;
            std::printf("bench fused %-26s k %5d %-13s rows %2d: %8.2f us %7.0f GB/s %5.1f%% copy\n", fc.what, k, name_of(f), rows,
                        us, gbs, 100.0 * gbs / copy);
            }
            for (auto& c : ws)
                for (int m = 0; m < nmat; ++m) free_weights(c[m]);
            for (int m = 0; m < nmat; ++m) cudaFree(y[m]);
        }
        free_fused_input(in);
    }
}

// Where a quantized prefill call's time goes (bench runs only; docs/CUDA.md "Session 11"): a SwiGLU +
// norm call of 2,048 token rows through the automatic path (both matrices expanded, then cuBLASLt)
// against the two expansions alone (qexpand, into a buffer of our own), per format, on the 1B and 8B
// gate/up shapes. Events around 5 calls after a warm-up; no graph (the calls take milliseconds).
template <class F>
void expand_both(cudaStream_t st, const QuantFusedArgs& a, void* w, void* aux) {
    const size_t hi_bytes = size_t(a.mat[0].n) * a.k * 2;
    void* second = F::kAffine ? static_cast<void*>(static_cast<char*>(w) + hi_bytes) : aux;
    qdetail::qexpand<F, true>(&a, 0, false, w, second, st);
    qdetail::qexpand<F, true>(&a, 0, true, w, second, st);
}
void expand_both(Fmt f, cudaStream_t st, const QuantFusedArgs& a, void* w, void* aux) {
    with_format(f, "expand_both", [&]<class F>() { expand_both<F>(st, a, w, aux); });
}
void prefill_bench(cudaStream_t st) {
    constexpr int kRows = 2048;
    const FusedCase cases[] = {
        {"1B gate/up swiglu + norm", 2048, {8192, 8192, 0}, true, true, false},
        {"8B gate/up swiglu + norm", 4096, {14336, 14336, 0}, true, true, false},
    };
    std::printf("\nquantized prefill, %d token rows: the whole call vs its weight expansion alone (ms per call)\n", kRows);
    for (const FusedCase& fc : cases) {
        FusedInput in = make_fused_input(fc, kRows, 99, 1e-5f);
        void *w = nullptr, *aux = nullptr;
        CK(cudaMalloc(&w, size_t(fc.n[0]) * fc.k * 4));
        CK(cudaMalloc(&aux, sizeof(float) * fc.n[0]));
        for (Fmt f : g_formats) {
            if (is_int4(f) && fc.k % group_of(f) != 0) continue;
            FusedMats mats = make_fused_mats(fc, f, kRows, 3000, 0);
            QuantFusedArgs a;
            for (int m = 0; m < 2; ++m)
                a.mat[m] = QuantMat{mats.w[m].q, mats.w[m].scales, mats.w[m].biases, nullptr, mats.y[0], fc.n[m]};
            a.nmat = 2;
            a.x = in.x;
            a.norm_w = in.nw;
            a.eps = 1e-5f;
            a.k = fc.k;
            a.rows = kRows;
            const auto time_ms = [&](auto&& call) {
                call();  // warm-up (and the scratch's first growth)
                cudaEvent_t e0, e1;
                CK(cudaEventCreate(&e0));
                CK(cudaEventCreate(&e1));
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < 5; ++i) call();
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                return ms / 5.0;
            };
            const int before = qdetail::quant_prefill_calls();
            const double whole = time_ms([&] { launch_fused(f, st, a, true, QuantGemvPath::automatic); });
            const bool ran = qdetail::quant_prefill_calls() == before + 6;
            const double expand = time_ms([&] { expand_both(f, st, a, w, aux); });
            CK(cudaGetLastError());
            const double flops = 2.0 * 2.0 * kRows * double(fc.n[0]) * fc.k;  // two matrices
            std::printf("prefill %-26s %-13s whole %7.3f ms (%4.0f TFLOPS of the model's 2 x rows x n x k per matrix), expansion %6.3f ms "
                        "(%4.1f%%)%s\n",
                        fc.what, name_of(f), whole, flops / (whole * 1e-3) / 1e12, expand, 100.0 * expand / whole,
                        ran ? "" : "  (cuBLASLt path did NOT run)");
            free_fused_mats(mats);
        }
        cudaFree(w);
        cudaFree(aux);
        free_fused_input(in);
    }
}

// quant_wide_kernel launched as the model launches it, as programmatic dependents (Ctx::pdl): a
// plain launch writing y1, a SwiGLU + folded-norm launch reading y1, and a plain launch reading its
// output (each launch's prep rewrites the workspace the launch before read), 100 token rows (two
// tiles) at the 1B's shapes; the same chain without PDL must give the same bits. Skipped (0) when
// the kernel is off (SCR_CUDA_QUANT_WIDE).
int wide_pdl_check(cudaStream_t st) {
    using F = qdetail::MlxInt4<64, bf16_t>;
    const int rows = 100, h = 2048, f = 8192;
    if (!wide_takes(Fmt::int4_g64, rows)) {
        std::printf("check wide chain with PDL: skipped (quant_wide_kernel off for %d rows)\n", rows);
        return 0;
    }
    DevWeights a = make_weights(Fmt::int4_g64, h, h, 61), g = make_weights(Fmt::int4_g64, f, h, 62),
               u = make_weights(Fmt::int4_g64, f, h, 63), d = make_weights(Fmt::int4_g64, h, f, 64);
    float *x = nullptr, *nw = nullptr, *y1[2] = {}, *y2[2] = {}, *y3[2] = {};
    CK(cudaMalloc(&x, sizeof(float) * rows * h));
    CK(cudaMalloc(&nw, sizeof(float) * h));
    fill_values(x, false, size_t(rows) * h, 71, -1.0f, 1.0f);
    fill_values(nw, false, h, 72, 0.5f, 1.5f);
    for (int i = 0; i < 2; ++i) {
        CK(cudaMalloc(&y1[i], sizeof(float) * rows * h));
        CK(cudaMalloc(&y2[i], sizeof(float) * rows * f));
        CK(cudaMalloc(&y3[i], sizeof(float) * rows * h));
    }
    int ran = 0;
    for (int i = 0; i < 2; ++i) {
        Ctx c = ctx_on(st);
        c.pdl = i == 0;
        QuantLinearArgs la;
        la.q = a.q, la.scales = a.scales, la.biases = a.biases, la.x = x, la.y = y1[i], la.n = h, la.k = h, la.rows = rows;
        qdetail::qwide_last_plan() = {};
        quant_linear<F>(c, la, QuantGemvPath::tc1);
        ran += qdetail::qwide_last_plan().slices > 0;
        QuantFusedArgs fa;
        fa.mat[0] = QuantMat{g.q, g.scales, g.biases, nullptr, y2[i], f};
        fa.mat[1] = QuantMat{u.q, u.scales, u.biases, nullptr, y2[i], f};
        fa.nmat = 2;
        fa.x = y1[i];
        fa.norm_w = nw;
        fa.eps = 1e-5f;
        fa.k = h;
        fa.rows = rows;
        qdetail::qwide_last_plan() = {};
        if (!quant_linear_fused<F, true, true>(c, fa, QuantGemvPath::tc1)) die("the fused wide launch was declined");
        ran += qdetail::qwide_last_plan().slices > 0;
        QuantLinearArgs ld = la;
        ld.q = d.q, ld.scales = d.scales, ld.biases = d.biases, ld.x = y2[i], ld.y = y3[i], ld.k = f;
        qdetail::qwide_last_plan() = {};
        quant_linear<F>(c, ld, QuantGemvPath::tc1);
        ran += qdetail::qwide_last_plan().slices > 0;
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(st));
    }
    Invariance v;
    v.add(y1[0], y1[1], size_t(rows) * h);
    v.add(y2[0], y2[1], size_t(rows) * f);
    v.add(y3[0], y3[1], size_t(rows) * h);
    const bool ok = v.differ == 0 && ran == 6;
    std::printf("check wide chain with PDL (o, gate/up + SwiGLU + norm, down; %d rows; %d of 6 launches on quant_wide_kernel) against "
                "the chain without: %zu of %zu outputs differ -> %s\n",
                rows, ran, v.differ, v.total, ok ? "ok" : "FAILED");
    for (int i = 0; i < 2; ++i) {
        cudaFree(y1[i]);
        cudaFree(y2[i]);
        cudaFree(y3[i]);
    }
    cudaFree(x);
    cudaFree(nw);
    for (DevWeights* w : {&a, &g, &u, &d}) free_weights(*w);
    return ok ? 0 : 1;
}

int main(int argc, char** argv) try {
    bool bench = true;
    std::vector<Shape> shapes = {
        {2048, 2048, "1B q/o"},      {8192, 2048, "1B gate/up"},  {2048, 8192, "1B down"},
        {4096, 4096, "8B q/o"},      {14336, 4096, "8B gate/up"}, {4096, 14336, "8B down"},
        {128256, 2048, "1B lm_head"}, {1001, 384, "odd N tail"},
    };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--no-bench") {
            bench = false;
        } else if (a == "--host-selftest") {
            return host_selftest();
        } else if (a == "--formats" && i + 1 < argc) {
            g_formats.clear();
            const std::string list = std::string(argv[++i]) + ",";
            for (size_t p = 0, e; (e = list.find(',', p)) != std::string::npos; p = e + 1) {
                const std::string want = list.substr(p, e - p);
                const auto it = std::find_if(std::begin(kQuantFormats), std::end(kQuantFormats),
                                             [&](Fmt f) { return want == name_of(f); });
                if (it == std::end(kQuantFormats)) die(text("--formats: unknown format '%s'", want.c_str()));
                g_formats.push_back(*it);
            }
        } else if (a == "--shapes" && i + 1 < argc) {
            shapes.clear();
            std::string list = argv[++i];
            for (size_t p = 0; p < list.size();) {
                const size_t e = std::min(list.find(',', p), list.size());
                int n = 0, k = 0;
                if (std::sscanf(list.substr(p, e - p).c_str(), "%dx%d", &n, &k) != 2 || n <= 0 || k <= 0 || k % 128)
                    die(text("--shapes: '%s' is not NxK with K a multiple of 128", list.substr(p, e - p).c_str()));
                shapes.push_back({n, k, "custom"});
                p = e + 1;
            }
        } else {
            die(text("unknown argument '%s' (usage: scr_cuda_quant_gemv [--no-bench] [--shapes NxK,...] [--formats a,b,...] "
                     "[--host-selftest])", a.c_str()));
        }
    }
    if (host_selftest()) return 1;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("no CUDA device: skipped\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    g_qwide_ws_bytes = kQwidePrepBytes + qdetail::qwide_split_bytes(qdetail::qwide_split_slots());
    CK(cudaMalloc(&g_qwide_ws, size_t(g_qwide_ws_bytes)));
    CK(cudaMemset(g_qwide_ws, 0, size_t(g_qwide_ws_bytes)));
    {
        using G64 = qdetail::MlxInt4<64, bf16_t>;
        using I8 = qdetail::Int8Channel<bf16_t>;
        std::printf("quant_wide_kernel resident blocks in clusters of 1 / 2 / 4 / 8: MLX int4 g64 %d / %d / %d / %d, int8 %d / %d / %d / %d\n",
                    qdetail::qwide_resident_blocks<G64, false, false>(1), qdetail::qwide_resident_blocks<G64, false, false>(2),
                    qdetail::qwide_resident_blocks<G64, false, false>(4), qdetail::qwide_resident_blocks<G64, false, false>(8),
                    qdetail::qwide_resident_blocks<I8, false, false>(1), qdetail::qwide_resident_blocks<I8, false, false>(2),
                    qdetail::qwide_resident_blocks<I8, false, false>(4), qdetail::qwide_resident_blocks<I8, false, false>(8));
    }
    const double copy = bench ? copy_gbs() : 0.0;
    if (bench) std::printf("device copy bandwidth (read + write): %.0f GB/s\n", copy);

    int failures = 0;
    std::vector<std::string> table;
    struct Check {
        int rows;
        bool epilogue;  // with a linear bias and a residual added
    };
    const Check checks[] = {{1, false}, {2, false}, {3, false}, {4, false}, {8, false}, {13, false}, {16, false},
                            {33, false}, {64, false}, {kMaxRows, false}, {5, true}};
    const int bench_rows[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
    for (const Shape& sh : shapes) {
        const int n = sh.n, k = sh.k;
        float *x = nullptr, *y = nullptr, *y_alone = nullptr;
        CK(cudaMalloc(&x, sizeof(float) * kMaxRows * k));
        CK(cudaMalloc(&y, sizeof(float) * kMaxRows * n));
        CK(cudaMalloc(&y_alone, sizeof(float) * kMaxRows * n));
        fill_values(x, false, size_t(kMaxRows) * k, 1000 + n + k, -1.0f, 1.0f);
        float *bias = nullptr, *residual = nullptr;
        CK(cudaMalloc(&bias, sizeof(float) * n));
        CK(cudaMalloc(&residual, sizeof(float) * kMaxRows * n));
        fill_values(bias, false, n, 2000 + n, -0.5f, 0.5f);
        fill_values(residual, false, size_t(kMaxRows) * n, 3000 + n, -2.0f, 2.0f);
        std::vector<float> hbias(n), hres(size_t(kMaxRows) * n);
        CK(cudaMemcpy(hbias.data(), bias, sizeof(float) * n, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hres.data(), residual, sizeof(float) * hres.size(), cudaMemcpyDeviceToHost));
        std::vector<float> hx(size_t(kMaxRows) * k);
        CK(cudaMemcpy(hx.data(), x, sizeof(float) * hx.size(), cudaMemcpyDeviceToHost));
        std::vector<float> hy(size_t(kMaxRows) * n), hy_alone(size_t(kMaxRows) * n);
        std::vector<double> bf16_us(kMaxRows + 1, std::nan(""));

        // Baseline first: the existing bf16 linear on this shape.
        if (bench && launch_bf16(st, n, k, 1, x, nullptr, y)) {
            const Sizes s = sizes_of(Fmt::bf16, n, k);
            const int copies = int(std::clamp<size_t>((size_t(4) * prop.l2CacheSize + s.total() - 1) / s.total(), 1, 64));
            std::vector<DevWeights> ws;
            for (int c = 0; c < copies; ++c) ws.push_back(make_weights(Fmt::bf16, n, k, 77 + c));
            for (int rows : bench_rows) {
                CK(cudaMemset(y, 0xff, sizeof(float) * rows * n));
                const double us = time_us(st, std::max(2 * copies, 24), [&](int i) {
                    if (!launch_bf16(st, n, k, rows, x, ws[i % copies].q, y)) die(text("no bf16 GEMV compiled for %dx%d", n, k));
                });
                CK(cudaMemcpy(hy.data(), y, sizeof(float) * rows * n, cudaMemcpyDeviceToHost));
                const bool written = std::none_of(hy.begin(), hy.begin() + size_t(rows) * n, [](float v) { return std::isnan(v); });
                if (!written) ++failures;
                bf16_us[rows] = us;
                const double gbs = double(s.total()) / (us * 1e-6) / 1e9;
                table.push_back(text("%6dx%-5d %-11s %-22s %4d %9.2f %7.0f %5.1f%% %6s%s", n, k, sh.what, "bf16 (dense)", rows, us,
                                     gbs, 100.0 * gbs / copy, "1.00x", written ? "" : "  UNWRITTEN OUTPUT"));
            }
            for (auto& w : ws) free_weights(w);
        }

        for (Fmt f : g_formats) {
            const Sizes s = sizes_of(f, n, k);
            // Correctness on one weight set.
            DevWeights w0 = make_weights(f, n, k, 11);
            const HostWeights hw = download(f, n, k, w0);
            const Reference ref = reference(f, hw, n, k, hx);
            const size_t m = ref.rows_checked.size();
            for (QuantGemvPath path : kPaths) {
                if (!path_applies(path, f)) continue;
                auto args = [&](int rows, const float* xs, float* ys, bool epilogue, const float* res) {
                    QuantLinearArgs a;
                    a.q = w0.q;
                    a.scales = w0.scales;
                    a.biases = w0.biases;
                    a.x = xs;
                    a.y = ys;
                    a.n = n;
                    a.k = k;
                    a.rows = rows;
                    if (epilogue) {
                        a.bias = bias;
                        a.residual = res;
                    }
                    return a;
                };
                for (const Check& ck : checks) {
                    const int rows = ck.rows;
                    if (path == QuantGemvPath::tc1 && (rows > tc1_top() || !tc1_row_applies(f, rows))) continue;
                    CK(cudaMemset(y, 0xff, sizeof(float) * rows * n));  // NaN: unwritten outputs fail
                    launch(f, path, st, args(rows, x, y, ck.epilogue, residual));
                    CK(cudaGetLastError());
                    CK(cudaStreamSynchronize(st));
                    CK(cudaMemcpy(hy.data(), y, sizeof(float) * rows * n, cudaMemcpyDeviceToHost));
                    size_t unwritten = 0, wrong = 0, checked = 0;
                    double worst = 0.0, err2 = 0.0, ref2 = 0.0;
                    for (size_t i = 0; i < size_t(rows) * n; ++i) unwritten += std::isnan(hy[i]) ? 1 : 0;
                    for (int t = 0; t < rows; ++t) {
                        const int slot = ref_slot(t);
                        if (slot < 0) continue;
                        for (size_t j = 0; j < m; ++j) {
                            const int nn = ref.rows_checked[j];
                            const double out = hy[size_t(t) * n + nn];
                            double r = ref.y[slot * m + j], b = ref.bound[slot * m + j];
                            if (ck.epilogue) {
                                r += double(hbias[nn]) + double(hres[size_t(t) * n + nn]);
                                b += std::fabs(double(hbias[nn])) + std::fabs(double(hres[size_t(t) * n + nn]));
                            }
                            const bool on_mma =
                                path == QuantGemvPath::mma || path == QuantGemvPath::tc1 || (path == QuantGemvPath::smem && rows > 8);
                            const double tol = on_mma ? kMmaTolRel * b + kMmaTolAbs : kSimtTol * b;
                            const double e = std::fabs(out - r);
                            if (!(e <= tol)) ++wrong;
                            worst = std::max(worst, e / tol);
                            err2 += e * e;
                            ref2 += r * r;
                            ++checked;
                        }
                    }
                    const bool ok = unwritten == 0 && wrong == 0;
                    failures += ok ? 0 : 1;
                    std::printf("check %6dx%-5d %-13s %-4s%s rows %2d%s: %zu outputs checked, err/tol max %.2e, "
                                "||err||/||ref|| %.2e, wrong %zu, unwritten %zu -> %s\n",
                                n, k, name_of(f), name_of(path), split_of(path, rows).c_str(), rows, ck.epilogue ? " +bias+residual" : "", checked, worst,
                                std::sqrt(err2 / ref2), wrong, unwritten, ok ? "ok" : "FAILED");
                }
                // Batch invariance (bias + residual too): `rows` rows in one launch against each row as
                // the first of a launch of `alone` rows (later launches never write that row), the last
                // rows' in the launch of the last `alone` rows (the buffers hold kMaxRows).
                auto invariance = [&](int rows, int alone) {
                    Invariance v;
                    CK(cudaMemset(y, 0xff, sizeof(float) * kMaxRows * n));
                    CK(cudaMemset(y_alone, 0xff, sizeof(float) * kMaxRows * n));
                    launch(f, path, st, args(rows, x, y, true, residual));
                    v.how = split_of(path, rows);
                    for (int r = 0; r < rows; ++r) {
                        const size_t at = size_t(std::min(r, rows - alone));
                        launch(f, path, st, args(alone, x + at * k, y_alone + at * n, true, residual + at * n));
                    }
                    CK(cudaGetLastError());
                    CK(cudaStreamSynchronize(st));
                    v.add(y, y_alone, size_t(rows) * n);
                    failures += v.differ ? 1 : 0;
                    return v;
                };
                // Each row alone against the same row in a batch of kMaxRows (smem: of 8, its regime).
                const int inv_rows = invariance_rows(path);
                if (tc1_row_applies(f, inv_rows)) {  // int8 / fp8 on tc1: the wide regime's check below only
                    const Invariance all = invariance(inv_rows, 1);
                    std::printf("check %6dx%-5d %-13s %-4s batch invariance (%d rows vs each alone, +bias+residual): %zu of %zu "
                                "outputs differ -> %s\n",
                                n, k, name_of(f), name_of(path), inv_rows, all.differ, all.total, all.verdict());
                }
                for (const Regime& rg : staged_regimes((n + 15) / 16, k / 128, false, wide_format(f), is_int4(f))) {
                    if (path != QuantGemvPath::tc1 || rg.hi > tc1_top()) continue;
                    // A regime above 2 rows: its largest batch against each row as the first of a launch of its smallest.
                    const Invariance v = invariance(rg.hi, rg.lo);
                    std::printf("check %6dx%-5d %-13s %-4s%s batch invariance (%d rows vs launches of %d, +bias+residual): %zu of %zu "
                                "outputs differ -> %s\n",
                                n, k, name_of(f), name_of(path), v.how.c_str(), rg.hi, rg.lo, v.differ, v.total, v.verdict());
                }
                if (path == QuantGemvPath::smem) {
                    // One token row through the cp.async ring at every depth: the register path's bits.
                    qdetail::qsmem_pipe_override() = 0;
                    CK(cudaMemset(y_alone, 0xff, sizeof(float) * n));
                    launch(f, path, st, args(1, x, y_alone, true, residual));
                    CK(cudaStreamSynchronize(st));
                    CK(cudaMemcpy(hy_alone.data(), y_alone, sizeof(float) * n, cudaMemcpyDeviceToHost));
                    for (int depth : {2, 3, 4}) {
                        qdetail::qsmem_pipe_override() = depth;
                        CK(cudaMemset(y, 0xff, sizeof(float) * n));
                        launch(f, path, st, args(1, x, y, true, residual));
                        CK(cudaGetLastError());
                        CK(cudaStreamSynchronize(st));
                        const int ran = qdetail::qsmem_last_depth();
                        CK(cudaMemcpy(hy.data(), y, sizeof(float) * n, cudaMemcpyDeviceToHost));
                        size_t diff = 0;
                        for (int i = 0; i < n; ++i) diff += std::memcmp(&hy[i], &hy_alone[i], 4) != 0 ? 1 : 0;
                        failures += diff ? 1 : 0;
                        std::printf("check %6dx%-5d %-13s smem ring depth %d (ran %d) vs register path, 1 row: %zu of %d outputs "
                                    "differ -> %s\n",
                                    n, k, name_of(f), depth, ran, diff, n, diff ? "FAILED" : "ok");
                    }
                    qdetail::qsmem_pipe_override() = -2;
                }
            }
            free_weights(w0);
            if (!bench) continue;
            const int copies = int(std::clamp<size_t>((size_t(4) * prop.l2CacheSize + s.total() - 1) / s.total(), 1, 64));
            std::vector<DevWeights> ws;
            for (int c = 0; c < copies; ++c) ws.push_back(make_weights(f, n, k, 500 + c));
            struct Run {
                Fmt fmt;
                QuantGemvPath path;
                int depth = -2;  // smem, one row: the ring depth forced (0: register path); -2: default
            };
            std::vector<Run> runs = {{f, QuantGemvPath::smem}, {f, QuantGemvPath::mma}, {f, QuantGemvPath::simt}};
            if (path_applies(QuantGemvPath::tc1, f)) runs.insert(runs.begin(), Run{f, QuantGemvPath::tc1});
            for (int depth : {0, 2, 3, 4}) runs.push_back({f, QuantGemvPath::smem, depth});
            if (f == Fmt::fp8) {
                // The conversion A/B: cvt.rn.f16x2.e4m3x2 instead of the bit path, same weights; it must
                // give the same bits (both conversions are exact) once the NaN codes are gone.
                runs.insert(runs.begin() + 1, Run{Fmt::fp8_cvt, QuantGemvPath::mma});
                clear_fp8_nan_codes<<<1024, 256>>>(static_cast<uint8_t*>(ws[0].q), s.q);
                CK(cudaGetLastError());
                for (int rows : {1, 16}) {
                    QuantLinearArgs a;
                    a.q = ws[0].q;
                    a.scales = ws[0].scales;
                    a.x = x;
                    a.n = n;
                    a.k = k;
                    a.rows = rows;
                    a.y = y;
                    launch(Fmt::fp8, QuantGemvPath::mma, st, a);
                    a.y = y_alone;
                    launch(Fmt::fp8_cvt, QuantGemvPath::mma, st, a);
                    CK(cudaStreamSynchronize(st));
                    CK(cudaMemcpy(hy.data(), y, sizeof(float) * rows * n, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(hy_alone.data(), y_alone, sizeof(float) * rows * n, cudaMemcpyDeviceToHost));
                    const bool same = std::memcmp(hy.data(), hy_alone.data(), sizeof(float) * rows * n) == 0;
                    failures += same ? 0 : 1;
                    std::printf("check %6dx%-5d fp8 mma rows %2d: cvt conversion gives the bit path's bits -> %s\n", n, k, rows,
                                same ? "ok" : "FAILED");
                }
            }
            for (const Run& run : runs)
                for (int rows : bench_rows) {
                    if ((run.depth != -2 && rows != 1) || (run.path == QuantGemvPath::tc1 && rows > tc1_top())) continue;
                    qdetail::qsmem_pipe_override() = run.depth;
                    const QuantGemvPath path = run.path;
                    const double us = time_us(st, std::max(2 * copies, 24), [&](int i) {
                        QuantLinearArgs a;
                        a.q = ws[i % copies].q;
                        a.scales = ws[i % copies].scales;
                        a.biases = ws[i % copies].biases;
                        a.x = x;
                        a.y = y;
                        a.n = n;
                        a.k = k;
                        a.rows = rows;
                        launch(run.fmt, path, st, a);
                    });
                    const double gbs = double(s.total()) / (us * 1e-6) / 1e9;
                    const std::string label = std::string(name_of(run.fmt)) + " " + name_of(path) + split_of(path, rows);
                    table.push_back(text("%6dx%-5d %-11s %-22s %4d %9.2f %7.0f %5.1f%% %5.2fx", n, k, sh.what, label.c_str(), rows, us,
                                         gbs, 100.0 * gbs / copy, bf16_us[rows] / us));
                    qdetail::qsmem_pipe_override() = -2;
                }
            for (auto& w : ws) free_weights(w);
        }
        cudaFree(x);
        cudaFree(y);
        cudaFree(y_alone);
        cudaFree(bias);
        cudaFree(residual);
    }
    failures += fused_checks(st);
    failures += wide_pdl_check(st);
    failures += tc1_form_checks(st);
    failures += prefill_checks(st);
    if (bench) fused_bench(st, size_t(prop.l2CacheSize), copy);
    if (bench) prefill_bench(st);
    CK(cudaDeviceSynchronize());
    if (bench) {
        std::printf("\nGB/s: bytes the kernel must read (packed weights + scales + biases; x and y not counted) per "
                    "launch time; %% of the device copy bandwidth %.0f GB/s; speed-up over the bf16 GEMV, same rows\n",
                    copy);
        std::printf("%12s %-11s %-22s %4s %9s %7s %6s %6s\n", "N x K", "layer", "format kernel", "rows", "us", "GB/s", "%copy",
                    "vs bf16");
        for (auto& line : table) std::printf("%s\n", line.c_str());
    }
    if (failures) std::printf("quant GEMV checks: %d FAILED\n", failures);
    else std::printf("quant GEMV checks: all passed\n");
    return failures ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
