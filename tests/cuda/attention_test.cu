// scr_cuda_attention: attention launches (kernels/cuda/attention.cuh) on the GPU, over a paged bf16
// KV cache with shuffled block tables, each against a float64 host reference: prefill-sized ones
// (more than 64 rows: the tensor-core kernel of attention_prefill.cuh and the key-per-lane kernel)
// and decode-sized ones (the vector layout and the scalar key loop); the fused decode launch
// (RoPE + K/V append + attention) bit for bit against rope_append + attention; and the decode
// launches' context split at long contexts (run_parts_case).
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

// Prefill-sized steps (more than 64 rows): path 0 the tensor-core kernel, 1 the key-per-lane one.
// Decode-sized steps (at most 64 rows): path 0 the vector layout (attend_group_vec), 1 the scalar
// key loop (attend_group).
template <int HQ, int HKV, int D>
int run_case(const Case& cs, cudaStream_t st, std::mt19937& rng) {
    Step<HQ, HKV, D> s(cs, rng);
    DeviceStep<HQ, HKV, D> dev(s, cs, st);
    const bool decode = s.rows <= kAttentionDecodeMaxRows;
    const char* names[2] = {decode ? "vector" : "tensor cores", decode ? "scalar" : "key per lane"};

    std::vector<float> got[2];
    for (int path = 0; path < 2; ++path) {
        attention_prefill_override() = path == 0 ? 1 : 0;
        attention_vec_override() = path == 0 ? 1 : 0;
        CK(cudaMemset(dev.out, 0xff, s.q.size() * 4));
        attention<HQ, HKV, D, BS, bf16_t>(dev.c, s.rows, dev.q, dev.kv, s.block_bytes, 0, s.v_off, s.scale, dev.out, dev.x);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(st));
        got[path].resize(s.q.size());
        CK(cudaMemcpy(got[path].data(), dev.out, s.q.size() * 4, cudaMemcpyDeviceToHost));
    }
    attention_prefill_override() = -1;
    attention_vec_override() = -1;

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
                            std::printf("  %s: %s row %d head %d dim %d: got %.9g want %.9g (bound %.3g)\n", cs.name, names[path], r, h, d, v,
                                        ref[d], bound[d]);
                    } else {
                        worst[path] = std::max(worst[path], err / bound[d]);
                    }
                }
        }
    const bool ok = !bad[0] && !bad[1];
    std::printf("%s %s (H %d/%d, D %d, %d rows): %s %s (worst err/bound %.2e), %s %s (%.2e)\n", ok ? "ok  " : "FAIL", cs.name, HQ, HKV, D,
                s.rows, names[0], bad[0] ? "FAIL" : "pass", worst[0], names[1], bad[1] ? "FAIL" : "pass", worst[1]);
    return !ok;
}

// A decode step of one token per sequence (at the given prior lengths) for rope_attention: its
// random K/V projections, KV slots and RoPE frequencies, and the device arrays for them (with
// rotated q written to qrot by the unfused path).
template <int HQ, int HKV, int D>
struct RopeStep {
    static constexpr int ROT = D;
    Case cs;
    Step<HQ, HKV, D> s;
    DeviceStep<HQ, HKV, D> dev;
    std::vector<float> k, v;
    RopeFreqs<ROT / 2> f;
    float *dk = nullptr, *dv = nullptr, *qrot = nullptr;
    int64_t* dslots = nullptr;

