// scr_cuda_linear: the bf16 linear launches of kernels/cuda/linear.cuh on the GPU, at Llama-3.2-1B (and one 8B)
// layer shapes, in each of their regimes (1 row: float32 GEMV; 2-32: MMA linear; 33-64, 65-256: cuBLASLt
// with one algorithm per shape; more: cuBLASLt per size; detail::kMmaMinRows sets the first boundary):
//   * every output against a float64 host reference on random non-zero weights, activations, norm
//     weights, biases and residuals, with the bound |y - ref| <= 2e-5 * sum_k |w_k x_k| + 1e-6
//     (x enters the tensor cores as bf16 hi + lo, ~2^-17 relative; float32 accumulation);
//   * batch invariance within a regime: each row of a launch over R rows has exactly the bits of
//     the same row in the smallest launch of that regime holding it (alone for 1 row, the
//     2-row launch, ...), so a decode graph's bucket size never changes a sequence's result; the
//     GEMV's variants at 1-8 rows (it still takes f32 weights and segments of partial tiles) have
//     the bits of each row launched alone;
//   * outputs are poisoned with NaN first, so an unwritten element fails.
// Then batch-1 timings of the GEMV variants (--no-bench skips them).
// Exit: 0 all checks passed, 1 a check failed, 77 no GPU (ctest skips).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/linear.cuh"
#include "tests/cuda/cuda_check.hpp"

using namespace scr::kernels::cuda;
using scr::bf16_t;

