// One or two token rows of an MLX int4 linear on int8 tensor cores: quant_mma1_kernel (issue #9).
// Built for one row (sessions 7-27, below); since session 28 a launch of R <= kQmma1MaxRows rows
// stages each row's x and runs each row's MMAs on the weight words the warp loads once, in the
// one-row launch's block shape, so every row gets exactly the bits it gets alone (docs/CUDA.md
// "Session 28").
//
// Why a kernel of its own: at one token row the SIMT kernels are issue-bound, not memory-bound
// (docs/CUDA.md, "Where the one-row shared-memory kernel's time goes": 4.3 thread instructions per
// int4 weight, ~40 % of the packed-byte floor), and quant_mma_kernel spends its instructions on x at
// one row (every lane loads, splits and sums its token column, 7 of 8 columns empty) and on per-group
// shuffles. Here (docs/CUDA.md, "Session 7: one token row on int8 tensor cores"):
//  * weights as the A operand of mma.m16n8k32 u8 x s8 -> s32 (exact integer sums), 16-byte streaming
//    loads, lane t of a row holding k = 32 t .. 32 t + 31 of each 128-k chunk as 4 words (word w: k =
//    32 t + 8 w), so all of a lane's words lie in group t / (G / 32) of the chunk and no lane transpose
//    is needed (each lane's B column is chosen by its own group); a word's 8 nibbles are the two A
//    registers w & 0x0f0f0f0f and (w >> 4) & 0x0f0f0f0f: 3 instructions;
//  * x as the three base-256 digits of one integer per value, on one power-of-two scale per group
//    (QDigits: one rounding add per value, |residual| <= 2^-20 of the group's max |x|), staged once per
//    block in shared memory as the B registers;
//  * the MMA's 8 columns carry 8 consecutive groups instead of 8 token rows: the lanes of column j
//    supply x only for the k of group j (the others hold zeros: PRED), so C[row][j] is group j's
//    sum of q * digit, and the scales are applied once per 8 groups, on every lane, no shuffles:
//        y += s_g * scale_x,g * (C0 + 256 C1 + 65536 C2) + b_g * X_g     (X_g = the group's sum of x)
//  * a block is up to 8 or 16 warps (qmma1_block_shape): T row tiles x W parts of K (qmma1_parts), the
//    parts added in order through shared memory: a row's bits depend on the shape only (one token
//    row has this one kernel; the folded norm's sum of x^2 also on the block size).
// Error: x to 2^-20 of its group's max, q and the integer sums exact; quant_gemv_test checks the
// tensor-core kernel's bound (2e-5 B + 1e-6, B = sum |x| (|s q| + |b|)).
#pragma once
// Included by quant_linear.cuh (after its qdetail helpers, before quant_linear()), not on its own.

