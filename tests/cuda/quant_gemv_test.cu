// scr_cuda_quant_gemv: the quantized decode GEMVs of kernels/cuda/quant_linear.cuh on the GPU.
//   * correctness: random non-zero packed weights, scales, biases and activations at Llama-3.2-1B /
//     Llama-3.1-8B shapes, each output checked against a float64 host reference of the same
//     dequantization (w = scale * q + bias; int8: w = scale * q), for 1, 3, 8 and 13 token rows and for 5
//     rows with a bias and a residual;
//     outputs are poisoned with NaN first, so an unwritten element fails;
//   * timing (unless --no-bench): CUDA events around a captured graph of back-to-back launches that
//     rotate over enough weight copies to miss L2; GB/s of the bytes the kernel must read (packed
//     weights + scales + biases) beside the device copy bandwidth and the existing bf16 GEMV
//     (linear.cuh) on the same shape, in the same process.
// Exit: 0 all checks passed, 1 a check failed, 77 no GPU (ctest skips).
//   scr_cuda_quant_gemv [--no-bench] [--shapes NxK,NxK,...] [--host-selftest]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/quant_linear.cuh"

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

enum class Fmt { int4_g32, int4_g64, int4_g128, int8, bf16 };
constexpr Fmt kQuantFormats[] = {Fmt::int4_g32, Fmt::int4_g64, Fmt::int4_g128, Fmt::int8};

const char* name_of(Fmt f) {
    switch (f) {
        case Fmt::int4_g32: return "mlx-int4-g32";
        case Fmt::int4_g64: return "mlx-int4-g64";
        case Fmt::int4_g128: return "mlx-int4-g128";
        case Fmt::int8: return "int8";
        default: return "bf16";
    }
}
int group_of(Fmt f) { return f == Fmt::int4_g32 ? 32 : f == Fmt::int4_g64 ? 64 : f == Fmt::int4_g128 ? 128 : 0; }
bool is_int4(Fmt f) { return group_of(f) > 0; }

struct Sizes {
    size_t q = 0, scales = 0, biases = 0;  // bytes
    size_t total() const { return q + scales + biases; }
};
Sizes sizes_of(Fmt f, int n, int k) {
    Sizes s;
    if (is_int4(f)) {
        s.q = size_t(n) * k / 2;
        s.scales = s.biases = size_t(n) * (k / group_of(f)) * 2;
    } else if (f == Fmt::int8) {
        s.q = size_t(n) * k;
        s.scales = size_t(n) * 2;
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

void launch(Fmt f, cudaStream_t st, const QuantLinearArgs& a) {
    Ctx c;
    c.stream = st;
    switch (f) {
        case Fmt::int4_g32: quant_linear<qdetail::MlxInt4<32, bf16_t>>(c, a); break;
        case Fmt::int4_g64: quant_linear<qdetail::MlxInt4<64, bf16_t>>(c, a); break;
        case Fmt::int4_g128: quant_linear<qdetail::MlxInt4<128, bf16_t>>(c, a); break;
        case Fmt::int8: quant_linear<qdetail::Int8Channel<bf16_t>>(c, a); break;
        default: die(text("launch: %s is not a quantized format", name_of(f)));
    }
}

// The existing bf16 GEMV, for the shapes of this test (its N and K are template constants).
template <int N, int K>
void dense_bf16(cudaStream_t st, int rows, const float* x, const void* w, float* y) {
    Ctx c;
    c.stream = st;
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
        } else {
            const double q = double(int8_t(h.q[size_t(n) * k + i]));
            w[i] = bf16_to_double(h.scales[n]) * q;
            bound[i] = std::fabs(w[i]);
        }
    }
}

constexpr int kRefRows = 13;  // token rows the reference covers (checks use 1, 3, 5, 8, 13)

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
                    const float* xt = x.data() + size_t(t) * k;
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

