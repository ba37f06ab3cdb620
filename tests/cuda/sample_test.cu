// scr_cuda_sample: the GPU sampler (kernels/cuda/sample.cuh) against float64 host references written
// from the definitions (runtime/engine/sampler.cpp's semantics), on the GPU:
//   * greedy: the lowest id among equal maxima, NaNs ignored, 0 when nothing is above -inf; random rows,
//     rows full of ties, NaN / -inf / +inf rows; vocabularies 128256 (vector loads) and 32001 (scalar);
//   * the kept set of temperature + min_p + top_k + top_p at V = 128256 and V = 151936, 8 parameter sets
//     x 8 rows: exactly the reference's (every token with a mass above 2^-40 of the top one), and the
//     summed fixed-point mass within 1e-6 of the float64 one;
//   * the draw: (a) stratified uniforms u_j = (j + 1/2) / N invert the CDF, so every token's count is
//     N p_i within 2; (b) 1,048,576 draws from random uniforms per parameter set: Pearson chi-square
//     (bins of expected count < 5 pooled) below df + 6 sqrt(2 df), and |freq - p| <= 6 sigma + 1/N for
//     every token expected 5 times or more; for V = 1000 and V = 999;
//   * random parameters (top_k incl. 1, V - 1, V; top_p; min_p; T) on rows of small integer logits
//     (the k-th value and the top-p boundary inside large tie groups), of floats a few ulps apart (the
//     k-th and the next in adjacent bins of the last radix digit), and smooth rows: the reference's
//     kept sets;
//   * the value-bin top_k, the gathered top_p and the top_p from a window (peaked rows) against the radix
//     descent alone (SCR_CUDA_SAMPLE_SELECT=radix): the same token, kept set and mass, bit for bit, with
//     every path shown to have run;
//   * determinism: the same launch twice gives the same tokens;
//   * timing (printed, not checked): 1, 8 and 64 rows at V = 128256, the radix descent alone against the
//     default at the launcher's cluster size, and one block per row.
// Exit: 0 all passed, 1 a check failed, 77 no GPU (ctest skips; SCR_REQUIRE_GPU=1 makes it a failure).
//
// Built a second time as scr_cuda_sample_emu (sample_test_emu.cpp, plain C++, no GPU): the same kernel
// source on the host through tests/cuda/host_emu (threads as coroutines, warp intrinsics exact), with
// 64-thread blocks and smaller sizes, so the selection and draw logic is checked where CI runs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/sample.cuh"

using namespace scr::kernels::cuda;
using sample_detail::order_key;

namespace {

#if defined(SCR_SAMPLE_HOST_EMULATION)
constexpr bool kEmulated = true;
#define CK(call) (call)
// Device memory is host memory; a launch runs one emulated block per row.
void* device_alloc(size_t bytes) { return std::calloc(1, bytes + 16); }
void device_free(void* p) { std::free(p); }
void to_device(void* d, const void* h, size_t n) { std::memcpy(d, h, n); }
void to_host(void* h, const void* d, size_t n) { std::memcpy(h, d, n); }
void device_fill(void* d, int byte, size_t n) { std::memset(d, byte, n); }
// Blocks per row of the launches (0: the launcher's choice, sample_cluster_size).
int g_blocks_per_row = 0;
int g_radix_only = 0;  // 1: top_k / top_p by the radix descent alone
int blocks_per_row(int rows, int V) { return g_blocks_per_row ? g_blocks_per_row : sample_cluster_size(rows, V); }
void launch(const float* logits, int V, int rows, const SampleParams* p, int32_t* tokens, SampleTrace* trace) {
    const int C = blocks_per_row(rows, V);
    for (int r = 0; r < rows; ++r)
        emu::run_cluster(unsigned(r * C), C, [&] {
            switch (C) {
                case 1: sample_rows_kernel<1>(logits, V, p, tokens, trace, nullptr, g_radix_only); break;
                case 2: sample_rows_kernel<2>(logits, V, p, tokens, trace, nullptr, g_radix_only); break;
                case 4: sample_rows_kernel<4>(logits, V, p, tokens, trace, nullptr, g_radix_only); break;
                default: sample_rows_kernel<8>(logits, V, p, tokens, trace, nullptr, g_radix_only); break;
            }
        });
}
bool have_device() { return true; }
#else
constexpr bool kEmulated = false;
void check_cuda(cudaError_t e, const char* what, int line) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "CUDA error '%s' at sample_test.cu:%d: %s\n", cudaGetErrorString(e), line, what);
        std::exit(1);
    }
}
#define CK(call) check_cuda((call), #call, __LINE__)
void* device_alloc(size_t bytes) {
    void* p = nullptr;
    CK(cudaMalloc(&p, bytes));
    return p;
}
void device_free(void* p) { cudaFree(p); }
void to_device(void* d, const void* h, size_t n) { CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); }
void to_host(void* h, const void* d, size_t n) { CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }
void device_fill(void* d, int byte, size_t n) { CK(cudaMemset(d, byte, n)); }
int g_blocks_per_row = 0;  // blocks per row of the launches (0: the launcher's choice)
int g_radix_only = 0;      // 1: top_k / top_p by the radix descent alone
void launch(const float* logits, int V, int rows, const SampleParams* p, int32_t* tokens, SampleTrace* trace) {
    launch_sample_rows(nullptr, logits, V, rows, p, tokens, trace, nullptr, g_blocks_per_row, g_radix_only);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
}
bool have_device() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#endif
// Sizes: the emulation runs every thread as a coroutine on one core, so it gets smaller problems.
int scaled(int full, int emulated) { return kEmulated ? emulated : full; }