namespace {

constexpr int kMaxRows = 300;  // past the MMA regime's 256 rows: one cuBLASLt-sized launch
constexpr int kRowCounts[] = {1, 2, 3, 5, 8, 9, 13, 32, 33, 64, 100, 200, kMaxRows};
// Regimes of linear.cuh: 1..kMmaMinRows-1 rows GEMV; then the MMA linear; from cuda_rt::cublas_min_rows() the
// cuBLASLt decode buckets (one algorithm per shape and bucket: up to 64 rows, 65-256); above 256
// rows cuBLASLt per size (no invariance).
int regime(int rows) {
    const int cublas = scr::cuda_rt::cublas_min_rows();
    if (rows < detail::mma_min_rows()) return 0;  // the boundary in force (SCR_CUDA_LINEAR moves it)
    if (rows < cublas && rows <= 256) return 1;
    const int bucket = scr::cuda_rt::cublas_decode_bucket(rows);
    return bucket >= 0 ? 2 + bucket : 4;
}

uint16_t to_bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest-even
}
double bf16_value(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

template <typename T>
T* upload(const std::vector<T>& h) {
    T* d = nullptr;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

struct Case {
    const char* name;
    int n_out;  // columns of y
    int k;
    bool norm, swiglu, bias_residual;
    int segs;  // 3: Q/K/V grouped (n_out = 2048 + 512 + 512)
};

// The launch a case stands for, on `rows` rows; y is [rows][n_out] (the grouped case writes its
// three outputs side by side through three y pointers with row stride = each segment's width, so
// it gets three buffers).
struct Dev {
    float *x, *nw, *bias, *res;
    bf16_t *w, *wu;
    float* y[3];
};

void run_case(const Case& cs, const Ctx& c, int rows, const Dev& d) {
    const RmsIn norm{d.x, d.nw, 1e-5f};
    float* xbuf = d.y[2];  // where a folded norm's normalized rows go on the prefill path (scratch)
    if (cs.segs == 3) {
        linear_group<2048, bf16_t, 2048, 512, 512>(c, rows, xbuf, LinearOut{d.w, nullptr, nullptr, nullptr, d.y[0]},
                                                   LinearOut{d.w + 2048 * 2048, nullptr, nullptr, nullptr, d.y[1]},
                                                   LinearOut{d.w + 2560 * 2048, nullptr, nullptr, nullptr, d.y[2] + kMaxRows * 2048}, norm);
    } else if (cs.swiglu) {
        linear_swiglu<8192, 2048, bf16_t>(c, rows, xbuf, d.w, d.wu, d.y[0], norm);
    } else if (cs.k == 8192) {
        linear<2048, 8192, bf16_t>(c, rows, d.x, d.w, d.bias, d.res, d.y[0]);
    } else if (cs.k == 14336) {
        linear<4096, 14336, bf16_t>(c, rows, d.x, d.w, d.bias, d.res, d.y[0]);
    } else {
        linear<2048, 2048, bf16_t>(c, rows, d.x, d.w, d.bias, d.res, d.y[0]);
    }
    CK(cudaGetLastError());
}

// The case's GEMV launch with at most `max_rw` weight rows per warp, one tile per block or a
// persistent grid (SCR_CUDA_GEMV's variants).
template <int N, int K, bool SWIGLU, bool NORM>
void gemv_variant(const Ctx& c, const detail::LinearParams& p, int max_rw, bool persistent = false) {
    const auto launch_tr = [&]<int MAX_RW>() {
        if (p.rows <= 1) detail::launch_gemv_rw<K, bf16_t, N, SWIGLU, NORM, 1, MAX_RW>(c, p, persistent);
        else if (p.rows <= 2) detail::launch_gemv_rw<K, bf16_t, N, SWIGLU, NORM, 2, MAX_RW>(c, p, persistent);
        else if (p.rows <= 4) detail::launch_gemv_rw<K, bf16_t, N, SWIGLU, NORM, 4, MAX_RW>(c, p, persistent);
        else detail::launch_gemv_rw<K, bf16_t, N, SWIGLU, NORM, 8, MAX_RW>(c, p, persistent);
    };
    if (max_rw == 1) launch_tr.template operator()<1>();
    else launch_tr.template operator()<4>();
}

void run_gemv_variant(const Case& cs, const Ctx& c, int rows, const Dev& d, int max_rw, bool persistent = false) {
    detail::LinearParams p;
    p.rows = rows;
    p.n_total = cs.n_out;
    p.x = d.x;
    if (cs.norm) {
        p.norm_w = d.nw;
        p.eps = 1e-5f;
    }
    if (cs.segs == 3) {
        p.nseg = 3;
        p.seg[0] = LinearOut{d.w, nullptr, nullptr, nullptr, d.y[0], 2048};
        p.seg[1] = LinearOut{d.w + 2048 * 2048, nullptr, nullptr, nullptr, d.y[1], 512};
        p.seg[2] = LinearOut{d.w + 2560 * 2048, nullptr, nullptr, nullptr, d.y[2] + kMaxRows * 2048, 512};
        gemv_variant<3072, 2048, false, true>(c, p, max_rw, persistent);
    } else if (cs.swiglu) {
        p.seg[0] = LinearOut{d.w, d.wu, nullptr, nullptr, d.y[0], 8192};
        gemv_variant<8192, 2048, true, true>(c, p, max_rw, persistent);
    } else if (cs.k == 8192) {
        p.seg[0] = LinearOut{d.w, nullptr, d.bias, d.res, d.y[0], 2048};
        gemv_variant<2048, 8192, false, false>(c, p, max_rw, persistent);
    } else if (cs.k == 14336) {
        p.seg[0] = LinearOut{d.w, nullptr, d.bias, d.res, d.y[0], 4096};
        gemv_variant<4096, 14336, false, false>(c, p, max_rw, persistent);
    } else {
        p.seg[0] = LinearOut{d.w, nullptr, d.bias, d.res, d.y[0], 2048};
        gemv_variant<2048, 2048, false, false>(c, p, max_rw, persistent);
    }
    CK(cudaGetLastError());
}

// Output (row, col) of the case as the kernel lays it out, read back from the device.
std::vector<float> read_outputs(const Case& cs, int rows, const Dev& d) {
    std::vector<float> out(size_t(rows) * cs.n_out);
    if (cs.segs == 3) {
        std::vector<float> q(size_t(rows) * 2048), k(size_t(rows) * 512), v(size_t(rows) * 512);
        CK(cudaMemcpy(q.data(), d.y[0], q.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(k.data(), d.y[1], k.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(v.data(), d.y[2] + kMaxRows * 2048, v.size() * 4, cudaMemcpyDeviceToHost));
        for (int r = 0; r < rows; ++r) {
            std::memcpy(&out[size_t(r) * 3072], &q[size_t(r) * 2048], 2048 * 4);
            std::memcpy(&out[size_t(r) * 3072 + 2048], &k[size_t(r) * 512], 512 * 4);
            std::memcpy(&out[size_t(r) * 3072 + 2560], &v[size_t(r) * 512], 512 * 4);
        }
    } else {
        CK(cudaMemcpy(out.data(), d.y[0], out.size() * 4, cudaMemcpyDeviceToHost));
    }
    return out;
}

int check_case(const Case& cs, cudaStream_t st) {
    std::mt19937 rng(1234 + cs.n_out + cs.k + cs.segs * 7 + cs.swiglu);
    std::uniform_real_distribution<float> uw(-0.05f, 0.05f), ux(-2.0f, 2.0f), un(0.5f, 1.5f);
    const int n_w = cs.n_out;  // weight rows (gate rows for SwiGLU)
    std::vector<uint16_t> hw(size_t(n_w) * cs.k), hwu(cs.swiglu ? size_t(n_w) * cs.k : 0);
    for (auto& v : hw) v = to_bf16_bits(uw(rng));
    for (auto& v : hwu) v = to_bf16_bits(uw(rng));
    std::vector<float> hx(size_t(kMaxRows) * cs.k), hnw(cs.k), hb(cs.n_out), hr(size_t(kMaxRows) * cs.n_out);
    for (auto& v : hx) v = ux(rng);
    for (auto& v : hnw) v = un(rng);
    for (auto& v : hb) v = ux(rng);
    for (auto& v : hr) v = ux(rng);

    Dev d{};
    d.x = upload(hx);
    d.nw = upload(hnw);
    d.bias = upload(hb);
    d.res = upload(hr);
    d.w = reinterpret_cast<bf16_t*>(upload(hw));
    d.wu = cs.swiglu ? reinterpret_cast<bf16_t*>(upload(hwu)) : nullptr;
    for (auto& y : d.y) CK(cudaMalloc(&y, sizeof(float) * kMaxRows * 8192 * 2));
    Ctx c;
    c.stream = st;

    // Reference rows (float64) and their error bounds.
    auto reference = [&](int r, std::vector<double>& ref, std::vector<double>& bound) {
        ref.assign(cs.n_out, 0.0);
        bound.assign(cs.n_out, 0.0);
        std::vector<double> xr(cs.k);
        double ss = 0;
        for (int i = 0; i < cs.k; ++i) ss += double(hx[size_t(r) * cs.k + i]) * hx[size_t(r) * cs.k + i];
        const double inv = cs.norm ? 1.0 / std::sqrt(ss / cs.k + 1e-5) : 1.0;
        for (int i = 0; i < cs.k; ++i) xr[i] = hx[size_t(r) * cs.k + i] * (cs.norm ? inv * hnw[i] : 1.0);
        for (int j = 0; j < cs.n_out; ++j) {
            double g = 0, gb = 0, u = 0, ub = 0;
            for (int i = 0; i < cs.k; ++i) {
                const double p = bf16_value(hw[size_t(j) * cs.k + i]) * xr[i];
                g += p;
                gb += std::fabs(p);
                if (cs.swiglu) {
                    const double q = bf16_value(hwu[size_t(j) * cs.k + i]) * xr[i];
                    u += q;
                    ub += std::fabs(q);
                }
            }
            if (cs.swiglu) {
                const double sg = g / (1.0 + std::exp(-g));
                ref[j] = sg * u;
                bound[j] = 2e-5 * (1.1 * gb * std::fabs(u) + std::fabs(sg) * ub) + 1e-6;
            } else {
                ref[j] = g + (cs.bias_residual ? double(hb[j]) + hr[size_t(r) * cs.n_out + j] : 0.0);
                bound[j] = 2e-5 * gb + 1e-6;
            }
        }
    };

    int failures = 0;
    std::vector<float> alone;  // rows 0..7 launched alone (the GEMV regime's reference)
    for (int r = 0; r < 8; ++r) {
        for (auto& y : d.y) CK(cudaMemset(y, 0xff, sizeof(float) * kMaxRows * 8192 * 2));
        Dev dr = d;
        dr.x = d.x + size_t(r) * cs.k;
        dr.res = d.res + size_t(r) * cs.n_out;
        run_case(cs, c, 1, dr);
        CK(cudaStreamSynchronize(st));
        const std::vector<float> one = read_outputs(cs, 1, d);
        alone.insert(alone.end(), one.begin(), one.end());
    }
    // The GEMV's variants (1 or 4 weight rows per warp; 4 with a persistent grid: "5" below) sum
    // in the same order: at every row count up to 8 each row has the bits it has alone, and at
    // the GEMV regime's rows (below kMmaMinRows) the default launch has them too.
    for (int rows = 1; rows <= 8; ++rows) {
        for (int rw : {0, 1, 4, 5}) {
            if (rw == 0 && rows >= detail::mma_min_rows()) continue;  // the default launch is the MMA linear's
            for (auto& y : d.y) CK(cudaMemset(y, 0xff, sizeof(float) * kMaxRows * 8192 * 2));
            if (rw == 0) run_case(cs, c, rows, d);
            else run_gemv_variant(cs, c, rows, d, rw == 5 ? 4 : rw, rw == 5);
            CK(cudaStreamSynchronize(st));
            const std::vector<float> out = read_outputs(cs, rows, d);
            if (std::memcmp(out.data(), alone.data(), out.size() * 4) != 0) {
                std::printf("%-28s rows %3d: GEMV %s differs from its rows launched alone\n", cs.name, rows,
                            rw == 0 ? "(default launch)" : rw == 5 ? "(persistent, 4 rows per warp)" : rw == 4 ? "(4 rows per warp)" : "(1 row per warp)");
                ++failures;
            }
        }
    }
    std::vector<std::pair<int, std::vector<float>>> earlier;  // (rows, outputs) of the launches so far
    for (int rows : kRowCounts) {
        for (auto& y : d.y) CK(cudaMemset(y, 0xff, sizeof(float) * kMaxRows * 8192 * 2));
        run_case(cs, c, rows, d);
        CK(cudaStreamSynchronize(st));
        const std::vector<float> out = read_outputs(cs, rows, d);
        int bad = 0, not_invariant = 0;
        double worst = 0;
        std::vector<double> ref, bound;
        for (int r = 0; r < rows; ++r) {
            if (r < 3 || r == rows - 1) {  // the reference is slow on the host: a few rows per launch
                reference(r, ref, bound);
                for (int j = 0; j < cs.n_out; ++j) {
                    const double e = std::fabs(double(out[size_t(r) * cs.n_out + j]) - ref[j]);
                    if (!(e <= bound[j])) ++bad;  // NaN (unwritten) fails too
                    worst = std::max(worst, e / bound[j]);
                }
            }
            // The same row in the smallest earlier launch of this regime that holds it.
            const float* same = nullptr;
            if (regime(rows) == 0) {
                same = &alone[size_t(r) * cs.n_out];
            } else if (regime(rows) >= 1 && regime(rows) <= 3) {
                for (const auto& [n, o] : earlier)
                    if (regime(n) == regime(rows) && r < n) {
                        same = &o[size_t(r) * cs.n_out];
                        break;
                    }
            }
            if (same && std::memcmp(&out[size_t(r) * cs.n_out], same, size_t(cs.n_out) * 4) != 0) ++not_invariant;
        }
        std::printf("%-28s rows %3d: %s (worst error / bound %.3f)%s\n", cs.name, rows, bad ? "FAILED" : "ok", worst,
                    not_invariant ? " NOT BATCH-INVARIANT" : "");
        failures += bad + not_invariant;
        earlier.emplace_back(rows, out);
    }
    cudaFree(d.x);
    cudaFree(d.nw);
    cudaFree(d.bias);
    cudaFree(d.res);
    cudaFree(d.w);
    if (d.wu) cudaFree(d.wu);
    for (auto& y : d.y) cudaFree(y);
    return failures;
}

// Batch-1 timing of the GEMV variants at the decode shapes of Llama-3.2-1B (and its lm_head):
// microseconds per launch and weight GB/s, each launch on the next of enough weight copies that
// nothing is left in L2 (50 MB) from the one before; PDL off (launches back to back).
template <int N, int K, bool SWIGLU, bool NORM>
void time_gemv(const char* name, cudaStream_t st, int segs, const float* x, const float* nw, float* y) {
    const size_t w_bytes = size_t(N) * K * 2 * (SWIGLU ? 2 : 1);
    const int copies = int(std::max<size_t>(2, (512u << 20) / w_bytes + 1));
    std::vector<bf16_t*> w(copies);
    for (auto& p : w) {
        CK(cudaMalloc(&p, w_bytes));
        CK(cudaMemset(p, 0x3c, w_bytes));  // ~0.0115 in every bf16: finite products
    }
    Ctx c;
    c.stream = st;
    std::printf("%-26s", name);
    for (int variant : {1, 4, 5}) {
        const int max_rw = variant == 5 ? 4 : variant;
        const bool persist = variant == 5;
        auto params = [&](int i) {
            detail::LinearParams p;
            p.rows = 1;
            p.n_total = N;
            p.x = x;
            p.norm_w = NORM ? nw : nullptr;
            p.eps = 1e-5f;
            bf16_t* base = w[i % copies];
            if (segs == 3) {
                p.nseg = 3;
                p.seg[0] = LinearOut{base, nullptr, nullptr, nullptr, y, 2048};
                p.seg[1] = LinearOut{base + 2048 * K, nullptr, nullptr, nullptr, y + 2048, 512};
                p.seg[2] = LinearOut{base + 2560 * K, nullptr, nullptr, nullptr, y + 2560, 512};
            } else {
                p.seg[0] = LinearOut{base, SWIGLU ? base + size_t(N) * K : nullptr, nullptr, SWIGLU ? nullptr : y, y, N};
            }
            return p;
        };
        for (int i = 0; i < copies; ++i) gemv_variant<N, K, SWIGLU, NORM>(c, params(i), max_rw, persist);  // warm-up
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        constexpr int kIters = 60;
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < kIters; ++i) gemv_variant<N, K, SWIGLU, NORM>(c, params(i), max_rw, persist);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = 1e3 * ms / kIters;
        std::printf("  %s%d %7.2f us %5.0f GB/s", persist ? "persist" : "rw<=", max_rw, us, w_bytes / us * 1e-3);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    std::printf("\n");
    for (auto p : w) cudaFree(p);
}

void time_all(cudaStream_t st) {
    float *x, *nw, *y;
    CK(cudaMalloc(&x, 8192 * 4));
    CK(cudaMalloc(&nw, 8192 * 4));
    CK(cudaMalloc(&y, 128256 * 4));
    std::vector<float> ones(8192, 0.5f);
    CK(cudaMemcpy(x, ones.data(), 8192 * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(nw, ones.data(), 8192 * 4, cudaMemcpyHostToDevice));
    std::printf("batch-1 GEMV timing (rw<=1 is SCR_CUDA_GEMV=row, rw<=4 =rows, persist4 the default):\n");
    time_gemv<3072, 2048, false, true>("QKV 3072x2048 +norm", st, 3, x, nw, y);
    time_gemv<2048, 2048, false, false>("o 2048x2048 +residual", st, 1, x, nw, y);
    time_gemv<8192, 2048, true, true>("gate+up 2x8192x2048 +norm", st, 1, x, nw, y);
    time_gemv<2048, 8192, false, false>("down 2048x8192 +residual", st, 1, x, nw, y);
    time_gemv<128256, 2048, false, true>("lm_head 128256x2048 +norm", st, 1, x, nw, y);
    cudaFree(x);
    cudaFree(nw);
    cudaFree(y);
}

}  // namespace

int main(int argc, char** argv) try {
    if (scr::test_cuda::no_gpu()) return scr::test_cuda::kSkipped;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    const Case cases[] = {
        {"2048x2048 +bias +residual", 2048, 2048, false, false, true, 1},
        {"2048x8192 +bias +residual", 2048, 8192, false, false, true, 1},
        {"4096x14336 +bias +residual (8B down)", 4096, 14336, false, false, true, 1},
        {"QKV 3072x2048 grouped +norm", 3072, 2048, true, false, false, 3},
        {"SwiGLU 8192x2048 +norm", 8192, 2048, true, true, false, 1},
    };
    int failures = 0;
    for (const Case& cs : cases) failures += check_case(cs, st);
    std::printf("%s\n", failures ? "FAILED" : "all bf16 linear checks passed");
    if (!(argc > 1 && std::strcmp(argv[1], "--no-bench") == 0)) time_all(st);
    return failures ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "scr_cuda_linear: %s\n", e.what());
    return 1;
}