    static Case make_case(const char* name, const std::vector<int>& priors, int pad, int window, bool sinks) {
        Case c{name, {}, pad, window, 0.0f, sinks};
        for (int p : priors) c.seqs.push_back({p, 1});
        return c;
    }
    RopeStep(const char* name, const std::vector<int>& priors, int pad, int window, bool sinks, cudaStream_t st, std::mt19937& rng)
        : cs(make_case(name, priors, pad, window, sinks)), s(cs, rng), dev(s, cs, st) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        k.resize(size_t(s.rows) * HKV * D);
        v.resize(k.size());
        for (auto& x : k) x = nd(rng);
        for (auto& x : v) x = nd(rng);
        std::vector<int64_t> slots(size_t(s.rows), -1);
        for (int r = 0; r < s.live; ++r) {
            const int pos = s.positions[size_t(r)];
            slots[size_t(r)] = int64_t(s.tables[size_t(s.seq_of[size_t(r)]) * s.stride + pos / BS]) * BS + pos % BS;
        }
        for (int i = 0; i < ROT / 2; ++i) f.inv_freq[i] = float(std::pow(500000.0, -2.0 * i / ROT));
        dk = DeviceStep<HQ, HKV, D>::upload(k);
        dv = DeviceStep<HQ, HKV, D>::upload(v);
        dslots = DeviceStep<HQ, HKV, D>::upload(slots);
        CK(cudaMalloc(&qrot, s.q.size() * 4));
        dev.c.step.slot_mapping = dslots;
        dev.c.one_token_per_seq = true;
    }
    ~RopeStep() {
        for (void* p : {(void*)dk, (void*)dv, (void*)qrot, (void*)dslots}) cudaFree(p);
    }
    RopeStep(const RopeStep&) = delete;
    RopeStep& operator=(const RopeStep&) = delete;

    // One launch (fused, or rope_append + attention) on the step's original KV cache; its outputs
    // and the KV cache after it.
    void run(bool fused, std::vector<float>& out, std::vector<uint16_t>& kv_after, cudaStream_t st) {
        const size_t kv_bytes = s.kv.size() * 2;
        CK(cudaMemcpy(dev.kv, s.kv.data(), kv_bytes, cudaMemcpyHostToDevice));
        CK(cudaMemset(dev.out, 0xff, s.q.size() * 4));
        if (fused) {
            rope_attention<HQ, HKV, D, ROT, BS, bf16_t>(dev.c, s.rows, dev.q, dk, dv, qrot, f, dev.kv, s.block_bytes, 0, s.v_off, s.scale, dev.out,
                                                        dev.x);
        } else {
            rope_append<HQ, HKV, D, ROT, BS, bf16_t>(dev.c, s.rows, dev.q, dk, dv, qrot, f, dev.kv, s.block_bytes, 0, s.v_off);
            attention<HQ, HKV, D, BS, bf16_t>(dev.c, s.rows, qrot, dev.kv, s.block_bytes, 0, s.v_off, s.scale, dev.out, dev.x);
        }
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(st));
        out.resize(s.q.size());
        CK(cudaMemcpy(out.data(), dev.out, s.q.size() * 4, cudaMemcpyDeviceToHost));
        kv_after.resize(s.kv.size());
        CK(cudaMemcpy(kv_after.data(), dev.kv, kv_bytes, cudaMemcpyDeviceToHost));
    }

    // float64 attention of live row r, query head h, from the rotated q (q_rot, as the unfused path
    // left it) over the KV cache as written (kv_after): ref[D] and the per-dim bound of the header.
    void reference(const std::vector<float>& q_rot, const std::vector<uint16_t>& kv_after, int r, int h, std::vector<double>& ref,
                   std::vector<double>& bound) const {
        const int kvh = h / (HQ / HKV), seq = s.seq_of[size_t(r)], ctx = s.positions[size_t(r)] + 1;
        const int first = cs.window > 0 ? std::max(0, ctx - cs.window) : 0;
        auto kvv = [&](int which, int j, int d) {
            const int block = s.tables[size_t(seq) * s.stride + j / BS];
            return bf16_value(kv_after[size_t(block) * size_t(s.block_bytes / 2) + size_t(which) * size_t(s.v_off / 2) +
                                       (size_t(kvh) * BS + j % BS) * D + d]);
        };
        const float* qr = &q_rot[(size_t(r) * HQ + h) * D];
        const double sink = cs.sinks ? double(s.sinks[size_t(h)]) : -INFINITY;
        std::vector<double> sc(size_t(ctx), -INFINITY), pv_abs(D, 0.0);
        ref.assign(D, 0.0);
        double mx = sink, qk_abs = 0;
        for (int j = first; j < ctx; ++j) {
            double dot = 0, a = 0;
            for (int d = 0; d < D; ++d) {
                dot += qr[d] * kvv(0, j, d);
                a += std::fabs(qr[d] * kvv(0, j, d));
            }
            sc[size_t(j)] = dot * s.scale;
            mx = std::max(mx, sc[size_t(j)]);
            qk_abs = std::max(qk_abs, a * s.scale);
        }
        double z = cs.sinks ? std::exp(sink - mx) : 0.0;
        for (int j = first; j < ctx; ++j) z += std::exp(sc[size_t(j)] - mx);
        for (int j = first; j < ctx; ++j)
            for (int d = 0; d < D; ++d) {
                const double p = std::exp(sc[size_t(j)] - mx) / z;
                ref[d] += p * kvv(1, j, d);
                pv_abs[d] += p * std::fabs(kvv(1, j, d));
            }
        bound.resize(D);
        for (int d = 0; d < D; ++d) bound[d] = 2e-5 * (1.0 + qk_abs) * pv_abs[d] + 1e-6;
    }

    // Counts the outputs of `got` outside the bound of reference() (printing the first 3 as `what`),
    // raising worst to the largest err / bound of the others.
    int check(const std::vector<float>& q_rot, const std::vector<uint16_t>& kv_after, const std::vector<float>& got, const char* what,
              double& worst) const {
        int bad = 0;
        std::vector<double> ref, bound;
        for (int r = 0; r < s.live; ++r)
            for (int h = 0; h < HQ; ++h) {
                reference(q_rot, kv_after, r, h, ref, bound);
                for (int d = 0; d < D; ++d) {
                    const double v = got[(size_t(r) * HQ + h) * D + d], err = std::fabs(v - ref[d]);
                    if (!(err <= bound[d])) {
                        if (bad++ < 3)
                            std::printf("  %s: %s row %d head %d dim %d: got %.9g want %.9g (bound %.3g)\n", cs.name, what, r, h, d, v, ref[d],
                                        bound[d]);
                    } else {
                        worst = std::max(worst, err / bound[d]);
                    }
                }
            }
        return bad;
    }

    // Graph padding rows of `out` that are not all 0 (each named).
    int nonzero_padding(const std::vector<float>& out) const {
        int bad = 0;
        for (int r = s.live; r < s.rows; ++r)
            for (int i = 0; i < HQ * D; ++i)
                if (out[size_t(r) * HQ * D + i] != 0.0f) {
                    ++bad;
                    std::printf("  %s: padding row %d not 0\n", cs.name, r);
                    break;
                }
        return bad;
    }
    std::vector<float> rotated_q() const {
        std::vector<float> q_rot(s.q.size());
        CK(cudaMemcpy(q_rot.data(), qrot, s.q.size() * 4, cudaMemcpyDeviceToHost));
        return q_rot;
    }
};