int failures = 0;
void expect(bool ok, const std::string& what) {
    if (!ok) {
        ++failures;
        if (failures <= 30) std::printf("FAIL: %s\n", what.c_str());
    }
}
template <typename... A>
std::string text(const char* f, A... a) {
    char buf[512];
    std::snprintf(buf, sizeof buf, f, a...);
    return buf;
}

// splitmix64: test data and uniforms.
struct Rand {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    double uniform() { return double(next() >> 11) * 0x1.0p-53; }
    double normal() {
        const double u = std::max(uniform(), 1e-300), v = uniform();
        return std::sqrt(-2 * std::log(u)) * std::cos(6.283185307179586 * v);
    }
};

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- references, from the definitions ---------------------------------------------------------

int32_t ref_argmax(const float* x, int V) {
    int32_t best = -1;
    for (int i = 0; i < V; ++i)
        if (!std::isnan(x[i]) && x[i] > -kInf && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

struct RefRow {
    std::vector<float> x;      // logits * (1/T), float, as the CPU sampler
    std::vector<double> w;     // exp(x - max) for kept tokens, 0 otherwise
    std::vector<char> kept;
    double z = 0;
    float max_x = -kInf;
};

// temperature -> min_p -> top_k -> top_p (vLLM's order, runtime/engine/sampler.cpp), in float64 where
// the CPU sampler sums; a tie group at the top-p boundary is kept whole (the device's rule).
RefRow reference(const float* logits, int V, const SampleParams& p) {
    RefRow r;
    const float inv_t = 1.0f / p.temperature;
    r.x.resize(V);
    for (int i = 0; i < V; ++i) r.x[i] = logits[i] * inv_t;
    for (float v : r.x)
        if (!std::isnan(v)) r.max_x = std::max(r.max_x, v);
    const float m = r.max_x;
    r.kept.assign(V, 0);
    const float thr = p.min_p > 0 ? m + std::log(p.min_p) : -std::numeric_limits<float>::max();
    std::vector<int> alive;
    for (int i = 0; i < V; ++i)
        if (!std::isnan(r.x[i]) && r.x[i] > -kInf && r.x[i] >= thr) alive.push_back(i);
    std::sort(alive.begin(), alive.end(), [&](int a, int b) { return r.x[a] > r.x[b] || (r.x[a] == r.x[b] && a < b); });
    size_t n = alive.size();
    if (p.top_k > 0 && p.top_k < V && size_t(p.top_k) < n) {
        const float kth = r.x[alive[size_t(p.top_k) - 1]];
        while (n > 0 && r.x[alive[n - 1]] < kth) --n;
    }
    if (p.top_p < 1.0f) {
        double z = 0;
        for (size_t j = 0; j < n; ++j) z += std::exp(double(r.x[alive[j]]) - m);
        const double target = double(p.top_p) * z;
        double cum = 0;
        size_t j = 0;
        while (j < n) {
            if (cum >= target) break;
            size_t g = j;  // the tie group [j, g)
            while (g < n && r.x[alive[g]] == r.x[alive[j]]) cum += std::exp(double(r.x[alive[g++]]) - m);
            j = g;
        }
        n = j;
    }
    r.w.assign(V, 0);
    for (size_t j = 0; j < n; ++j) {
        const int i = alive[j];
        r.kept[i] = 1;
        r.w[i] = std::exp(double(r.x[i]) - m);
        r.z += r.w[i];
    }
    return r;
}

// ---- device helpers -----------------------------------------------------------------------------

struct Dev {
    float* logits = nullptr;
    SampleParams* params = nullptr;
    int32_t* tokens = nullptr;
    SampleTrace* trace = nullptr;
    size_t cap_floats = 0, cap_rows = 0;
    void reserve(size_t floats, size_t rows) {
        if (floats > cap_floats) {
            device_free(logits);
            logits = static_cast<float*>(device_alloc(floats * 4));
            cap_floats = floats;
        }
        if (rows > cap_rows) {
            device_free(params);
            device_free(tokens);
            device_free(trace);
            params = static_cast<SampleParams*>(device_alloc(rows * sizeof(SampleParams)));
            tokens = static_cast<int32_t*>(device_alloc(rows * 4));
            trace = static_cast<SampleTrace*>(device_alloc(rows * sizeof(SampleTrace)));
            cap_rows = rows;
        }
    }
    void upload(const std::vector<float>& host_logits, size_t rows) {
        reserve(host_logits.size(), rows);
        to_device(logits, host_logits.data(), host_logits.size() * 4);
    }
    // Runs the sampler over rows x V logits; returns the tokens (and traces).
    std::vector<int32_t> run(const std::vector<float>& host_logits, int V, const std::vector<SampleParams>& ps,
                             std::vector<SampleTrace>* traces = nullptr) {
        upload(host_logits, ps.size());
        return rerun(V, ps, traces);
    }
    // Same logits already on the device.
    std::vector<int32_t> rerun(int V, const std::vector<SampleParams>& ps, std::vector<SampleTrace>* traces = nullptr) {
        const size_t rows = ps.size();
        to_device(params, ps.data(), rows * sizeof(SampleParams));
        device_fill(tokens, 0xff, rows * 4);
        launch(logits, V, int(rows), params, tokens, traces ? trace : nullptr);
        std::vector<int32_t> out(rows);
        to_host(out.data(), tokens, rows * 4);
        if (traces) {
            traces->resize(rows);
            to_host(traces->data(), trace, rows * sizeof(SampleTrace));
        }
        return out;
    }
};

SampleParams greedy_params() { return SampleParams{0.0f, 0, 1.0f, 0.0f, 0.0}; }

// ---- tests --------------------------------------------------------------------------------------

void host_selftest() {
    Rand rng{7};
    std::vector<float> v = {-kInf, -3e38f, -1.0f, -1e-30f, -0.0f, 0.0f, 1e-30f, 1.0f, 3e38f, kInf};
    for (int i = 0; i < 20000; ++i) {
        uint32_t b = uint32_t(rng.next());
        float f;
        std::memcpy(&f, &b, 4);
        if (!std::isnan(f)) v.push_back(f);
    }
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i) {
        const bool less = v[i - 1] < v[i];
        expect(less ? order_key(v[i - 1]) < order_key(v[i]) : order_key(v[i - 1]) == order_key(v[i]),
               text("order_key not monotone at %g, %g", double(v[i - 1]), double(v[i])));
    }
    expect(order_key(std::nanf("")) == 0 && order_key(-kInf) < sample_detail::kMinFiniteKey &&
               order_key(-std::numeric_limits<float>::max()) == sample_detail::kMinFiniteKey,
           "order_key of NaN / -inf / -FLT_MAX");
}

void test_greedy(Dev& dev) {
    for (int V : {scaled(128256, 4100), scaled(32001, 1001)}) {
        Rand rng{uint64_t(V)};
        const int rows = scaled(64, 16);
        std::vector<float> x(size_t(rows) * V);
        for (int r = 0; r < rows; ++r) {
            float* row = x.data() + size_t(r) * V;
            const int kind = r % 8;
            for (int i = 0; i < V; ++i) {
                switch (kind) {
                    case 0: case 1: row[i] = float(rng.normal() * 3); break;
                    case 2: row[i] = float(rng.next() % 8); break;                 // thousands of tied maxima
                    case 3: row[i] = float(rng.next() % 3) - 5.0f; break;          // all negative, ties
                    case 4: row[i] = rng.next() % 5 == 0 ? std::nanf("") : float(rng.normal()); break;
                    case 5: row[i] = rng.next() % 2 ? -kInf : float(rng.next() % 4); break;
                    case 6: row[i] = r == 6 ? -kInf : std::nanf(""); break;         // nothing finite: 0
                    default: row[i] = float(rng.normal()); break;
                }
            }
            if (kind == 7) row[V - 1] = row[V / 3] = kInf;  // two +inf: the lower id
            if (r == 9) row[V - 1] = 100.0f;                // the maximum at the very end (tail of the vector path)
            if (r == 10) row[0] = 100.0f;
        }
        std::vector<SampleParams> ps(rows, greedy_params());
        for (int r = 0; r < rows; r += 5) ps[r].temperature = 0.99e-5f;  // still greedy (below kSamplingEps)
        const auto got = dev.run(x, V, ps);
        for (int r = 0; r < rows; ++r) {
            const int32_t want = ref_argmax(x.data() + size_t(r) * V, V);
            expect(got[r] == want, text("greedy V=%d row %d: got %d, want %d", V, r, got[r], want));
        }
    }
}

const std::vector<SampleParams> kParamSets = {
    {1.0f, 0, 1.0f, 0.0f, 0},       // plain temperature
    {0.7f, 20, 1.0f, 0.0f, 0},      // top_k
    {1.3f, 0, 0.8f, 0.0f, 0},       // top_p
    {1.0f, 0, 1.0f, 0.05f, 0},      // min_p
    {0.9f, 50, 0.9f, 0.02f, 0},     // all three
    {2.0f, 1, 1.0f, 0.0f, 0},       // top_k 1 (ties with the top kept)
    {0.5f, 0, 0.3f, 0.0f, 0},       // small top_p
    {1.0f, 400, 0.999f, 0.0f, 0},   // large k, p near 1
};

// Kept set and mass against the float64 reference, at real vocabulary sizes.
void test_kept_sets(Dev& dev) {
    for (int V : {scaled(128256, 5000), scaled(151936, 4099)}) {
        Rand rng{uint64_t(V) * 3};
        const int per = scaled(8, 2), rows = int(kParamSets.size()) * per;
        std::vector<float> x(size_t(rows) * V);
        std::vector<SampleParams> ps(rows);
        for (int r = 0; r < rows; ++r) {
            float* row = x.data() + size_t(r) * V;
            const double scale = 1.0 + 7.0 * (r % per) / std::max(1, per - 1);  // flat to peaked
            for (int i = 0; i < V; ++i) row[i] = float(rng.normal() * scale);
            if (r % 2 == 1) for (int i = 0; i < V; i += 97) row[i] = row[5];  // ties across the row
            ps[r] = kParamSets[size_t(r / per)];
            ps[r].uniform = rng.uniform();
        }
        std::vector<SampleTrace> tr;
        const auto got = dev.run(x, V, ps, &tr);
        for (int r = 0; r < rows; ++r) {
            const RefRow ref = reference(x.data() + size_t(r) * V, V, ps[r]);
            // Tokens whose mass is below 2^-40 of the top one cannot change the draw (the kernel's fixed
            // point rounds them to 0 or 1 unit of 2^-42): their membership is not compared.
            int wrong = 0, kept = 0;
            double zq = 0;  // the reference kept set's mass in the kernel's fixed point
            for (int i = 0; i < V; ++i) {
                if (ref.kept[i]) {
                    ++kept;
                    zq += std::nearbyint(ref.w[i] * 0x1p42);
                }
                if (!(std::exp(double(ref.x[i]) - ref.max_x) >= 0x1p-40)) continue;
                const bool dev_kept = order_key(ref.x[i]) >= tr[r].keep_lo;
                wrong += dev_kept != bool(ref.kept[i]);
            }
            expect(wrong == 0, text("kept set V=%d row %d (T %g k %d p %g min_p %g): %d of %d kept tokens differ", V, r,
                                    double(ps[r].temperature), ps[r].top_k, double(ps[r].top_p), double(ps[r].min_p), wrong, kept));
            expect(std::fabs(double(tr[r].z) - zq) <= 1e-6 * zq,
                   text("mass V=%d row %d: device %.6e, reference %.6e", V, r, double(tr[r].z), zq));
            expect(tr[r].max_scaled == ref.max_x, text("max V=%d row %d", V, r));
            expect(got[r] >= 0 && got[r] < V && ref.kept[got[r]], text("V=%d row %d: token %d not in the kept set", V, r, got[r]));
        }
        // The same launch again: the same tokens.
        expect(dev.rerun(V, ps) == got, text("V=%d: a second launch drew different tokens", V));
    }
}

// Random parameters on rows of small integer logits (large tie groups everywhere: top_k's k-th value and
// the top_p boundary fall inside ties), and on smooth rows; the kept set must equal the reference's.
void test_random_parameters(Dev& dev) {
    Rand rng{2024};
    for (int V : {257, scaled(4096, 1024), scaled(50000, 3001)}) {
        const int rows = scaled(64, 16);
        std::vector<float> x(size_t(rows) * V);
        std::vector<SampleParams> ps(rows);
        for (int r = 0; r < rows; ++r) {
            float* row = x.data() + size_t(r) * V;
            const int kind = r % 3;  // 0: small integers (ties), 1: floats a few ulps apart, 2: smooth
            for (int i = 0; i < V; ++i) {
                if (kind == 0) row[i] = float(int(rng.next() % 12)) - 6.0f;
                else if (kind == 1) {
                    const uint32_t b = 0x3f800000u + uint32_t(rng.next() % uint64_t(2 * V));  // adjacent order keys
                    std::memcpy(&row[i], &b, 4);
                } else row[i] = float(rng.normal() * 2.0);
            }
            const int ks[] = {0, 1, 2, 5, 50, V - 1, V, -1};
            SampleParams& p = ps[r];
            p.temperature = float(0.3 + 1.7 * rng.uniform());
            p.top_k = ks[rng.next() % 8];
            p.top_p = rng.next() % 3 == 0 ? 1.0f : float(0.05 + 0.94 * rng.uniform());
            p.min_p = rng.next() % 3 == 0 ? 0.0f : float(0.5 * rng.uniform());
            p.uniform = rng.uniform();
        }
        std::vector<SampleTrace> tr;
        const auto got = dev.run(x, V, ps, &tr);
        for (int r = 0; r < rows; ++r) {
            const RefRow ref = reference(x.data() + size_t(r) * V, V, ps[r]);
            int wrong = 0;
            for (int i = 0; i < V; ++i) {
                if (!(std::exp(double(ref.x[i]) - ref.max_x) >= 0x1p-40)) continue;
                wrong += (order_key(ref.x[i]) >= tr[r].keep_lo) != bool(ref.kept[i]);
            }
            expect(wrong == 0, text("random params V=%d row %d (T %g k %d p %g min_p %g): %d tokens differ", V, r,
                                    double(ps[r].temperature), ps[r].top_k, double(ps[r].top_p), double(ps[r].min_p), wrong));
            expect(got[r] >= 0 && got[r] < V && ref.kept[got[r]], text("random params V=%d row %d: token %d not kept", V, r, got[r]));
        }
    }
}

// Every cluster size (blocks per row: 1, 2, 4, 8) gives the same token and trace, bit for bit: the
// sums are integers and the maximum exact, so splitting a row may change nothing. Rows of every kind
// above, greedy and sampled, with NaN / -inf / +inf entries; vocabularies with an odd size (the scalar
// path), a size not a multiple of 32 (short last slices) and one below 4 x 8 (empty slices).
void test_cluster_sizes(Dev& dev) {
    Rand rng{77};
    for (int V : {13, scaled(4096, 1024), scaled(32001, 2051), scaled(128256, 4100)}) {
        const int rows = scaled(24, 8);
        std::vector<float> x(size_t(rows) * V);
        std::vector<SampleParams> ps(rows);
        for (int r = 0; r < rows; ++r) {
            float* row = x.data() + size_t(r) * V;
            const int kind = r % 6;
            for (int i = 0; i < V; ++i) {
                if (kind == 0) row[i] = float(int(rng.next() % 12)) - 6.0f;  // ties across slices
                else if (kind == 1) row[i] = rng.next() % 7 == 0 ? std::nanf("") : float(rng.normal() * 3);
                else if (kind == 2) row[i] = rng.next() % 3 == 0 ? -kInf : float(rng.normal());
                else row[i] = float(rng.normal() * (1.0 + kind));
            }
            if (r == 4) row[V - 1] = kInf;  // an infinite logit in the last slice: the greedy fallback
            if (r == 5) for (int i = 0; i < V; ++i) row[i] = -kInf;  // nothing finite
            const int ks[] = {0, 1, 3, 50, V - 1, V};
            SampleParams& p = ps[r];
            p.temperature = r % 4 == 0 ? 0.0f : float(0.3 + 1.7 * rng.uniform());
            p.top_k = ks[rng.next() % 6];
            p.top_p = rng.next() % 3 == 0 ? 1.0f : float(0.05 + 0.94 * rng.uniform());
            p.min_p = rng.next() % 3 == 0 ? 0.0f : float(0.3 * rng.uniform());
            p.uniform = rng.uniform();
        }
        std::vector<SampleTrace> want_tr;
        g_blocks_per_row = 1;
        const auto want = dev.run(x, V, ps, &want_tr);
        for (int C : {2, 4, 8}) {
            g_blocks_per_row = C;
            std::vector<SampleTrace> tr;
            const auto got = dev.rerun(V, ps, &tr);
            for (int r = 0; r < rows; ++r) {
                const SampleTrace &a = tr[r], &b = want_tr[r];
                const bool same = got[r] == want[r] && a.keep_lo == b.keep_lo && a.token == b.token && a.z == b.z &&
                                  order_key(a.max_scaled) == order_key(b.max_scaled) && a.greedy == b.greedy;
                expect(same, text("V=%d row %d, %d blocks per row: token %d (keep_lo %08x, z %llu), one block: %d (%08x, %llu)", V,
                                  r, C, got[r], a.keep_lo, (unsigned long long)a.z, want[r], b.keep_lo, (unsigned long long)b.z));
            }
        }
        g_blocks_per_row = 0;
    }
}

// The value-bin top_k, the top_p straight from its survivors (when they are few) and the top_p from a
// window below the maximum (peaked rows) against the radix descent alone: the same token, kept set
// (keep_lo) and mass, bit for bit, on smooth rows (the boundary bin small: resolved directly), rows
// of a few integer values and of adjacent floats (the boundary bin too full: the fallback), peaked
// rows (a few tokens far above a normal bulk), every parameter kind, at one block and at several per
// row. Every path must have run: the value bins for most top_k on smooth rows, the gathered top_p
// after most small top_k there, the window for most top_p alone on peaked rows, and the fallback on
// some row of ties.
void test_select_paths(Dev& dev) {
    Rand rng{4242};
    for (int V : {scaled(128256, 4100), scaled(32000, 2048)}) {
        const int rows = scaled(60, 30);
        std::vector<float> x(size_t(rows) * V);
        std::vector<SampleParams> ps(rows);
        for (int r = 0; r < rows; ++r) {
            float* row = x.data() + size_t(r) * V;
            const int kind = r % 5;  // 0, 1: smooth (scales 1 to 8), 2: small integers, 3: adjacent floats, 4: peaked
            const double scale = 1.0 + 7.0 * rng.uniform();
            for (int i = 0; i < V; ++i) {
                if (kind == 2) row[i] = float(int(rng.next() % 12)) - 6.0f;
                else if (kind == 3) {
                    const uint32_t b = 0x3f800000u + uint32_t(rng.next() % uint64_t(2 * V));
                    std::memcpy(&row[i], &b, 4);
                } else if (kind == 4) row[i] = float(rng.normal());
                else row[i] = float(rng.normal() * scale);
            }
            if (kind == 1) for (int i = 0; i < V; i += 61) row[i] = row[3];  // ties across the row
            if (kind == 4)  // 1-8 tokens 12-20 above the bulk
                for (int j = 0, n = 1 + int(rng.next() % 8); j < n; ++j) row[rng.next() % uint64_t(V)] = float(12.0 + 8.0 * rng.uniform());
            SampleParams& p = ps[r];
            if (r < int(kParamSets.size()) * 2) p = kParamSets[size_t(r / 2)];
            else {
                const int ks[] = {0, 1, 5, 50, 1000, V - 1};
                p.temperature = float(0.3 + 1.7 * rng.uniform());
                p.top_k = ks[rng.next() % 6];
                p.top_p = rng.next() % 4 == 0 ? 1.0f : float(0.05 + 0.94 * rng.uniform());
                p.min_p = rng.next() % 3 == 0 ? 0.0f : float(0.2 * rng.uniform());
            }
            if (kind == 4) {  // top_p alone
                p.top_k = 0;
                p.top_p = float(0.5 + 0.49 * rng.uniform());
                p.temperature = float(0.5 + 1.0 * rng.uniform());
            }
            p.uniform = rng.uniform();
        }
        for (int C : {1, 8}) {
            g_blocks_per_row = C;
            std::vector<SampleTrace> want_tr, tr;
            g_radix_only = 1;
            const auto want = dev.run(x, V, ps, &want_tr);
            g_radix_only = 0;
            const auto got = dev.rerun(V, ps, &tr);
            int topk_smooth = 0, topk_radix_smooth = 0, gathered_p = 0, small_kp = 0, ties_radix = 0, peaked = 0, windowed = 0;
            for (int r = 0; r < rows; ++r) {
                const SampleTrace &a = tr[r], &b = want_tr[r];
                const bool same = got[r] == want[r] && a.keep_lo == b.keep_lo && a.z == b.z && a.token == b.token &&
                                  order_key(a.max_scaled) == order_key(b.max_scaled);
                expect(same, text("select paths V=%d row %d C=%d (T %g k %d p %g min_p %g): value bins token %d keep_lo %08x z %llu, "
                                  "radix %d %08x %llu", V, r, C, double(ps[r].temperature), ps[r].top_k, double(ps[r].top_p),
                                  double(ps[r].min_p), got[r], a.keep_lo, (unsigned long long)a.z, want[r], b.keep_lo,
                                  (unsigned long long)b.z));
                expect(b.radix_path == ((ps[r].top_k > 0 && ps[r].top_k < V ? 1 : 0) | (ps[r].top_p < 1.0f ? 2 : 0)) || a.greedy,
                       text("select paths V=%d row %d: the radix-only launch reports path %d", V, r, b.radix_path));
                const bool has_k = ps[r].top_k > 0 && ps[r].top_k < V;
                if (r % 5 == 4) {
                    ++peaked;
                    windowed += !(a.radix_path & 2);
                }
                if (r % 5 < 2 && has_k) {
                    ++topk_smooth;
                    topk_radix_smooth += a.radix_path & 1;
                    if (ps[r].top_k <= 50 && ps[r].top_p < 1.0f) {
                        ++small_kp;
                        gathered_p += !(a.radix_path & 2);
                    }
                }
                if (r % 5 == 2 || r % 5 == 3) ties_radix += a.radix_path & 1;
            }
            std::printf("select paths V=%d C=%d: top_k on smooth rows by value bins %d of %d; top_p gathered after a top_k <= 50 %d of %d;"
                        " top_p alone on peaked rows from a window %d of %d; top_k by the radix descent on rows of ties %d\n", V, C,
                        topk_smooth - topk_radix_smooth, topk_smooth, gathered_p, small_kp, windowed, peaked, ties_radix);
            expect(windowed * 4 >= peaked * 3 && peaked > 0,
                   text("select paths V=%d C=%d: top_p from a window on %d of %d peaked rows", V, C, windowed, peaked));
            expect(topk_radix_smooth * 4 <= topk_smooth && topk_smooth > 0,
                   text("select paths V=%d C=%d: %d of %d top_k on smooth rows fell back", V, C, topk_radix_smooth, topk_smooth));
            expect(gathered_p * 4 >= small_kp * 3 && small_kp > 0,
                   text("select paths V=%d C=%d: top_p gathered after %d of %d small top_k", V, C, gathered_p, small_kp));
            expect(ties_radix > 0, text("select paths V=%d C=%d: no row of ties exercised the fallback", V, C));
        }
        g_blocks_per_row = 0;
    }
}

// The draw against the exact probabilities of the reference's kept set.
void test_frequencies(Dev& dev) {
    const int kRowsPerLaunch = scaled(4096, 128);
    for (int V : {1000, 999}) {
        Rand rng{uint64_t(V) * 11};
        std::vector<float> row(V);
        for (int i = 0; i < V; ++i) row[i] = float(rng.normal() * 1.5);
        for (int i = 0; i < V; i += 50) row[i + 1] = row[i];  // some exact ties
        std::vector<float> x(size_t(kRowsPerLaunch) * V);
        for (int r = 0; r < kRowsPerLaunch; ++r) std::copy(row.begin(), row.end(), x.begin() + size_t(r) * V);
        dev.upload(x, kRowsPerLaunch);
        for (size_t s = 0; s < kParamSets.size(); ++s) {
            const RefRow ref = reference(row.data(), V, kParamSets[s]);
            std::vector<double> prob(V);
            for (int i = 0; i < V; ++i) prob[i] = ref.w[i] / ref.z;
            std::vector<SampleParams> ps(kRowsPerLaunch, kParamSets[s]);

            // (a) stratified uniforms: the counts are N p_i up to the rounding of the CDF.
            {
                const int launches = scaled(16, 8), N = kRowsPerLaunch * launches;
                std::vector<int64_t> count(V, 0);
                for (int l = 0; l < launches; ++l) {
                    for (int r = 0; r < kRowsPerLaunch; ++r) ps[r].uniform = (double(l * kRowsPerLaunch + r) + 0.5) / N;
                    for (int32_t t : dev.rerun(V, ps)) ++count[size_t(t)];
                }
                double worst = 0;
                for (int i = 0; i < V; ++i) worst = std::max(worst, std::fabs(double(count[i]) - N * prob[i]));
                expect(worst <= 2.0, text("stratified V=%d set %zu: a count is %.2f off N p (bound 2)", V, s, worst));
            }
            // (b) random uniforms: chi-square and per-token 6 sigma.
            {
                const int launches = scaled(256, 16);
                const double N = double(launches) * kRowsPerLaunch;
                std::vector<int64_t> count(V, 0);
                for (int l = 0; l < launches; ++l) {
                    for (auto& p : ps) p.uniform = rng.uniform();
                    for (int32_t t : dev.rerun(V, ps)) ++count[size_t(t)];
                }
                double chi2 = 0, pooled_e = 0, pooled_o = 0, worst_sigma = 0;
                int bins = 0;
                int64_t outside = 0;
                for (int i = 0; i < V; ++i) {
                    if (!ref.kept[i]) { outside += count[i]; continue; }
                    const double e = N * prob[i];
                    if (e < 5) { pooled_e += e; pooled_o += double(count[i]); }
                    else { chi2 += (count[i] - e) * (count[i] - e) / e; ++bins; }
                    if (e < 5) continue;  // too few expected draws for a normal bound (the pooled chi-square bin has them)
                    const double sigma = std::sqrt(prob[i] * (1 - prob[i]) / N);
                    const double err = std::fabs(count[i] / N - prob[i]);
                    worst_sigma = std::max(worst_sigma, (err - 1.0 / N) / sigma);
                }
                if (pooled_e >= 5) { chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e; ++bins; }
                const int df = std::max(1, bins - 1);
                const double bound = df + 6 * std::sqrt(2.0 * df);
                std::printf("draw V=%d set %zu (T %g k %d p %g min_p %g): %d bins, chi2 %.1f (df %d, bound %.1f), worst %.2f sigma\n",
                            V, s, double(kParamSets[s].temperature), kParamSets[s].top_k, double(kParamSets[s].top_p),
                            double(kParamSets[s].min_p), bins, chi2, df, bound, worst_sigma);
                expect(outside == 0, text("draw V=%d set %zu: %lld draws outside the kept set", V, s, (long long)outside));
                expect(chi2 <= bound, text("draw V=%d set %zu: chi2 %.1f > %.1f", V, s, chi2, bound));
                expect(worst_sigma <= 6, text("draw V=%d set %zu: a frequency is %.2f sigma off", V, s, worst_sigma));
            }
        }
    }
}

#if !defined(SCR_SAMPLE_HOST_EMULATION)
struct BenchCase {
    const char* name;
    SampleParams p;
};
const BenchCase kBenchCases[] = {{"greedy", greedy_params()},
                                 {"T=1", {1.0f, 0, 1.0f, 0.0f, 0.5}},
                                 {"T=0.7 top_k=50", {0.7f, 50, 1.0f, 0.0f, 0.5}},
                                 {"T=1 top_p=0.95", {1.0f, 0, 0.95f, 0.0f, 0.5}},
                                 {"T=0.8 k=50 p=0.9 min_p=0.05", {0.8f, 50, 0.9f, 0.05f, 0.5}},
                                 {"T=0.25 top_p=0.9 (peaked)", {0.25f, 0, 0.9f, 0.0f, 0.5}}};  // x = logit x 4: a peaked row
constexpr int kBenchV = 128256;
void bench_logits(Dev& dev, int rows) {
    Rand rng{99};
    std::vector<float> x(size_t(rows) * kBenchV);
    for (auto& v : x) v = float(rng.normal() * 2.5);
    dev.upload(x, rows);
}
// --profile K: two launches of bench case K on one row (the launcher's cluster size), for a profiler
// that skips the first.
void profile(Dev& dev, int k) {
    bench_logits(dev, 1);
    const SampleParams p = kBenchCases[k].p;
    to_device(dev.params, &p, sizeof p);
    for (int i = 0; i < 2; ++i) launch_sample_rows(nullptr, dev.logits, kBenchV, 1, dev.params, dev.tokens, nullptr);
    CK(cudaDeviceSynchronize());
    std::printf("profiled case %d (%s)\n", k, kBenchCases[k].name);
}
void bench(Dev& dev) {
    const int V = kBenchV;
    bench_logits(dev, 64);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    // The launcher's cluster size with the radix descent alone and with the value bins (the default),
    // and one block per row (value bins), alternating, in the same process.
    for (int rows : {1, 8, 64}) {
        for (const BenchCase& c : kBenchCases) {
            std::vector<SampleParams> ps(rows, c.p);
            to_device(dev.params, ps.data(), rows * sizeof(SampleParams));
            const int auto_c = sample_cluster_size(rows, V);
            float us[3][3] = {};
            for (int round = 0; round < 3; ++round)
                for (int v = 0; v < 3; ++v) {
                    const int C = v == 2 ? 1 : auto_c, radix = v == 0 ? 1 : 0;
                    launch_sample_rows(nullptr, dev.logits, V, rows, dev.params, dev.tokens, nullptr, nullptr, C, radix);
                    const int iters = 50;
                    CK(cudaEventRecord(a));
                    for (int i = 0; i < iters; ++i)
                        launch_sample_rows(nullptr, dev.logits, V, rows, dev.params, dev.tokens, nullptr, nullptr, C, radix);
                    CK(cudaEventRecord(b));
                    CK(cudaEventSynchronize(b));
                    float ms = 0;
                    CK(cudaEventElapsedTime(&ms, a, b));
                    us[v][round] = 1e3f * ms / iters;
                }
            std::printf("timing V=%d rows %2d %-30s us per launch, %d per row: radix %6.1f %6.1f %6.1f | value bins %6.1f %6.1f %6.1f"
                        " | 1 per row, value bins %6.1f %6.1f %6.1f\n",
                        V, rows, c.name, auto_c, us[0][0], us[0][1], us[0][2], us[1][0], us[1][1], us[1][2], us[2][0], us[2][1], us[2][2]);
        }
    }
}
#endif

}  // namespace

