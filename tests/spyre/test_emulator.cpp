// The emulator's own guarantees: a scratchpad of exactly the budget, buffers at their planned
// offsets, every access and every DMA checked (stick alignment, the buffer, the device region),
// fp16 conversions that round as IEEE binary16 does, and errors on a core surfacing to the caller.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "kernels/spyre/ops.hpp"

namespace sp = scr::kernels::spyre;

namespace {

scr::ThreadPool& pool() {
    static scr::ThreadPool p(2);
    return p;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const scr::Error& e) {
        return e.what();
    }
    return "";
}

constexpr sp::NormPlan kPlan{.rows_max = 64, .row = {.groups = 1, .group = 100}, .cores = 4, .tile_rows = 3};

TEST(SpyreMachine, ConstantsAreThePublicModel) {
    EXPECT_EQ(sp::kCores, 32);
    EXPECT_EQ(sp::kStickBytes, 128);
    EXPECT_EQ(sp::kStickHalves, 64);
    EXPECT_EQ(sp::kLxPhysicalBytes, 2097152);
    EXPECT_EQ(sp::kLxUsableBytes, 1677721);  // the seed's figure: floor(0.8 * 2 MiB)
    EXPECT_EQ(sp::kLxUsableBytes, int64_t(0.8 * 2097152));
}

TEST(SpyreMachine, PlanLayoutIsDerivedFromTheTile) {
    // weight: pad(100) = 128 halves = 256 B; in/out: 3 rows x 256 B, double-buffered.
    EXPECT_EQ(kPlan.buffer(sp::NormPlan::weight).bytes, 256);
    EXPECT_EQ(sp::lx_offset(kPlan, sp::NormPlan::in, 0), 256);
    EXPECT_EQ(sp::lx_offset(kPlan, sp::NormPlan::in, 1), 256 + 768);
    EXPECT_EQ(sp::lx_offset(kPlan, sp::NormPlan::out, 0), 256 + 2 * 768);
    EXPECT_EQ(sp::resident_bytes(kPlan), 256 + 4 * 768);
    EXPECT_TRUE(sp::buffers_stick_aligned(kPlan));
    EXPECT_TRUE(kPlan.valid());
    sp::NormPlan too_many_cores = kPlan;
    too_many_cores.cores = 33;
    EXPECT_FALSE(too_many_cores.valid());
    sp::NormPlan tile_too_tall = kPlan;
    tile_too_tall.tile_rows = 17;  // a core owns at most ceil(64 / 4) = 16 rows
    EXPECT_FALSE(tile_too_tall.valid());
}

TEST(SpyreMachine, ViewsAreBoundsChecked) {
    sp::Core core(0, sp::resident_bytes(kPlan));
    auto in = core.buf<uint16_t>(kPlan, sp::NormPlan::in, 1);
    EXPECT_EQ(in.count(), 3 * 128);
    EXPECT_NO_THROW(in.span(0, 3 * 128));
    const std::string e = error_of([&] { in.span(3 * 128 - 2, 3); });
    EXPECT_NE(e.find("LX buffer 'in'"), std::string::npos) << e;
    EXPECT_NE(e.find("[382, 385)"), std::string::npos) << e;
    EXPECT_NE(error_of([&] { in.at(-1); }), "");
}

TEST(SpyreMachine, ScratchpadIsExactlyTheBudget) {
    // One byte less than the plan's resident bytes: its last buffer no longer fits.
    sp::Core core(3, sp::resident_bytes(kPlan) - 1);
    EXPECT_NO_THROW(core.buf<uint16_t>(kPlan, sp::NormPlan::out, 0));
    const std::string e = error_of([&] { core.buf<uint16_t>(kPlan, sp::NormPlan::out, 1); });
    EXPECT_NE(e.find("outside the"), std::string::npos) << e;
    EXPECT_NE(e.find("spyre core 3"), std::string::npos) << e;
}

TEST(SpyreMachine, DmaMovesWholeAlignedSticksInsideTheRegion) {
    sp::Device dev(4096, sp::resident_bytes(kPlan), pool());
    sp::Core& c = dev.core(0);
    auto in = c.buf<uint16_t>(kPlan, sp::NormPlan::in, 0);
    const sp::DevRegion r = dev.region(1024, 1024, "test tensor");
    EXPECT_NO_THROW(c.load(in, 0, r, 128, 512));
    EXPECT_EQ(c.bytes_loaded(), 512);
    EXPECT_NE(error_of([&] { c.load(in, 0, r, 64, 128); }).find("aligned"), std::string::npos);  // misaligned source
    EXPECT_NE(error_of([&] { c.load(in, 0, r, 0, 100); }).find("sticks"), std::string::npos);    // partial stick
    EXPECT_NE(error_of([&] { c.load(in, 32, r, 0, 128); }).find("aligned"), std::string::npos);  // misaligned LX
    EXPECT_NE(error_of([&] { c.load(in, 0, r, 896, 256); }).find("outside 'test tensor'"), std::string::npos);
    EXPECT_NE(error_of([&] { c.load(in, 320, r, 0, 256); }).find("LX buffer 'in'"), std::string::npos);  // past the buffer
    EXPECT_NE(error_of([&] { c.store(r, 0, in, 0, 1024); }).find("LX buffer 'in'"), std::string::npos);
    EXPECT_NE(error_of([&] { dev.region(4000, 200, "x"); }).find("outside"), std::string::npos);
}

