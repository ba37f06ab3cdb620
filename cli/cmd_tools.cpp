// `scr make-random CONFIG OUT_DIR`: a random-weight checkpoint of any compiled config's shapes
// (for benchmarks of real model sizes with no download).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/thread_pool.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/weights/safetensors_writer.hpp"

namespace scr::cli {
namespace {

namespace fs = std::filesystem;

// splitmix64's finalizer: a counter-based generator (element i of a stream is mix64(key + (i+1) * golden)).
inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Unit-variance, zero-mean, bell-shaped (Irwin-Hall: the sum of four 16-bit uniforms; tails end at
// 3.46 sigma). Random weights only need the scale; std::normal_distribution cost ~10x more.
inline float approx_normal(uint64_t bits) {
    const uint32_t sum = uint32_t(bits & 0xffff) + uint32_t((bits >> 16) & 0xffff) + uint32_t((bits >> 32) & 0xffff) +
                         uint32_t(bits >> 48);
    return (float(sum) - 131070.0f) * (1.7320508f / 65536.0f);
}

void setup(CLI::App& app) {
    auto* c = app.add_subcommand("make-random", "write a random-weight model (config.json + model.safetensors) for a compiled config");
    auto config = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto dtype = std::make_shared<std::string>("bf16");
    auto seed = std::make_shared<uint64_t>(1);
    c->add_option("config", *config, "a config.json compiled into this binary")->required();
    c->add_option("out", *out, "output folder")->required();
    c->add_option("--dtype", *dtype, "checkpoint dtype")->check(CLI::IsMember({"bf16", "f32", "f16"}));
    c->add_option("--seed", *seed, "random seed");
    c->callback([=] {
        std::ifstream in(*config);
        if (!in) fail("cannot read {}", *config);
        nlohmann::json cfg;
        try {
            cfg = nlohmann::json::parse(in);
        } catch (const nlohmann::json::exception& e) {
            fail("{}: malformed JSON ({})", *config, e.what());
        }
        const ModelEntry& entry = select_specialization(cfg, *config);
        const DType dt = *dtype_from_name(*dtype);
        cfg["torch_dtype"] = *dtype == "bf16" ? "bfloat16" : *dtype == "f16" ? "float16" : "float32";
        fs::create_directories(*out);
        std::ofstream(fs::path(*out) / "config.json") << cfg.dump(2) << "\n";
        std::vector<TensorToWrite> tensors;
        uint64_t index = 0;
        for (auto& spec : entry.info->tensors) {
            TensorToWrite t;
            t.name = std::string(spec.name);
            t.dtype = dt;
            t.shape.assign(spec.shape, spec.shape + spec.rank);
            const bool vector = spec.rank == 1;
            const double scale = vector ? 0.1 : 1.0 / std::sqrt(double(spec.shape[spec.rank - 1]));
            const uint64_t key = mix64((*seed << 20) + index++);
            t.fill = [=](std::byte* bytes, size_t size) {
                const int64_t n = int64_t(size / size_t(dtype_bytes(dt)));
                const float offset = vector ? 1.0f : 0.0f;  // norm weights around 1
                // Element i depends on (seed, tensor, i) alone: reproducible whatever the thread
                // count or the pool's split, and cheap enough (~2 ns of CPU) that 61 GB takes seconds.
                ThreadPool::global().parallel_for(n, [&](int64_t b, int64_t e, int) {
                    for (int64_t i = b; i < e; ++i) {
                        const float v = float(scale) * approx_normal(mix64(key + uint64_t(i + 1) * 0x9e3779b97f4a7c15ull)) + offset;
                        if (dt == DType::f32) reinterpret_cast<float*>(bytes)[i] = v;
                        else if (dt == DType::bf16) reinterpret_cast<uint16_t*>(bytes)[i] = f32_to_bf16(v);
                        else reinterpret_cast<uint16_t*>(bytes)[i] = f32_to_f16(v);
                    }
                }, int64_t(1) << 16);
            };
            tensors.push_back(std::move(t));
        }
        const auto t0 = std::chrono::steady_clock::now();
        write_safetensors(fs::path(*out) / "model.safetensors", tensors, [](size_t done, size_t total) {
            if (done * 100 / total != (done - 1) * 100 / total)  // at most 100 updates (a MoE has ~19k tensors)
                fmt::print(stderr, "\rwriting tensors {}/{}", done, total);
            if (done == total) fmt::print(stderr, "\n");
        });
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double gb = double(fs::file_size(fs::path(*out) / "model.safetensors")) / 1e9;
        fmt::print("wrote {} ({} tensors of {}, {:.2f} GB in {:.1f} s = {:.2f} GB/s, {} threads)\n", *out, tensors.size(),
                   entry.info->stem, gb, seconds, gb / seconds, ThreadPool::global().size());
    });
}

CommandRegistrar reg(&setup);

}  // namespace
}  // namespace scr::cli