namespace scr::kernels::cuda::qdetail {

constexpr int kMma1Warps = 8;  // warps per block (or 16: qmma1_block_shape): T row tiles (SwiGLU: gate and up rows) x W parts of K

// Per-format constants of the one-row kernel.
template <class F>
struct QMma1Shape {
    static constexpr int GPC = 128 / F::kGroup;        // groups per 128-k chunk
    static constexpr int SPC = 8 / GPC;                // chunks per span of 8 groups (the MMA's 8 columns)
    static constexpr int LPG = 4 * F::kWordsPerGroup;  // staging lanes per group (word-major, 4 per word)
    static constexpr int kEntryBytes = 24;             // one (word, lane) entry: 3 digits x 2 B-registers (16 + 8 bytes)
};

// Token rows of one launch of the kernel (its R): 1 (the one-row launch) up to kQmma1MaxRows, each
// row's x staged in the block's shared memory and run through the same MMAs on the weights the
// block loads once. A row's arithmetic is the same for every R (the same K split, the same staging
// and summation order), so the bits of a token row do not depend on the other rows of the launch.
// Two: at 4 rows the kernel measured slower than quant_mma_kernel (its MMAs, B loads and x staging
// grow with the rows; docs/CUDA.md "Session 28").
constexpr int kQmma1MaxRows = 2;

// Token rows up to which the MLX int4 linears run on this kernel (the quantized decode's first
// regimes; see quant_swiglu_grouped for the SwiGLU launches); more rows take quant_mma_kernel.
// SCR_CUDA_QUANT_TC1_ROWS=1 is the rule of sessions 7-27 (one row only), for A/B runs.
inline int qmma1_max_rows() {
    static const int v = int(env_int_switch(
        "SCR_CUDA_QUANT_TC1_ROWS", kQmma1MaxRows, [](long long n) { return n >= 1 && n <= kQmma1MaxRows; }, "1 or 2"));
    return v;
}

// Dynamic shared memory of one block for `chunks` 128-k chunks of x (all of K) of `rows` token
// rows: 32 zero bytes; per row the staged digits (digits 0 and 1 as one 16-byte array, digit 2 as
// an 8-byte one: 24 bytes per entry, both aligned for one vector load each); per row and group (sum
// of x, digit scale); per row the warps' sums of squares; the warps' row partials.
template <class F, bool SWIGLU>
__host__ __device__ constexpr size_t qmma1_smem(int warps, int chunks, int rows = 1) {
    constexpr int MT = SWIGLU ? 2 : 1;
    return 32 + size_t(rows) * size_t(chunks) * 16 * QMma1Shape<F>::kEntryBytes + size_t(rows) * chunks * QMma1Shape<F>::GPC * 8 +
           size_t(rows) * (warps + 1) * 4 + size_t(warps) * rows * MT * 16 * 4;
}

// mma.m16n8k32, u8 weights (A, rows) x u8 / s8 activation digits (B, columns), exact int32 sums.
template <bool SIGNED_B>
__device__ __forceinline__ void qmma_u8_16832(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                              uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (SIGNED_B)
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// x as the three base-256 digits of one integer per value: x = s 2^-14 (d0 + 256 d1 + 65536 d2) + r,
// s = 2^(E - 6) per group with max|x| < 2^E, |r| <= s 2^-15 <= 2^-20 of the group's max |x|; d0, d1 in
// [0, 255], d2 in [-16, 15]. One rounding add per value: v = x 2^(20 - E) (exact, |v| < 2^20) plus
// 1.5 * 2^23 leaves 2^22 + rint(v) in the low 24 bits, whose bytes are d0, d1 and d2 + 64 (48..79);
// d2 + 64 -> d2 bytewise: XOR 0x40, and set bit 7 where bit 6 was clear.
struct QDigits {
    uint32_t d[3];  // digit j of values (v0, v1, v2, v3) in bytes 0..3
};
__device__ __forceinline__ QDigits qdigits4(float v0, float v1, float v2, float v3) {
    constexpr float M = 12582912.0f;  // 1.5 * 2^23
    const uint32_t t0 = __float_as_uint(v0 + M), t1 = __float_as_uint(v1 + M), t2 = __float_as_uint(v2 + M),
                   t3 = __float_as_uint(v3 + M);
    QDigits r;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        const uint32_t sel = uint32_t(j) | uint32_t(4 + j) << 4;  // byte j of the first and second operand
        r.d[j] = __byte_perm(__byte_perm(t0, t1, sel), __byte_perm(t2, t3, sel), 0x5410);
    }
    r.d[2] = r.d[2] ^ 0x40404040u ^ ((~r.d[2] & 0x40404040u) << 1);
    return r;
}

// Whether the x staging issues each thread's loads of up to 4 entries together (XBATCH) rather than
// one entry at a time. Same bits either way. H200, session 13 (docs/CUDA.md "Session 13"): batched
// loads speed up the one-row GEMVs (4096x4096 7.33 -> 7.13 us, 2048x8192 8.63 -> 8.23, 8B gate/up +
// SwiGLU + norm 27.0 -> 26.2) but slow the grouped QKV with the folded norm (8B 10.8 -> 11.4); end
// to end this rule beats both "always" and "never" (MLX int4 g64, device ms per token, one call:
// 8B 2.190-2.195 vs 2.219-2.220 vs 2.238-2.246; 1B 0.579-0.580 vs 0.588 vs 0.584-0.589).
template <bool SWIGLU, bool NORM>
inline constexpr bool kQmma1XBatch = SWIGLU || !NORM;

// Where quant_mma1_kernel lets the next launch start (PdlTrigger): once the previous kernel is done.
// Sessions 7-18 triggered after the MMA loop (SCR_CUDA_QUANT_TC1_TRIGGER=loop). H200, device ms per
// token, the same bits: 1B 0.556 -> 0.528, 8B 2.092 -> 2.042 in one call; at the start (=start) 1B
// 0.535-0.536 against 0.528-0.529 after the wait in another (docs/CUDA.md "Session 19").
inline PdlTrigger qmma1_trigger() {
    static const PdlTrigger v = pdl_trigger_choice("SCR_CUDA_QUANT_TC1_TRIGGER", PdlTrigger::after_wait);
    return v;
}

// kparts = W: the warps of one row tile, each a contiguous 1/W of K, added in part order.
// WIDE: a span's scales and biases as one 32-bit load per row and pair of groups (g32 / g64), not
// two 16-bit ones. XPOSE: the earlier layout (sessions 7-11), the chunk's words transposed across the
// 4 lanes by shuffles (qchunk_words) so that word w of every lane lies in group w / (G / 32); the same
// integer sums, so the same bits (SCR_CUDA_QUANT_TC1_VARIANT=xpose, for A/B runs). XBATCH: the x
// staging's loads batched (kQmma1XBatch above).
// PRED: only the 4 lanes whose B column holds x (the others' columns are zero) load it from shared
// memory, the others hold zeros in registers; else every lane loads, the others from a 32-byte zero
// block (sessions 7-23; SCR_CUDA_QUANT_TC1_VARIANT=zero). The same bits. H200, session 24 (docs/CUDA.md
// "Session 24"): device ms per token 8B 2.037 -> 2.024, 1B 0.486-0.488 -> 0.481; lm_head 92.2 -> 89.3 us.
// BW: warps per block, 8 (two blocks per SM) or 16 (one block per SM: the block's 16 / W row tiles
// share one staging of x, half the L2 reads and staging work per SM; qmma1_block_shape); a block
// may run fewer (T x W of blockDim: the fill of qmma1_block_shape). Registers
// are capped at 128 either way, and a row's arithmetic depends on W only.
// R: token rows (kQmma1MaxRows above); rows of the launch = R.
template <class F, bool SWIGLU, bool NORM, bool WIDE, bool XPOSE, bool XBATCH, bool PRED, int BW = kMma1Warps, int R = 1>
__global__ void __launch_bounds__(BW * kWarp, 16 / BW) quant_mma1_kernel(const __grid_constant__ QuantFusedArgs p, int kparts, PdlTrigger trigger_at) {
    static_assert(F::kAffine, "the one-row tensor-core kernel is for the MLX int4 formats");
    static_assert(F::kGroup <= 128, "the digit sums are combined in int32, which holds groups of up to 128");
    using S = QMma1Shape<F>;
    using ST = typename F::Scale;
    constexpr int MT = SWIGLU ? 2 : 1;  // SwiGLU: tile 0 the gate's rows, tile 1 the up rows
    constexpr int GPC = S::GPC, SPC = S::SPC, WPG = F::kWordsPerGroup, LPG = S::LPG;
    constexpr int SWAP = XPOSE ? F::kSwap : 0;  // the lane transpose of the A words (none by default)
    // Chunks per load round, two rounds in flight (one chunk from 2 token rows: registers; the
    // MMA order, so the bits, do not depend on U).
    constexpr int U = SWIGLU || R > 1 ? 1 : 2;
    static_assert(R >= 1 && R <= kQmma1MaxRows, "token rows per launch");
    extern __shared__ __align__(16) uint8_t qmma1_smem_raw[];

    const int n_total = qfused_rows<SWIGLU>(p);
    const int nw = blockDim.x / kWarp;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    // x of all of K staged once per block; warp = (tile, part): tile warp / W, chunks [c_first, + CH).
    const int CHB = p.k / 128;
    const int W = kparts, part = warp % W;
    const int CH = CHB / W;
    const int c_first = part * CH;
    const int row0 = (int(blockIdx.y) * (nw / W) + warp / W) * 16;
    const bool active = row0 < n_total;
    const size_t row_bytes = size_t(p.k) / 2;
    const int groups_per_row = p.k / F::kGroup;

    const uint4* zero = reinterpret_cast<const uint4*>(qmma1_smem_raw);
    const size_t entries = size_t(CHB) * 16;                    // per token row
    uint4* xs = reinterpret_cast<uint4*>(qmma1_smem_raw + 32);  // [row][chunk][word * 4 + lane t]: digits 0, 1
    uint2* xs2 = reinterpret_cast<uint2*>(xs + R * entries);    // [row][chunk][word * 4 + lane t]: digit 2
    float2* xg = reinterpret_cast<float2*>(xs2 + R * entries);  // [row][group]
    float* ssw = reinterpret_cast<float*>(xg + R * size_t(CHB) * GPC);  // [row][warp] (nw + 1 per row)
    float* red = ssw + R * (nw + 1);                                     // [warp][row][MT][16]

    const uint8_t* wrow[MT][2];
    const uint16_t* srow[MT][2];
    const uint16_t* brow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int n = min(row0 + g + 8 * h, n_total - 1);  // rows past the last read the last row, never written
            const QuantMat& mat = p.mat[SWIGLU ? m : qmat_of(p, n)];
            wrow[m][h] = static_cast<const uint8_t*>(mat.q) + size_t(n) * row_bytes + size_t(c_first) * 64 + 16 * t;
            const size_t at = size_t(n) * groups_per_row + size_t(c_first) * GPC;
            srow[m][h] = static_cast<const uint16_t*>(mat.scales) + at;
            brow[m][h] = static_cast<const uint16_t*>(mat.biases) + at;
        }

