// scrc: the Scratchy compiler. Reads (architecture DSL, config.json, quant preset) and writes the
// specialized model source for one target. Run by CMake at build time (cmake/ScrModels.cmake).
//
//   scrc gen --arch-dir models/arch --config C.json --quant Q.json --target cpu --stem S --out F.cpp
//   scrc plan <same as gen, no --out>            print the plan
//   scrc registry --out R.cpp SYMBOL...           the table of compiled specializations
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compiler/bind/binder.hpp"
#include "compiler/dsl/parser.hpp"
#include "compiler/passes/passes.hpp"
#include "compiler/targets/emit.hpp"
#include "compiler/targets/spyre_emitter.hpp"
#include "runtime/core/error.hpp"

namespace fs = std::filesystem;
using namespace scr;

namespace {

nlohmann::json read_json(const std::string& path) {
    std::ifstream in(path);
    if (!in) fail("cannot read {}", path);
    try {
        return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        fail("{}: malformed JSON: {}", path, e.what());
    }
}

dsl::Program select_arch(const std::string& arch_dir, const nlohmann::json& config, const std::string& config_path) {
    std::string want;
    if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
        config["architectures"][0].is_string())
        want = config["architectures"][0].get<std::string>();
    else
        fail("{}: config.json has no \"architectures\" list naming the model class", config_path);
    std::vector<std::string> served;
    std::vector<fs::path> files;
    for (auto& e : fs::directory_iterator(arch_dir))
        if (e.path().extension() == ".scr") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
        dsl::Program p = dsl::parse_file(f.string());
        for (auto& a : p.hf_architectures) {
            if (a == want) return p;
            served.push_back(a);
        }
    }
    fail("{}: no architecture in {} serves {} (served: {})", config_path, arch_dir, want, fmt::join(served, ", "));
}

void write_if_changed(const std::string& path, const std::string& text) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
        std::stringstream ss;
        ss << in.rdbuf();
        if (ss.str() == text) return;
    }
    fs::path p(path);
    if (p.has_parent_path()) fs::create_directories(p.parent_path());
    std::ofstream out(path, std::ios::binary);
    if (!out) fail("cannot write {}", path);
    out << text;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"scrc: compiles (architecture, config.json, quant preset) into a specialized model for one target"};
    app.require_subcommand(1);
    std::string arch_dir, config_path, quant_path, target = "cpu", stem, out;
    int64_t spyre_scratchpad_bytes = 1677721;  // usable LX per Spyre core (kernels/spyre/plan.hpp)
    bind::BuildParams params;
    std::vector<std::string> symbols;
    auto add_model_opts = [&](CLI::App* c) {
        c->add_option("--arch-dir", arch_dir, "folder of *.scr architecture files")->required();
        c->add_option("--config", config_path, "the model's config.json")->required();
        c->add_option("--quant", quant_path, "quant preset JSON")->required();
        c->add_option("--target", target, "cpu | cuda | spyre")->check(CLI::IsMember({"cpu", "cuda", "spyre"}));
        c->add_option("--spyre-scratchpad-bytes", spyre_scratchpad_bytes, "spyre: usable scratchpad bytes per core");
        c->add_option("--stem", stem, "name of the specialization (default: the config file's stem)");
        c->add_option("--block-size", params.block_size, "KV block size in tokens")->check(CLI::Range(1, 1024));
        c->add_option("--max-batch-tokens", params.max_batch_tokens, "most tokens per forward")->check(CLI::Range(1, 1 << 20));
        c->add_option("--max-logit-rows", params.max_logit_rows, "most logit rows per forward")->check(CLI::Range(1, 1 << 16));
    };
    auto* gen = app.add_subcommand("gen", "write the specialized source");
    add_model_opts(gen);
    gen->add_option("--out", out, "output .cpp")->required();
    auto* plan = app.add_subcommand("plan", "print the plan");
    add_model_opts(plan);
    auto* reg = app.add_subcommand("registry", "write the table of specializations");
    reg->add_option("--out", out, "output .cpp")->required();
    reg->add_option("symbols", symbols, "specialization symbols");

    CLI11_PARSE(app, argc, argv);
    try {
        if (reg->parsed()) {
            write_if_changed(out, emit::emit_registry(symbols));
            return 0;
        }
        if (params.max_logit_rows > params.max_batch_tokens) params.max_logit_rows = params.max_batch_tokens;
        auto config = read_json(config_path);
        if (stem.empty()) stem = fs::path(config_path).stem().string();
        auto preset = quant::load_preset(quant_path);
        // The CUDA emitter checks the format itself (MLX int4, int8 and fp8 run there; others are refused by name).
        if (preset.quantized() && target != "cpu" && target != "cuda")
            fail("quant preset {}: quantized weight formats are implemented for the cpu and cuda targets only so far (not {})",
                 preset.name, target);
        auto program = select_arch(arch_dir, config, config_path);
        auto bound = bind::bind(program, config, config_path, stem, preset, params);
        passes::fuse(bound.graph);
        passes::plan_memory(bound.graph, params.max_batch_tokens, params.max_logit_rows);
        if (plan->parsed()) {
            if (target == "spyre") fmt::print("{}", emit::spyre_plan_report(bound, spyre_scratchpad_bytes));
            else fmt::print("{}", emit::plan_text(bound, emit::sizes_of(bound)));
            return 0;
        }
        if (target == "spyre") write_if_changed(out, emit::emit_spyre(bound, spyre_scratchpad_bytes));
        else write_if_changed(out, target == "cuda" ? emit::emit_cuda(bound) : emit::emit_cpu(bound));
        fmt::print("{}\n", emit::symbol_for(bound, target));
    } catch (const Error& e) {
        fmt::print(stderr, "scrc: error: {}\n", e.what());
        return 1;
    }
    return 0;
}