TEST(SpyreMachine, IndexLoadsCoverAnUnalignedRange) {
    sp::Device dev(4096, 4096, pool());
    auto* ids = reinterpret_cast<int32_t*>(dev.host_view(0));
    for (int i = 0; i < 256; ++i) ids[i] = 1000 + i;
    constexpr sp::EmbedPlan p{.rows_max = 256, .row = {.groups = 1, .group = 64}, .cores = 1, .tile_rows = 5};
    auto v = dev.core(0).buf<int32_t>(p, sp::EmbedPlan::ids, 0);
    const int64_t at = dev.core(0).load_index(v, dev.region(0, 1024, "ids"), 30, 5);  // rows 30..34 cross a stick
    for (int i = 0; i < 5; ++i) EXPECT_EQ(v.at(at + i), 1030 + i);
}

TEST(SpyreMachine, Fp16RoundsLikeIeeeBinary16) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = scr::f16_to_f32(uint16_t(h));
        if (std::isnan(f)) continue;
        ASSERT_EQ(sp::h2f(uint16_t(h)), f) << h;
        ASSERT_EQ(sp::f2h(f), uint16_t(h)) << h;
    }
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> ud(-70000.0f, 70000.0f);
    for (int i = 0; i < 100000; ++i) {
        const float f = ud(rng) * (i % 2 ? 1.0f : 1e-6f);
        ASSERT_EQ(sp::f2h(f), scr::f32_to_f16(f)) << f;
    }
    EXPECT_EQ(sp::f2h(1.0f + 1.0f / 2048), sp::f2h(1.0f));  // a tie rounds to even
    EXPECT_EQ(sp::h2f(sp::f2h(65520.0f)), std::numeric_limits<float>::infinity());
}

TEST(SpyreMachine, DotProductIsExactOnSmallIntegers) {
    std::vector<uint16_t> a(200), b(200);
    double want = 0;
    for (int i = 0; i < 200; ++i) {
        a[size_t(i)] = sp::f2h(float(i % 7 - 3));
        b[size_t(i)] = sp::f2h(float(i % 5 - 2));
        want += double(i % 7 - 3) * (i % 5 - 2);
    }
    for (int n : {1, 7, 8, 9, 64, 199, 200}) {
        double w = 0;
        for (int i = 0; i < n; ++i) w += double(i % 7 - 3) * (i % 5 - 2);
        EXPECT_EQ(sp::dot_f16(a.data(), b.data(), n), float(w)) << n;
    }
}

TEST(SpyreMachine, AnErrorOnOneCoreReachesTheCaller) {
    sp::Device dev(4096, 4096, pool());
    const std::string e = error_of([&] {
        dev.run(32, [&](sp::Core& c) {
            if (c.id() == 17) c.load(c.buf<uint16_t>(kPlan, sp::NormPlan::in), 0, dev.region(0, 128, "small"), 0, 256);
        });
    });
    EXPECT_NE(e.find("spyre core 17"), std::string::npos) << e;
}

TEST(SpyreMachine, DeviceRejectsBudgetsBeyondThePhysicalScratchpad) {
    EXPECT_NE(error_of([] { sp::Device d(4096, sp::kLxPhysicalBytes + 1, pool()); }).find("physical"), std::string::npos);
    EXPECT_NE(error_of([] { sp::Device d(4096, 0, pool()); }), "");
}

TEST(SpyreMachine, RowSplitCoversEveryRowOnce) {
    for (int64_t rows : {1, 5, 31, 32, 33, 100, 512})
        for (int cores : {1, 7, 32}) {
            std::vector<int> owner(size_t(rows), 0);
            const int used = sp::cores_for_rows(rows, cores);
            EXPECT_LE(used, cores);
            for (int c = 0; c < used; ++c) {
                auto r = sp::rows_of_core(rows, cores, c);
                EXPECT_LT(r.begin, r.end) << rows << " rows, core " << c;
                for (int64_t i = r.begin; i < r.end; ++i) ++owner[size_t(i)];
            }
            for (int v : owner) EXPECT_EQ(v, 1);
        }
}

}  // namespace