// Decode steps (one token per sequence, at most 64 rows): rope_attention's fused launch (RoPE, the
// K/V append and attention in one kernel; with and without the per-head split) against
// rope_append + attention, for the vector and the scalar key loops. The fused vector launch takes
// the current position from shared memory instead of the cache, so this is where a mistake in
// that would show: outputs and the written KV rows must match bit for bit. Then the outputs
// against a float64 reference built from the rotated q the unfused path leaves in q_out.
template <int HQ, int HKV, int D>
int run_rope_case(const char* name, const std::vector<int>& priors, int pad, int window, cudaStream_t st, std::mt19937& rng) {
    RopeStep<HQ, HKV, D> rs(name, priors, pad, window, false, st, rng);
    std::vector<float> out[5];
    std::vector<uint16_t> kv_after[5];
    // runs: 0 fused split, 1 fused one block per group, 2 rope_append + attention (vector layout);
    // 3 rope_append + attention, 4 fused split (scalar key loop)
    for (int run = 0; run < 5; ++run) {
        attention_vec_override() = run < 3 ? 1 : 0;
        attention_split_override() = run == 0 || run == 4 ? 1 << 20 : 0;
        rs.run(run < 2 || run == 4, out[run], kv_after[run], st);
    }
    attention_vec_override() = -1;
    attention_split_override() = -1;
    int bad = 0;
    for (int run : {0, 1, 4}) {
        const int ref = run == 4 ? 3 : 2;
        const bool diff_out = std::memcmp(out[run].data(), out[ref].data(), out[ref].size() * 4) != 0;
        const bool diff_kv = kv_after[run] != kv_after[ref];
        if (diff_out || diff_kv) {
            ++bad;
            size_t n = 0;
            for (size_t i = 0; i < out[ref].size(); ++i) n += std::memcmp(&out[run][i], &out[ref][i], 4) != 0;
            std::printf("  %s: fused (%s) vs rope_append + attention: %zu of %zu outputs differ, KV %s\n", name,
                        run == 0 ? "vector, split" : run == 1 ? "vector, no split" : "scalar, split", n, out[ref].size(),
                        diff_kv ? "differs" : "same");
        }
    }
    // float64 reference from the rotated q and the KV cache as written
    const std::vector<float> q_rot = rs.rotated_q();
    double worst[2] = {0, 0};
    const int bad_ref[2] = {rs.check(q_rot, kv_after[2], out[1], "vector", worst[0]), rs.check(q_rot, kv_after[2], out[3], "scalar", worst[1])};
    bad += rs.nonzero_padding(out[0]) + rs.nonzero_padding(out[1]);  // graph padding rows come out 0
    bad += bad_ref[0] + bad_ref[1];
    std::printf("%s %s (H %d/%d, D %d, %d rows): fused == rope_append + attention (vector split / not, scalar split) %s; vs float64: "
                "vector %s (%.2e), "
                "scalar %s (%.2e)\n",
                bad ? "FAIL" : "ok  ", name, HQ, HKV, D, rs.s.rows, bad > bad_ref[0] + bad_ref[1] ? "NO" : "yes", bad_ref[0] ? "FAIL" : "pass",
                worst[0], bad_ref[1] ? "FAIL" : "pass", worst[1]);
    return bad ? 1 : 0;
}