    struct Round {
        uint4 w[U][MT][2];
    };
    auto load_round = [&](Round& r, int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u >= CH) break;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) r.w[u][m][h] = load_stream16(wrow[m][h] + size_t(c0 + u) * 64);
        }
    };
    // A span's scales and biases for this lane: rows g, g + 8 of each tile, the span's groups 2t and
    // 2t + 1 packed in one register (WIDE: one 32-bit load; else two 16-bit loads, as g128's rows
    // need not start 4-byte aligned).
    struct Params {
        uint32_t s[MT][2], b[MT][2];
    };
    auto load_params = [&](Params& q, int span) {
        const int gl = span * 8 + 2 * t;  // the warp's group
        const bool in0 = gl < CH * GPC, in1 = gl + 1 < CH * GPC;
        if constexpr (WIDE && GPC >= 2) {
            // gl and every row's first group are even, the tensors 4-byte aligned (launch_quant_mma1): one load.
            const auto ld = [](const uint16_t* at, bool in) { return in ? __ldg(reinterpret_cast<const unsigned int*>(at)) : 0u; };
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    q.s[m][h] = ld(srow[m][h] + gl, in0);
                    q.b[m][h] = ld(brow[m][h] + gl, in0);
                }
        } else {
            const auto ld = [](const uint16_t* at, bool in) { return in ? uint32_t(__ldg(reinterpret_cast<const unsigned short*>(at))) : 0u; };
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    q.s[m][h] = ld(srow[m][h] + gl, in0) | ld(srow[m][h] + gl + 1, in1) << 16;
                    q.b[m][h] = ld(brow[m][h] + gl, in0) | ld(brow[m][h] + gl + 1, in1) << 16;
                }
        }
    };

    Round ra, rb;
    Params pc, pn;
    if (active) {
        load_round(ra, 0);
        load_params(pc, 0);
        load_params(pn, 1);
    }
    // Where the next launch may start (qmma1_trigger): its blocks take SM slots this grid leaves free
    // and issue their own first weight loads while this one runs.
    if (trigger_at == PdlTrigger::start) pdl_trigger();
    pdl_wait();  // weights and scales never depend on an earlier kernel; x does
    if (trigger_at == PdlTrigger::after_wait) pdl_trigger();

    // Stage x once per block: entry (chunk, word wd, lane t) holds the 8 k of lane t's word wd
    // (qmma_word_k<SWAP>) as the B registers of one MMA per digit: bytes of k + 0, 2, 4, 6 (the low
    // nibbles' k), then of k + 1, 3, 5, 7. Thread e of a chunk stages the 8 k at qmma_word_k<kSwap>
    // (e % 4, e / 4) in either layout, so a group's LPG entries sit in consecutive lanes and its sums
    // (x, x^2, max |x|) are taken in the same order: only where the entry is stored differs.
    if (threadIdx.x < 8) reinterpret_cast<float*>(qmma1_smem_raw)[threadIdx.x] = 0.0f;
    float ss[R];  // folded RMSNorm: this thread's sum of x^2, per token row
