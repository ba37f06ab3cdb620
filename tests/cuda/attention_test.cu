// scr_cuda_attention: prefill-sized attention launches (kernels/cuda/attention.cuh, more than 64 rows)
// on the GPU, over a paged bf16 KV cache with shuffled block tables: the tensor-core kernel
// (attention_prefill.cuh) and the key-per-lane kernel, each against a float64 host reference.
//   * bound per output: 2e-5 * (1 + max_j |scale q.k_j|) * sum_j p_j |v_j| + 1e-6 (q and the
//     probabilities enter the tensor cores as bf16 hi + lo, ~2^-17 relative; float32 softmax and
//     accumulation);
//   * steps with one long prompt, several sequences whose rows share 16-row tiles (chunked prefill
//     mixing requests, a one-token sequence among them), a prior context, a sliding window with
//     softcapping, sinks, graph padding rows (which must come out 0), Llama-3.2-1B / 8B and
//     Qwen3-30B-A3B head shapes;
//   * outputs poisoned with NaN first.
// Then (unless --no-bench) both kernels' time for a 512-token chunk at 2k context.
// Exit: 0 all checks passed, 1 a check failed, 77 no GPU (ctest skips).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention.cuh"
#include "tests/cuda/cuda_check.hpp"

using namespace scr::kernels::cuda;
using scr::bf16_t;