// Exactness of the bit tricks on the host (runs here, no GPU): every nibble and every int8 value.
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
    std::printf("host selftest (int4 / int8 unpacking, every value at every position): %s\n", bad ? "FAILED" : "ok");
    return bad ? 1 : 0;
}

}  // namespace

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
            die(text("unknown argument '%s' (usage: scr_cuda_quant_gemv [--no-bench] [--shapes NxK,...] [--host-selftest])", a.c_str()));
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
    const double copy = bench ? copy_gbs() : 0.0;
    if (bench) std::printf("device copy bandwidth (read + write): %.0f GB/s\n", copy);

    constexpr double kTol = 1e-5;  // |y - ref| <= kTol * sum_k |x_k| (|s q_k| + |b|): ~170 f32 ulps of the terms
    int failures = 0;
    std::vector<std::string> table;
    struct Check {
        int rows;
        bool epilogue;  // with a linear bias and a residual added
    };
    const Check checks[] = {{1, false}, {3, false}, {8, false}, {kRefRows, false}, {5, true}};
    const int bench_rows[] = {1, 2, 4, 8};
    for (const Shape& sh : shapes) {
        const int n = sh.n, k = sh.k;
        float *x = nullptr, *y = nullptr;
        CK(cudaMalloc(&x, sizeof(float) * kRefRows * k));
        CK(cudaMalloc(&y, sizeof(float) * kRefRows * n));
        fill_values(x, false, size_t(kRefRows) * k, 1000 + n + k, -1.0f, 1.0f);
        float *bias = nullptr, *residual = nullptr;
        CK(cudaMalloc(&bias, sizeof(float) * n));
        CK(cudaMalloc(&residual, sizeof(float) * kRefRows * n));
        fill_values(bias, false, n, 2000 + n, -0.5f, 0.5f);
        fill_values(residual, false, size_t(kRefRows) * n, 3000 + n, -2.0f, 2.0f);
        std::vector<float> hbias(n), hres(size_t(kRefRows) * n);
        CK(cudaMemcpy(hbias.data(), bias, sizeof(float) * n, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hres.data(), residual, sizeof(float) * hres.size(), cudaMemcpyDeviceToHost));
        std::vector<float> hx(size_t(kRefRows) * k);
        CK(cudaMemcpy(hx.data(), x, sizeof(float) * hx.size(), cudaMemcpyDeviceToHost));
        std::vector<float> hy(size_t(kRefRows) * n);
        std::vector<double> bf16_us(9, std::nan(""));

        // Baseline first: the existing bf16 GEMV on this shape.
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
                table.push_back(text("%6dx%-5d %-11s %-14s %4d %9.2f %7.0f %5.1f%% %6s%s", n, k, sh.what, "bf16 (dense)", rows, us,
                                     gbs, 100.0 * gbs / copy, "1.00x", written ? "" : "  UNWRITTEN OUTPUT"));
            }
            for (auto& w : ws) free_weights(w);
        }

        for (Fmt f : kQuantFormats) {
            const Sizes s = sizes_of(f, n, k);
            // Correctness on one weight set.
            DevWeights w0 = make_weights(f, n, k, 11);
            const HostWeights hw = download(f, n, k, w0);
            const Reference ref = reference(f, hw, n, k, hx);
            const size_t m = ref.rows_checked.size();
            for (const Check& ck : checks) {
                const int rows = ck.rows;
                CK(cudaMemset(y, 0xff, sizeof(float) * rows * n));  // NaN: unwritten outputs fail
                QuantLinearArgs a;
                a.q = w0.q;
                a.scales = w0.scales;
                a.biases = w0.biases;
                a.x = x;
                a.y = y;
                a.n = n;
                a.k = k;
                a.rows = rows;
                if (ck.epilogue) {
                    a.bias = bias;
                    a.residual = residual;
                }
                launch(f, st, a);
                CK(cudaGetLastError());
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(hy.data(), y, sizeof(float) * rows * n, cudaMemcpyDeviceToHost));
                size_t unwritten = 0, wrong = 0;
                double worst = 0.0, err2 = 0.0, ref2 = 0.0;
                for (size_t i = 0; i < size_t(rows) * n; ++i) unwritten += std::isnan(hy[i]) ? 1 : 0;
                for (int t = 0; t < rows; ++t)
                    for (size_t j = 0; j < m; ++j) {
                        const int nn = ref.rows_checked[j];
                        const double out = hy[size_t(t) * n + nn];
                        double r = ref.y[t * m + j], b = ref.bound[t * m + j];
                        if (ck.epilogue) {
                            r += double(hbias[nn]) + double(hres[size_t(t) * n + nn]);
                            b += std::fabs(double(hbias[nn])) + std::fabs(double(hres[size_t(t) * n + nn]));
                        }
                        const double e = std::fabs(out - r);
                        if (!(e <= kTol * b)) ++wrong;
                        worst = std::max(worst, e / b);
                        err2 += e * e;
                        ref2 += r * r;
                    }
                const bool ok = unwritten == 0 && wrong == 0;
                failures += ok ? 0 : 1;
                std::printf("check %6dx%-5d %-13s rows %2d%s: %zu outputs (%d rows x %zu checked), err/bound max %.2e, "
                            "||err||/||ref|| %.2e, wrong %zu, unwritten %zu -> %s\n",
                            n, k, name_of(f), rows, ck.epilogue ? " +bias+residual" : "", size_t(rows) * m, rows, m, worst, std::sqrt(err2 / ref2), wrong,
                            unwritten, ok ? "ok" : "FAILED");
            }
            free_weights(w0);
            if (!bench) continue;
            const int copies = int(std::clamp<size_t>((size_t(4) * prop.l2CacheSize + s.total() - 1) / s.total(), 1, 64));
            std::vector<DevWeights> ws;
            for (int c = 0; c < copies; ++c) ws.push_back(make_weights(f, n, k, 500 + c));
            for (int rows : bench_rows) {
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
                    launch(f, st, a);
                });
                const double gbs = double(s.total()) / (us * 1e-6) / 1e9;
                table.push_back(text("%6dx%-5d %-11s %-14s %4d %9.2f %7.0f %5.1f%% %5.2fx", n, k, sh.what, name_of(f), rows, us, gbs,
                                     100.0 * gbs / copy, bf16_us[rows] / us));
            }
            for (auto& w : ws) free_weights(w);
        }
        cudaFree(x);
        cudaFree(y);
        cudaFree(bias);
        cudaFree(residual);
    }
    CK(cudaDeviceSynchronize());
    if (bench) {
        std::printf("\nGB/s: bytes the kernel must read (packed weights + scales + biases; x and y not counted) per "
                    "launch time; %% of the device copy bandwidth %.0f GB/s; speed-up over the bf16 GEMV, same rows\n",
                    copy);
        std::printf("%12s %-11s %-14s %4s %9s %7s %6s %6s\n", "N x K", "layer", "format", "rows", "us", "GB/s", "%copy",
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