#pragma unroll
    for (int r = 0; r < R; ++r) ss[r] = 0.0f;
    // Entry ent's 8 values of token row r's x (and of the norm weight), zero past the last chunk.
    auto load_entry = [&](int r, int ent, float4 (&xr)[2], float4 (&nr)[2]) {
        const int cl = ent / 16, e = ent % 16;
        xr[0] = xr[1] = nr[0] = nr[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (cl >= CHB) return;
        const int k = cl * 128 + qmma_word_k<F::kSwap>(e % 4, e / 4);
        const float* x = p.x + size_t(r) * p.k;
        xr[0] = __ldg(reinterpret_cast<const float4*>(x + k));
        xr[1] = __ldg(reinterpret_cast<const float4*>(x + k + 4));
        if constexpr (NORM) {
            nr[0] = __ldg(reinterpret_cast<const float4*>(p.norm_w + k));
            nr[1] = __ldg(reinterpret_cast<const float4*>(p.norm_w + k + 4));
        }
    };
    auto stage_entry = [&](int r, int ent, const float4 (&xr)[2], const float4 (&nr)[2]) {
        const int cl = ent / 16, e = ent % 16;
        const bool valid = cl < CHB;
        const int kc = qmma_word_k<F::kSwap>(e % 4, e / 4);  // k within the chunk, a multiple of 8
        // The entry that lane t' reads as its word wd' (k = 32 t' + 8 wd' without the transpose).
        const int slot = XPOSE ? ent : cl * 16 + (kc / 8 % 4) * 4 + kc / 32;
        float xv[8] = {xr[0].x, xr[0].y, xr[0].z, xr[0].w, xr[1].x, xr[1].y, xr[1].z, xr[1].w};
        if constexpr (NORM) {
            const float nv[8] = {nr[0].x, nr[0].y, nr[0].z, nr[0].w, nr[1].x, nr[1].y, nr[1].z, nr[1].w};
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                ss[r] = fmaf(xv[i], xv[i], ss[r]);
                xv[i] *= nv[i];
            }
        }
        float sum = 0.0f, mx = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            sum += xv[i];
            mx = fmaxf(mx, fabsf(xv[i]));
        }
#pragma unroll
        for (int o = 1; o < LPG; o *= 2) {
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        }
        // s = 2^(E - 6), max|x| < 2^E (E from the exponent bits; tiny groups clamped, their digits 0).
        const int E = max(int((__float_as_uint(mx) >> 23) & 0xff) - 126, -100);
        const float inv = __uint_as_float(uint32_t(127 + 20 - E) << 23);  // 2^14 / s
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = xv[i] * inv;  // exact: a power of two, |v| < 2^20
        const QDigits even = qdigits4(v[0], v[2], v[4], v[6]), odd = qdigits4(v[1], v[3], v[5], v[7]);
        if (valid) {
            xs[r * entries + slot] = make_uint4(even.d[0], odd.d[0], even.d[1], odd.d[1]);
            xs2[r * entries + slot] = make_uint2(even.d[2], odd.d[2]);
            // (sum of x, s 2^-14): the bias term's X_g and the digit sums' scale.
            if (e % LPG == 0)
                xg[r * size_t(CHB) * GPC + cl * GPC + e / LPG] = make_float2(sum, __uint_as_float(uint32_t(127 + E - 6 - 14) << 23));
        }
    };
    // The loop's bound is the same for every thread (ent - threadIdx.x), so the group shuffles see
    // whole warps; threads past the last chunk stage zeros and store nothing.
    if constexpr (XBATCH) {
        // Each thread's loads of XB entries issued together, then staged in order (the same sums in
        // the same order as one at a time): one wait on x per XB entries instead of one per entry
        // (XB = 4: more spills at 128 registers).
        // Token rows one after another, each in the one-row order.
        constexpr int XB = 4;
#pragma unroll 1
        for (int r = 0; r < R; ++r)
            for (int base = 0; base < CHB * 16; base += XB * int(blockDim.x)) {
                float4 xr[XB][2], nr[XB][2];
#pragma unroll
                for (int j = 0; j < XB; ++j)
                    if (base + j * int(blockDim.x) < CHB * 16) load_entry(r, base + j * blockDim.x + threadIdx.x, xr[j], nr[j]);
#pragma unroll
                for (int j = 0; j < XB; ++j)
                    if (base + j * int(blockDim.x) < CHB * 16) stage_entry(r, base + j * blockDim.x + threadIdx.x, xr[j], nr[j]);
            }
    } else {
        // One entry at a time (sessions 7-12; SCR_CUDA_QUANT_TC1_VARIANT=xone for A/B runs).
#pragma unroll 1
        for (int r = 0; r < R; ++r)
#pragma unroll 4
            for (int ent = threadIdx.x; ent - int(threadIdx.x) < CHB * 16; ent += blockDim.x) {
                float4 xr[2], nr[2];
                load_entry(r, ent, xr, nr);
                stage_entry(r, ent, xr, nr);
            }
    }
    if constexpr (NORM) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int o = 16; o >= 1; o /= 2) ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], o);
            if (lane == 0) ssw[r * (nw + 1) + warp] = ss[r];
        }
    }
    __syncthreads();

    float acc[R][MT][2];  // per token row: rows g, g + 8 of each tile over this lane's columns (groups 2t, 2t + 1) of every span
    int cg[R][3][MT][4];  // per token row, the span's C fragments, one per digit (independent MMA chains)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            acc[r][m][0] = acc[r][m][1] = 0.0f;
