// `scr make-random CONFIG OUT_DIR`: a random-weight checkpoint of any compiled config's shapes
// (for benchmarks of real model sizes with no download).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/thread_pool.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/weights/safetensors_writer.hpp"

namespace scr::cli {
namespace {

namespace fs = std::filesystem;

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
            const uint64_t stream = (*seed << 20) + index++;
            t.fill = [=](std::byte* bytes, size_t size) {
                const size_t n = size / size_t(dtype_bytes(dt));
                // Parallel fill, one generator per 64 Ki-element block: reproducible for a seed,
                // whatever the thread count or the way the pool splits the work.
                constexpr int64_t kBlock = 1 << 16;
                ThreadPool::global().parallel_for(int64_t(n), [&](int64_t b, int64_t e, int) {
                    for (int64_t block = b; block < e; block += kBlock) {
                        std::mt19937_64 rng(stream * 1000003 + uint64_t(block));
                        std::normal_distribution<float> dist(0.0f, float(scale));
                        for (int64_t i = block; i < std::min(e, block + kBlock); ++i) {
                            float v = dist(rng) + (vector ? 1.0f : 0.0f);
                            if (dt == DType::f32) reinterpret_cast<float*>(bytes)[i] = v;
                            else if (dt == DType::bf16) reinterpret_cast<uint16_t*>(bytes)[i] = f32_to_bf16(v);
                            else reinterpret_cast<uint16_t*>(bytes)[i] = f32_to_f16(v);
                        }
                    }
                }, kBlock);
            };
            tensors.push_back(std::move(t));
        }
        write_safetensors(fs::path(*out) / "model.safetensors", tensors, [](size_t done, size_t total) {
            fmt::print(stderr, "\rwriting tensors {}/{}", done, total);
            if (done == total) fmt::print(stderr, "\n");
        });
        fmt::print("wrote {} ({} tensors of {})\n", *out, tensors.size(), entry.info->stem);
    });
}

CommandRegistrar reg(&setup);

}  // namespace
}  // namespace scr::cli