namespace {

uint16_t bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
double bf16_value(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

constexpr int BS = 16;

struct Seq {
    int prior, len;  // positions prior .. prior + len - 1 are this step's rows
};
struct Case {
    const char* name;
    std::vector<Seq> seqs;
    int pad = 0;  // graph padding rows after the real ones
    int window = 0;
    float softcap = 0.0f;
    bool sinks = false;
};

template <int HQ, int HKV, int D>
struct Step {
    int rows = 0, live = 0, stride = 0, nblocks = 0;
    int64_t block_bytes = int64_t(2) * HKV * BS * D * 2, v_off = int64_t(HKV) * BS * D * 2;
    std::vector<int32_t> positions, seq_of, tables, header;
    std::vector<uint16_t> kv;  // [nblocks + 1 blocks][K, V][HKV][BS][D]
    std::vector<float> q, sinks;
    float scale = float(1.0 / std::sqrt(double(D)));

    Step(const Case& cs, std::mt19937& rng) {
        for (const Seq& s : cs.seqs) stride = std::max(stride, (s.prior + s.len + BS - 1) / BS);
        nblocks = int(cs.seqs.size()) * stride;
        std::vector<int32_t> ids(nblocks);
        std::iota(ids.begin(), ids.end(), 1);  // block 0 unused
        std::shuffle(ids.begin(), ids.end(), rng);
        tables = ids;
        for (size_t s = 0; s < cs.seqs.size(); ++s)
            for (int i = 0; i < cs.seqs[s].len; ++i) {
                positions.push_back(cs.seqs[s].prior + i);
                seq_of.push_back(int32_t(s));
            }
        live = int(positions.size());
        for (int i = 0; i < cs.pad; ++i) {
            positions.push_back(0);
            seq_of.push_back(0);
        }
        rows = int(positions.size());
        header = {live, stride, int(cs.seqs.size()), 0};
        std::normal_distribution<float> nd(0.0f, 1.0f);
        kv.resize(size_t(nblocks + 1) * size_t(block_bytes / 2));
        for (auto& v : kv) v = bf16_bits(nd(rng));
        q.resize(size_t(rows) * HQ * D);
        for (auto& v : q) v = 1.5f * nd(rng);
        if (cs.sinks) {
            sinks.resize(HQ);
            for (auto& v : sinks) v = nd(rng);
        }
    }
    double kval(int which, int seq, int j, int kvh, int d) const {
        const int block = tables[size_t(seq) * stride + j / BS];
        const size_t at = size_t(block) * size_t(block_bytes / 2) + size_t(which) * size_t(v_off / 2) + (size_t(kvh) * BS + j % BS) * D + d;
        return bf16_value(kv[at]);
    }
};

// A step's arrays on the device (freed with it) and the Ctx / extras that point at them.
template <int HQ, int HKV, int D>
struct DeviceStep {
    int32_t *pos = nullptr, *seq = nullptr, *tab = nullptr, *hdr = nullptr;
    std::byte* kv = nullptr;
    float *q = nullptr, *out = nullptr, *sinks = nullptr;
    Ctx c;
    AttnExtras x;
    template <typename T>
    static T* upload(const std::vector<T>& v) {
        T* d = nullptr;
        CK(cudaMalloc(&d, v.size() * sizeof(T)));
        CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
        return d;
    }
    DeviceStep(const Step<HQ, HKV, D>& s, const Case& cs, cudaStream_t st) {
        pos = upload(s.positions);
        seq = upload(s.seq_of);
        tab = upload(s.tables);
        hdr = upload(s.header);
        CK(cudaMalloc(&kv, s.kv.size() * 2));
        CK(cudaMemcpy(kv, s.kv.data(), s.kv.size() * 2, cudaMemcpyHostToDevice));
        q = upload(s.q);
        CK(cudaMalloc(&out, s.q.size() * 4));
        if (cs.sinks) sinks = upload(s.sinks);
        c.stream = st;
        c.step.header = hdr;
        c.step.positions = pos;
        c.step.seq_of_token = seq;
        c.step.block_tables = tab;
        x.window = cs.window;
        x.softcap = cs.softcap;
        x.sinks = sinks;
    }
    ~DeviceStep() {
        for (void* p : {(void*)pos, (void*)seq, (void*)tab, (void*)hdr, (void*)kv, (void*)q, (void*)out, (void*)sinks}) cudaFree(p);
    }
    DeviceStep(const DeviceStep&) = delete;
    DeviceStep& operator=(const DeviceStep&) = delete;
};

template <int HQ, int HKV, int D>
int run_case(const Case& cs, cudaStream_t st, std::mt19937& rng) {
    Step<HQ, HKV, D> s(cs, rng);
    DeviceStep<HQ, HKV, D> dev(s, cs, st);

    std::vector<float> got[2];
    for (int path = 0; path < 2; ++path) {  // 0: tensor cores, 1: key per lane
        attention_prefill_override() = path == 0 ? 1 : 0;
        CK(cudaMemset(dev.out, 0xff, s.q.size() * 4));
        attention<HQ, HKV, D, BS, bf16_t>(dev.c, s.rows, dev.q, dev.kv, s.block_bytes, 0, s.v_off, s.scale, dev.out, dev.x);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(st));
        got[path].resize(s.q.size());
        CK(cudaMemcpy(got[path].data(), dev.out, s.q.size() * 4, cudaMemcpyDeviceToHost));
    }
    attention_prefill_override() = -1;

    int bad[2] = {0, 0};
    double worst[2] = {0, 0};
    std::vector<double> sc, p;
    for (int r = 0; r < s.rows; ++r)
        for (int h = 0; h < HQ; ++h) {
            const int kvh = h / (HQ / HKV);
            std::vector<double> ref(D, 0.0), bound(D, 1e-6);
            if (r < s.live) {
                const int seq = s.seq_of[r], ctx = s.positions[r] + 1;
                const int first = cs.window > 0 ? std::max(0, ctx - cs.window) : 0;
                const float* qr = &s.q[(size_t(r) * HQ + h) * D];
                double mx = -INFINITY, qk_abs = 0;
                sc.assign(size_t(ctx), 0.0);
                for (int j = first; j < ctx; ++j) {
                    double dot = 0, a = 0;
                    for (int d = 0; d < D; ++d) {
                        const double kd = s.kval(0, seq, j, kvh, d);
                        dot += qr[d] * kd;
                        a += std::fabs(qr[d] * kd);
                    }
                    double v = dot * s.scale;
                    if (cs.softcap > 0) v = cs.softcap * std::tanh(v / cs.softcap);
                    sc[size_t(j)] = v;
                    mx = std::max(mx, v);
                    qk_abs = std::max(qk_abs, a * s.scale);
                }
                const double sink = cs.sinks ? double(s.sinks[h]) : -INFINITY;
                mx = std::max(mx, sink);
                double z = cs.sinks ? std::exp(sink - mx) : 0.0;
                p.assign(size_t(ctx), 0.0);
                for (int j = first; j < ctx; ++j) z += (p[size_t(j)] = std::exp(sc[size_t(j)] - mx));
                std::vector<double> pv_abs(D, 0.0);
                for (int j = first; j < ctx; ++j)
                    for (int d = 0; d < D; ++d) {
                        const double v = s.kval(1, seq, j, kvh, d);
                        ref[d] += p[size_t(j)] / z * v;
                        pv_abs[d] += p[size_t(j)] / z * std::fabs(v);
                    }
                for (int d = 0; d < D; ++d) bound[d] = 2e-5 * (1.0 + qk_abs) * pv_abs[d] + 1e-6;
            }
            for (int path = 0; path < 2; ++path)
                for (int d = 0; d < D; ++d) {
                    const double v = got[path][(size_t(r) * HQ + h) * D + d];
                    const double err = std::fabs(v - ref[d]);
                    if (!(err <= bound[d])) {
                        if (bad[path]++ < 3)
                            std::printf("  %s: %s row %d head %d dim %d: got %.9g want %.9g (bound %.3g)\n", cs.name, path ? "keys" : "mma", r, h,
                                        d, v, ref[d], bound[d]);
                    } else {
                        worst[path] = std::max(worst[path], err / bound[d]);
                    }
                }
        }
    const bool ok = !bad[0] && !bad[1];
    std::printf("%s %s (H %d/%d, D %d, %d rows): tensor cores %s (worst err/bound %.2e), key per lane %s (%.2e)\n", ok ? "ok  " : "FAIL", cs.name,
                HQ, HKV, D, s.rows, bad[0] ? "FAIL" : "pass", worst[0], bad[1] ? "FAIL" : "pass", worst[1]);
    return !ok;
}

template <int HQ, int HKV, int D>
void time_chunk(cudaStream_t st, std::mt19937& rng) {
    Case cs{"512-token chunk at 1,536 prior", {{1536, 512}}};
    Step<HQ, HKV, D> s(cs, rng);
    DeviceStep<HQ, HKV, D> dev(s, cs, st);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double us[2];
    for (int path = 0; path < 2; ++path) {
        attention_prefill_override() = path == 0 ? 1 : 0;
        attention<HQ, HKV, D, BS, bf16_t>(dev.c, s.rows, dev.q, dev.kv, s.block_bytes, 0, s.v_off, s.scale, dev.out);
        CK(cudaEventRecord(a, st));
        for (int i = 0; i < 10; ++i)
            attention<HQ, HKV, D, BS, bf16_t>(dev.c, s.rows, dev.q, dev.kv, s.block_bytes, 0, s.v_off, s.scale, dev.out);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        us[path] = 100.0 * ms;
    }
    attention_prefill_override() = -1;
    std::printf("| %d / %d | %d | %.1f | %.1f | %.1fx |\n", HQ, HKV, D, us[0], us[1], us[1] / us[0]);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

}  // namespace

int main(int argc, char** argv) try {
    if (scr::test_cuda::no_gpu()) return scr::test_cuda::kSkipped;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    std::mt19937 rng(7);
    int failures = 0;
    failures += run_case<32, 8, 64>({"one prompt", {{0, 300}}}, st, rng);
    failures += run_case<32, 8, 64>({"four sequences sharing tiles, 3 padding rows", {{37, 5}, {0, 70}, {130, 1}, {16, 40}}, 3}, st, rng);
    failures += run_case<32, 8, 64>({"window 50 + softcap 30, prior 100", {{100, 90}}, 0, 50, 30.0f}, st, rng);
    failures += run_case<32, 8, 64>({"sinks", {{0, 80}, {20, 9}}, 0, 0, 0.0f, true}, st, rng);
    failures += run_case<32, 8, 128>({"8B heads, prior 60", {{60, 200}}}, st, rng);
    failures += run_case<32, 4, 128>({"30B-A3B heads (8 per group)", {{0, 130}}}, st, rng);
    std::printf("%s\n", failures ? "FAILED" : "all prefill attention checks passed");
    if (!(argc > 1 && std::strcmp(argv[1], "--no-bench") == 0)) {
        std::printf("\nus per launch (events, mean of 10), 512 rows of one sequence at positions 1,536-2,047:\n");
        std::printf("| heads q / kv | head dim | tensor cores | key per lane | speed-up |\n|---|---:|---:|---:|---:|\n");
        time_chunk<32, 8, 64>(st, rng);
        time_chunk<32, 8, 128>(st, rng);
        time_chunk<32, 4, 128>(st, rng);
    }
    return failures ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "scr_cuda_attention: %s\n", e.what());
    return 1;
}