#pragma unroll
            for (int L = 0; L < 3; ++L)
#pragma unroll
                for (int e = 0; e < 4; ++e) cg[r][L][m][e] = 0;
        }
    auto flush = [&](int span) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int gl = span * 8 + 2 * t + j;  // the warp's group
            const float2 xgv = gl < CH * GPC ? xg[r * size_t(CHB) * GPC + c_first * GPC + gl] : make_float2(0.0f, 0.0f);
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    ST sv, bv;
                    sv.bits = uint16_t(pc.s[m][h] >> (16 * j));
                    bv.bits = uint16_t(pc.b[m][h] >> (16 * j));
                    const int e = 2 * h + j;
                    // sum q x over the group = s 2^-14 (C0 + 256 C1 + 65536 C2), formed exactly in int32
                    // (q <= 15, d0, d1 <= 255, d2 in [-16, 15], G <= 128: |.| <= 2.02e9 < 2^31) and
                    // rounded once (two integer ops and one conversion instead of three and two FMAs).
                    const float c = float(cg[r][0][m][e] + cg[r][1][m][e] * 256 + cg[r][2][m][e] * 65536);
                    acc[r][m][h] = fmaf(to_f32(sv), c * xgv.y, fmaf(to_f32(bv), xgv.x, acc[r][m][h]));
                }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
        for (int L = 0; L < 3; ++L)
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int e = 0; e < 4; ++e) cg[r][L][m][e] = 0;
        pc = pn;
        load_params(pn, span + 2);
    };
    auto mma_round = [&](const Round& r, int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u;
            if (c >= CH) break;
            uint32_t wq[MT][2][4];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) qchunk_words<SWAP>(r.w[u][m][h], t, wq[m][h]);
            const int col0 = (c % SPC) * GPC;
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                // This lane's B column is its word's group (transposed: word wd's; else lane t's).
                const int col = col0 + (XPOSE ? wd : t) / WPG;
                // Low nibbles (k + 0, 2, 4, 6) and high nibbles (k + 1, 3, 5, 7) as bytes: exact u8.
                // Formed once for all token rows (one row: next to its MMAs, as sessions 7-27: registers).
                uint32_t lo0[MT], hi0[MT], lo8[MT], hi8[MT];
                auto masks = [&](int m) {
                    lo0[m] = wq[m][0][wd] & 0x0f0f0f0fu, hi0[m] = (wq[m][0][wd] >> 4) & 0x0f0f0f0fu;
                    lo8[m] = wq[m][1][wd] & 0x0f0f0f0fu, hi8[m] = (wq[m][1][wd] >> 4) & 0x0f0f0f0fu;
                };
                if constexpr (R > 1) {
#pragma unroll
                    for (int m = 0; m < MT; ++m) masks(m);
                }
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    // PRED: 4 lanes load, their reads of consecutive entries.
                    uint4 b01 = make_uint4(0u, 0u, 0u, 0u);
                    uint2 b2 = make_uint2(0u, 0u);
                    if (!PRED || g == col) {
                        const size_t ent = r * entries + size_t(c_first + c) * 16 + wd * 4 + t;
                        b01 = g == col ? xs[ent] : zero[0];  // zero: 32 bytes
                        b2 = g == col ? xs2[ent] : *reinterpret_cast<const uint2*>(zero + 1);
                    }
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        if constexpr (R == 1) masks(m);
                        qmma_u8_16832<false>(cg[r][0][m], lo0[m], lo8[m], hi0[m], hi8[m], b01.x, b01.y);
                        qmma_u8_16832<false>(cg[r][1][m], lo0[m], lo8[m], hi0[m], hi8[m], b01.z, b01.w);
                        qmma_u8_16832<true>(cg[r][2][m], lo0[m], lo8[m], hi0[m], hi8[m], b2.x, b2.y);
                    }
                }
            }
            if (c % SPC == SPC - 1 || c == CH - 1) flush(c / SPC);
        }
    };
    if (active) {
#pragma unroll 1
        for (int c0 = 0; c0 < CH; c0 += 2 * U) {
            if (c0 + U < CH) load_round(rb, c0 + U);
            mma_round(ra, c0);
            if (c0 + U >= CH) break;
            if (c0 + 2 * U < CH) load_round(ra, c0 + 2 * U);
            mma_round(rb, c0 + U);
        }
    }
    if (trigger_at == PdlTrigger::after_loop) pdl_trigger();

    // Rows g, g + 8 over the 4 lanes t (their groups), then the tile's W parts in order.
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                acc[r][m][h] += __shfl_xor_sync(0xffffffffu, acc[r][m][h], 1);
                acc[r][m][h] += __shfl_xor_sync(0xffffffffu, acc[r][m][h], 2);
            }
    if (W > 1) {
        if (t == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    red[((warp * R + r) * MT + m) * 16 + g] = acc[r][m][0];
                    red[((warp * R + r) * MT + m) * 16 + g + 8] = acc[r][m][1];
                }
        }
        __syncthreads();
        if (part != 0 || !active || t != 0) return;
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                acc[r][m][0] = acc[r][m][1] = 0.0f;
                for (int q = 0; q < W; ++q) {
                    acc[r][m][0] += red[(((warp + q) * R + r) * MT + m) * 16 + g];
                    acc[r][m][1] += red[(((warp + q) * R + r) * MT + m) * 16 + g + 8];
                }
            }
    }
    if (!active || t != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float sq = 0.0f;  // the sum of x^2 over K: the warps' staging sums in order
        if constexpr (NORM)
            for (int w = 0; w < nw; ++w) sq += ssw[r * (nw + 1) + w];
        float inv = 1.0f;
        if constexpr (NORM) inv = 1.0f / sqrtf(sq / float(p.k) + p.eps);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int row = row0 + g + 8 * h;
            if (row >= n_total) continue;
            if constexpr (SWIGLU) {
                float gate = acc[r][0][h], up = acc[r][1][h];
                if constexpr (NORM) {
                    gate *= inv;
                    up *= inv;
                }
                p.mat[0].y[size_t(r) * p.mat[0].n + row] = silu(gate) * up;  // as silu_mul_kernel
            } else {
                const QuantMat& mat = p.mat[qmat_of(p, row)];
                float v = acc[r][0][h];
                if constexpr (NORM) v *= inv;
                if (mat.bias) v += mat.bias[row];
                const size_t at = size_t(r) * mat.n + row;
                if (p.residual) v = p.residual[at] + v;
                mat.y[at] = v;
            }
        }
    }
}