// Decode steps with long contexts and the context split on (a workspace in the Ctx, as the model
// gives): the fused launch with and without the head split, with a token's parts on one block each,
// all on one block, or three blocks sharing them, and rope_append + attention must agree bit for
// bit (outputs and KV rows: a head's bits depend on its context only), also when run again (the
// tickets come back to zero), and against float64 with the bound above, at `parts` most parts. The
// same step without the split (the single-block merge) must stay within the bound too.
template <int HQ, int HKV, int D>
int run_parts_case(const char* name, const std::vector<int>& priors, int pad, int window, bool sinks, int parts, cudaStream_t st,
                   std::mt19937& rng) {
    RopeStep<HQ, HKV, D> rs(name, priors, pad, window, sinks, st, rng);
    if (rs.s.rows > kAttentionPartsRows) {  // such a launch would keep P = 1 and test nothing here
        std::printf("FAIL %s: %d rows, more than a launch with parts may have (%d)\n", name, rs.s.rows, kAttentionPartsRows);
        return 1;
    }
    float* ws = nullptr;
    const int64_t ws_floats = attention_workspace_floats(HQ, D);
    CK(cudaMalloc(&ws, size_t(ws_floats) * 4));
    CK(cudaMemset(ws, 0, size_t(ws_floats) * 4));
    // runs, all with the split: 0 fused + head split, a block per part; 1 fused, one block per group
    // taking all parts in turn; 2 rope_append + attention, two blocks sharing the parts; 3 = run 0
    // again (the tickets reused); 4 fused + head split, three blocks sharing the parts;
    // then 5: fused + head split without the split
    constexpr int kRuns = 6;
    const int blocks[kRuns] = {parts, 1, 2, parts, 3, 1};
    std::vector<float> out[kRuns];
    std::vector<uint16_t> kv_after[kRuns];
    attention_vec_override() = 1;
    attention_parts_override() = parts;
    for (int run = 0; run < kRuns; ++run) {
        attention_split_override() = run == 1 ? 0 : 1 << 20;
        attention_part_blocks_override() = blocks[run];
        rs.dev.c.attn_ws = run == 5 ? nullptr : ws;
        rs.run(run != 2, out[run], kv_after[run], st);
    }
    attention_vec_override() = -1;
    attention_split_override() = -1;
    attention_parts_override() = -1;
    attention_part_blocks_override() = -1;
    int bad = 0;
    for (int run : {1, 2, 3, 4}) {
        size_t n = 0;
        for (size_t i = 0; i < out[0].size(); ++i) n += std::memcmp(&out[run][i], &out[0][i], 4) != 0;
        if (n || kv_after[run] != kv_after[0]) {
            ++bad;
            std::printf("  %s: run %d vs the fused launch, a block per part: %zu of %zu outputs differ, KV %s\n", name, run, n, out[0].size(),
                        kv_after[run] != kv_after[0] ? "differs" : "same");
        }
    }
    std::vector<unsigned> tickets(size_t(kAttentionPartsRows) * HQ);
    CK(cudaMemcpy(tickets.data(), ws, tickets.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaFree(ws));
    for (unsigned t : tickets)
        if (t != 0) {
            ++bad;
            std::printf("  %s: a ticket is %u after the launches, not 0\n", name, t);
            break;
        }
    int most_parts = 1;
    for (int r = 0; r < rs.s.live; ++r) {
        const int ctx = rs.s.positions[size_t(r)] + 1, first = window > 0 ? std::max(0, ctx - window) : 0;
        most_parts = std::max(most_parts, attention_parts((ctx + BS - 1) / BS - first / BS, 16, parts));
    }
    const std::vector<float> q_rot = rs.rotated_q();
    double worst[2] = {0, 0};
    const int bad_ref[2] = {rs.check(q_rot, kv_after[0], out[0], "split", worst[0]), rs.check(q_rot, kv_after[0], out[5], "no split", worst[1])};
    bad += rs.nonzero_padding(out[0]);  // graph padding rows come out 0
    bad += bad_ref[0] + bad_ref[1];
    std::printf("%s %s (H %d/%d, D %d, %d rows, up to %d parts): a block per part == all on one block == unfused, two blocks == again == "
                "three blocks %s; vs float64: "
                "split %s (%.2e), no split %s (%.2e)\n",
                bad ? "FAIL" : "ok  ", name, HQ, HKV, D, rs.s.rows, most_parts, bad > bad_ref[0] + bad_ref[1] ? "NO" : "yes",
                bad_ref[0] ? "FAIL" : "pass", worst[0], bad_ref[1] ? "FAIL" : "pass", worst[1]);
    return bad ? 1 : 0;
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
    // decode-sized launches (at most 64 rows): the vector layout and the scalar key loop
    failures += run_case<32, 8, 64>({"decode, 5 sequences + 2 padding rows", {{0, 1}, {15, 1}, {16, 1}, {200, 1}, {47, 1}}, 2}, st, rng);
    failures += run_case<32, 8, 128>({"decode 8B heads, mixed 3 + 1 + 1 rows", {{37, 3}, {300, 1}, {1, 1}}}, st, rng);
    failures += run_case<32, 8, 64>({"decode, window 40 + softcap 30", {{100, 1}, {7, 1}, {63, 1}}, 0, 40, 30.0f}, st, rng);
    failures += run_case<32, 8, 128>({"decode, sinks", {{80, 1}, {0, 1}}, 0, 0, 0.0f, true}, st, rng);
    failures += run_case<32, 4, 128>({"decode, 8 heads per group (scalar both)", {{130, 1}, {5, 1}}}, st, rng);
    failures += run_case<40, 8, 128>({"decode, 5 heads per group (scalar both)", {{31, 1}}}, st, rng);
    failures += run_case<4, 2, 16>({"decode, tiny heads", {{0, 1}, {33, 1}, {9, 1}}}, st, rng);
    // fused RoPE + append + attention against the two launches, bit for bit
    failures += run_rope_case<32, 8, 64>("rope decode, 1B heads", {150}, 0, 0, st, rng);
    failures += run_rope_case<32, 8, 128>("rope decode, 8B heads, 3 sequences + 1 padding row", {15, 16, 260}, 1, 0, st, rng);
    failures += run_rope_case<32, 8, 64>("rope decode, 9 sequences, window 20", {0, 1, 17, 31, 32, 90, 5, 19, 64}, 0, 20, st, rng);
    failures += run_rope_case<4, 2, 16>("rope decode, tiny heads", {3, 40}, 0, 0, st, rng);
    {  // 33+ rows of one token each: the fused launch's 4-warp blocks (the scalar key loop)
        std::vector<int> priors;
        for (int s = 0; s < 40; ++s) priors.push_back((s * 37) % 230);
        failures += run_rope_case<32, 8, 128>("rope decode, 40 sequences + 2 padding rows", priors, 2, 0, st, rng);
    }
    // the context split (long contexts; one short row among them keeps one part)
    // One row each: launches with parts have at most kAttentionPartsRows (1) rows.
    failures += run_parts_case<32, 8, 128>("parts, 8B heads", {2100}, 0, 0, false, kAttentionMaxParts, st, rng);
    failures += run_parts_case<32, 8, 128>("parts, 8B heads, 3 parts", {1000}, 0, 0, false, kAttentionMaxParts, st, rng);
    failures += run_parts_case<32, 8, 64>("parts, 1B heads, sinks", {5000}, 0, 0, true, kAttentionMaxParts, st, rng);
    failures += run_parts_case<32, 8, 64>("parts, window 700", {3000}, 0, 700, false, kAttentionMaxParts, st, rng);
    failures += run_parts_case<32, 8, 128>("parts, limit", {4100}, 0, 0, false, kAttentionPartsLimit, st, rng);
    failures += run_parts_case<4, 2, 16>("parts, tiny heads", {1300}, 0, 0, false, kAttentionMaxParts, st, rng);
    std::printf("%s\n", failures ? "FAILED" : "all attention checks passed");
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