int main(int argc, char** argv) {
    bool run_bench = true, quick = false;
    int profile_case = -1;
    for (int i = 1; i < argc; ++i) {
        if (std::string(argv[i]) == "--no-bench") run_bench = false;
        if (std::string(argv[i]) == "--quick") quick = true;  // greedy and kept sets only
        if (std::string(argv[i]) == "--profile" && i + 1 < argc) profile_case = std::atoi(argv[++i]);
    }
#if !defined(SCR_SAMPLE_HOST_EMULATION)
    if (profile_case >= 0 && profile_case < int(std::size(kBenchCases)) && have_device()) {
        Dev dev;
        profile(dev, profile_case);
        return 0;
    }
#else
    (void)profile_case;
#endif
    host_selftest();
    if (!have_device()) {
        if (std::getenv("SCR_REQUIRE_GPU")) {
            std::printf("SCR_REQUIRE_GPU is set but no CUDA device\n");
            return 1;
        }
        std::printf("no CUDA device: skipped (host self-test %s)\n", failures ? "FAILED" : "passed");
        return failures ? 1 : 77;
    }
    Dev dev;
    test_greedy(dev);
    test_kept_sets(dev);
    test_random_parameters(dev);
    test_cluster_sizes(dev);
    test_select_paths(dev);
    if (!quick) test_frequencies(dev);
#if !defined(SCR_SAMPLE_HOST_EMULATION)
    if (run_bench) bench(dev);
#else
    (void)run_bench;
#endif
    std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