// What the kernel takes: an MLX int4 format with 2-byte scales, 1 to kQmma1MaxRows token rows, K in
// whole 128-k chunks, 16-byte aligned weights, x and norm weight.
template <class F>
bool quant_mma1_fits(const QuantFusedArgs& a) {
    if constexpr (!F::kAffine) {
        return false;
    } else {
        const auto aligned = [](const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
        if (a.rows < 1 || a.rows > kQmma1MaxRows || a.k % 128 != 0 || sizeof(typename F::Scale) != 2 || !aligned(a.x, 16) ||
            (a.norm_w && !aligned(a.norm_w, 16)))
            return false;
        for (int m = 0; m < a.nmat; ++m)
            if (!aligned(a.mat[m].q, 16) || !aligned(a.mat[m].scales, 2) || !aligned(a.mat[m].biases, 2)) return false;
        return true;
    }
}

// Warps of quant_mma1_kernel resident on the GPU in blocks of kMma1Warps (registers decide;
// shared memory is checked per launch).
template <class F, bool SWIGLU, bool NORM, bool WIDE, bool XPOSE, bool XBATCH, bool PRED>
int qmma1_resident_warps() {
    static const int warps = [] {
        int blocks = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, quant_mma1_kernel<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED>, kMma1Warps * kWarp, 0);
        return std::max(1, device_sm_count() * blocks * kMma1Warps);
    }();
    return warps;
}

// The split of the last one-row tensor-core launch on this thread (the test prints it): row tiles
// per block x parts of K per tile.
inline QMmaSplit& qmma1_last_split() {
    static thread_local QMmaSplit s;
    return s;
}

// Parts of K per row tile (W; the block holds 8 / W tiles): the most parts (whole chunks each) with
// which the launch's warps still fit in one wave of the GPU's resident warps, or W = 1. Sessions
// 7-11 took the fewest parts that gave ~4/5 of the resident warps; where that overshot one wave
// (the 8B's grouped QKV, 6144 x 4096: W = 8, 1.45 waves) W / 2 is faster (11.7 -> 9.6 us); at every
// other Llama shape the two rules agree (docs/CUDA.md "Session 12"). Depends on the shape only.
inline int qmma1_parts(int row_tiles, int chunks, int resident_warps) {
    for (int w = kMma1Warps; w > 1; w /= 2)
        if (chunks % w == 0 && int64_t(row_tiles) * w <= resident_warps) return w;
    return 1;
}
// The sessions 7-11 rule, for A/B runs (SCR_CUDA_QUANT_TC1_PARTS=fifths).
inline int qmma1_parts_fifths(int row_tiles, int chunks, int resident_warps) {
    int w = 1;
    while (w < kMma1Warps && int64_t(row_tiles) * w * 5 < int64_t(resident_warps) * 4 && chunks % (2 * w) == 0) w *= 2;
    return w;
}

// SCR_CUDA_QUANT_TC1_PARTS=W (1, 2, 4, 8; 16 in 16-warp blocks, default form only) replaces the
// rule above, for A/B runs (a row's bits depend on W); =fifths (returned as -1) selects the earlier rule.
inline int qmma1_parts_override() {
    static const int v = [] {
        const char* e = std::getenv("SCR_CUDA_QUANT_TC1_PARTS");
        if (e && std::strcmp(e, "fifths") == 0) return -1;
        return int(env_int_switch(  // 16: 16-warp blocks only
            "SCR_CUDA_QUANT_TC1_PARTS", 0, [](long long w) { return w == 1 || w == 2 || w == 4 || w == 8 || w == 16; },
            "1, 2, 4, 8, 16 or fifths", "the rule"));
    }();
    return v;
}

// SCR_CUDA_QUANT_TC1_VARIANT selects an earlier form of the kernel for A/B runs, all with the same
// bits: narrow2 the 16-bit scale loads (the default, wide2, loads a span's scales and biases 32 bits
// at a time where the group size allows: g32, g64); xpose the lane transpose of the weight words
// (sessions 7-11; 32-bit scale loads); xone the x staging one entry at a time everywhere (sessions
// 7-12), each with PRED; zero every lane's x loads, the lanes of other columns from a zero block
// (sessions 7-23; see PRED). docs/CUDA.md "Session 10", "Session 12", "Session 13" and "Session 24" have the measurements.
enum class QMma1Variant { wide2, narrow2, xpose, xone, zero };
inline QMma1Variant qmma1_variant() {
    static const QMma1Variant v = env_choice_switch("SCR_CUDA_QUANT_TC1_VARIANT", QMma1Variant::wide2,
                                                    {{"wide2", QMma1Variant::wide2},
                                                     {"narrow2", QMma1Variant::narrow2},
                                                     {"xpose", QMma1Variant::xpose},
                                                     {"xone", QMma1Variant::xone},
                                                     {"zero", QMma1Variant::zero}},
                                                    "wide2");
    return v;
}

// Warps per block (the kernel's BW). 16 for the one-matrix launches whose grid of 8-warp blocks fits
// in one wave: their 16 / W row tiles share one staging of x (half the L2 reads of x and staging
// work per SM), and a grid of up to one block per SM leaves the other SMs to the next launch's
// blocks, which start after this launch's pdl_wait (PdlTrigger::after_wait) and issue their first
// weight loads while it runs. 8 for grids of more than one wave (lm_head) and for SwiGLU launches
// whose 8-warp grid fills the SMs evenly (the 1B's gate/up), which measured slower in 16-warp
// blocks; 16 for SwiGLU grids that would leave an SM in 8 with one block (the 8B's gate/up, 224
// blocks on 132 SMs) (docs/CUDA.md "Session 20").
// The rule is qmma1_block_shape below; SCR_CUDA_QUANT_TC1_BLOCK=8|16 forces one size (A/B runs).
inline int qmma1_block_warps_override() {
    static const int v =
        int(env_int_switch("SCR_CUDA_QUANT_TC1_BLOCK", 0, [](long long w) { return w == 8 || w == 16; }, "8 or 16", "the rule"));
    return v;
}
// A launch whose 8-warp grid is at most one block per SM (W = 8 and few row tiles: the 1B's down,
// 2048 x 8192) takes W = 16 in 16-warp blocks, one row tile each, where every warp still gets 4+
// chunks of K: all 16 warps of every SM it uses, instead of two tiles of W = 8 on half the SMs
// (1B MLX int4 0.509 -> 0.482 ms per token; docs/CUDA.md "Session 20"). A row's bits change with
// W. SCR_CUDA_QUANT_TC1_W16=0 keeps W = 8 (A/B runs).
inline bool qmma1_w16() {
    static const bool on = env_flag_switch("SCR_CUDA_QUANT_TC1_W16", true);
    return on;
}

// SCR_CUDA_QUANT_TC1_FILL=0 turns off qmma1_block_shape's fill (A/B runs; a row's bits change
// only where the block size enters them: the folded norm's sum of x^2).
inline bool qmma1_fill() {
    static const bool on = env_flag_switch("SCR_CUDA_QUANT_TC1_FILL", true);
    return on;
}

// Block shape and parts of K of one launch of the default form (the only one with a 16-warp
// instance): warps per block (the kernel instance: 8 or 16), row tiles per block (T) and parts of K
// per tile (W); a block runs T x W <= warps warps. parts: the rule's or the forced W
// (SCR_CUDA_QUANT_TC1_PARTS; 16 only in 16-warp blocks). A forced W or block size
// (SCR_CUDA_QUANT_TC1_BLOCK) takes that shape as it is: no W = 16, no fill.
struct QMma1Block {
    int warps, parts, tiles;
};
inline QMma1Block qmma1_block_shape(bool swiglu, int parts, bool parts_forced, int row_tiles, int chunks, int sms) {
    if (parts > kMma1Warps) return {16, parts, 16 / parts};
    const int blocks8 = ceil_div(row_tiles, kMma1Warps / parts);
    if (const int forced = qmma1_block_warps_override()) return {forced, parts, forced / parts};
    const int warps = blocks8 > 2 * sms ? 8 : !swiglu || blocks8 < 2 * sms - sms / 8 ? 16 : 8;
    if (warps == 8 || parts_forced) return {warps, parts, warps / parts};
    if (!swiglu && qmma1_w16() && parts == kMma1Warps && blocks8 <= sms && chunks % 16 == 0 && chunks >= 64)
        return {16, 16, 1};
    // Fill: where 16-warp blocks of 16 / W row tiles leave SMs idle (the 8B's grouped QKV: 96 blocks
    // of 4 tiles x W 4 on 132 SMs; its gate/up 112 of 8 x 2), blocks of fewer tiles at the same W
    // spread the row tiles over more SMs (128 blocks of 3 x 4 and 7 x 2): 8B MLX int4 2.108 -> 2.077
    // ms per token, QKV 11.25 -> 10.6 us. Growing W to refill the block (3 x 5) and halving W were
    // slower (docs/CUDA.md "Session 21").
    const int tiles = qmma1_fill() ? std::min(16 / parts, ceil_div(row_tiles, sms)) : 16 / parts;
    return {16, parts, tiles};
}

template <class F, bool SWIGLU, bool NORM, bool WIDE, bool XPOSE, bool XBATCH, bool PRED, int BW, int R = 1>
bool launch_quant_mma1_bw(const Ctx& c, const QuantFusedArgs& a, int tiles_per_block, int parts, int row_tiles, int chunks) {
    const int warps = tiles_per_block * parts;  // <= BW
    const size_t smem = qmma1_smem<F, SWIGLU>(warps, chunks, R);
    static const int smem_max = [] {
        int dev = 0, v = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        cudaFuncSetAttribute(quant_mma1_kernel<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED, BW, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, v);
        return v;
    }();
    if (smem > size_t(smem_max)) return false;
    qmma1_last_split() = QMmaSplit{tiles_per_block, parts};
    launch_smem(c, quant_mma1_kernel<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED, BW, R>, dim3(1, ceil_div(row_tiles, tiles_per_block)),
                dim3(warps * kWarp), smem, a, parts, qmma1_trigger());
    return true;
}

// The block shape's kernel instance for a.rows token rows (1 to kQmma1MaxRows; the caller checked).
template <class F, bool SWIGLU, bool NORM, bool WIDE, bool XPOSE, bool XBATCH, bool PRED, int BW>
bool launch_quant_mma1_rows(const Ctx& c, const QuantFusedArgs& a, int tiles_per_block, int parts, int row_tiles, int chunks) {
    static_assert(kQmma1MaxRows == 2, "one instance per row count below");
    // One row only: the A/B form of sessions 7-23, and SwiGLU (its two-row form would need 196
    // registers; quant_swiglu_grouped runs those rows as a grouped launch instead).
    if constexpr (!PRED || SWIGLU) {
        if (a.rows != 1) return false;
        return launch_quant_mma1_bw<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED, BW, 1>(c, a, tiles_per_block, parts, row_tiles, chunks);
    } else {
        if (a.rows == 1)
            return launch_quant_mma1_bw<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED, BW, 1>(c, a, tiles_per_block, parts, row_tiles, chunks);
        if (a.rows == 2)
            return launch_quant_mma1_bw<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED, BW, 2>(c, a, tiles_per_block, parts, row_tiles, chunks);
        return false;
    }
}

// Launches the kernel for a.rows token rows; false (nothing launched) when its shared memory would
// not fit, and for 2 rows of SwiGLU or of an A/B form (one row only).
template <class F, bool SWIGLU, bool NORM, bool WIDE, bool XPOSE, bool XBATCH = kQmma1XBatch<SWIGLU, NORM>, bool PRED = !XPOSE>
bool launch_quant_mma1_v(const Ctx& c, const QuantFusedArgs& a) {
    int n_total = a.mat[0].n;
    if (!SWIGLU)
        for (int m = 1; m < a.nmat; ++m) n_total += a.mat[m].n;
    const int row_tiles = ceil_div(n_total, 16);
    const int chunks = a.k / 128;
    const int forced = qmma1_parts_override();
    const int resident = qmma1_resident_warps<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED>();
    const int parts = forced > 0 && chunks % forced == 0 ? forced
                      : forced < 0                       ? qmma1_parts_fifths(row_tiles, chunks, resident)
                                                         : qmma1_parts(row_tiles, chunks, resident);
    // Only the default form has the 16-warp instance (the others exist for A/B runs of sessions 7-13).
    // Several token rows: the default form only (PRED), in the one-row launch's block shape (the same bits).
    if constexpr ((WIDE || QMma1Shape<F>::GPC < 2) && !XPOSE && XBATCH == kQmma1XBatch<SWIGLU, NORM>) {
        const QMma1Block b = qmma1_block_shape(SWIGLU, parts, forced != 0, row_tiles, chunks, qsmem_sms());
        if (b.warps == 16) return launch_quant_mma1_rows<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED, 16>(c, a, b.tiles, b.parts, row_tiles, chunks);
        return launch_quant_mma1_rows<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED, kMma1Warps>(c, a, b.tiles, b.parts, row_tiles, chunks);
    }
    if (a.rows != 1) return false;
    // W = 16 needs 16-warp blocks: the A/B forms fall back to the rule's W.
    const int w = parts > kMma1Warps ? qmma1_parts(row_tiles, chunks, resident) : parts;
    return launch_quant_mma1_bw<F, SWIGLU, NORM, WIDE, XPOSE, XBATCH, PRED, kMma1Warps>(c, a, kMma1Warps / w, w, row_tiles, chunks);
}

template <class F, bool SWIGLU, bool NORM>
bool launch_quant_mma1(const Ctx& c, const QuantFusedArgs& a) {
    if constexpr (QMma1Shape<F>::GPC >= 2) {
        bool aligned4 = true;  // the 32-bit scale loads need 4-byte aligned scales and biases
        for (int m = 0; m < a.nmat; ++m)
            aligned4 = aligned4 && reinterpret_cast<uintptr_t>(a.mat[m].scales) % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(a.mat[m].biases) % 4 == 0;
        if (aligned4 && qmma1_variant() == QMma1Variant::wide2) return launch_quant_mma1_v<F, SWIGLU, NORM, true, false>(c, a);
        if (aligned4 && qmma1_variant() == QMma1Variant::xpose) return launch_quant_mma1_v<F, SWIGLU, NORM, true, true>(c, a);
        if (aligned4 && qmma1_variant() == QMma1Variant::xone) return launch_quant_mma1_v<F, SWIGLU, NORM, true, false, false>(c, a);
        if (aligned4 && qmma1_variant() == QMma1Variant::zero)
            return launch_quant_mma1_v<F, SWIGLU, NORM, true, false, kQmma1XBatch<SWIGLU, NORM>, false>(c, a);
    }
    if (qmma1_variant() == QMma1Variant::zero) return launch_quant_mma1_v<F, SWIGLU, NORM, false, false, kQmma1XBatch<SWIGLU, NORM>, false>(c, a);
    return launch_quant_mma1_v<F, SWIGLU, NORM, false, false>(c, a);
}

}  // namespace scr::kernels::cuda::qdetail
