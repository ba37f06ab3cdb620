#include "runtime/model/loader.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "runtime/core/error.hpp"
#include "runtime/core/thread_pool.hpp"
#include "runtime/model/device_open.hpp"
#include "runtime/model/quant_match.hpp"
#include "runtime/weights/hf_cache.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/tokenizer.hpp"

namespace scr {

namespace fs = std::filesystem;
using nlohmann::json;

LoadedModel::LoadedModel() = default;
LoadedModel::LoadedModel(LoadedModel&&) noexcept = default;
LoadedModel& LoadedModel::operator=(LoadedModel&&) noexcept = default;
LoadedModel::~LoadedModel() = default;

bool LoadOptions::huge_pages_from_env() {
    const char* v = std::getenv("SCR_HUGE_PAGES");
    return !(v && std::string(v) == "0");  // on unless SCR_HUGE_PAGES=0
}

fs::path default_model_dir() {
    if (const char* env = std::getenv("SCR_DEFAULT_MODEL"); env && *env) return env;
#ifdef SCR_DEFAULT_MODEL_DIR
    return SCR_DEFAULT_MODEL_DIR;
#else
    fail("this build has no embedded default model; pass a model folder");
#endif
}

namespace {

json read_json_file(const fs::path& p, const char* what) {
    std::ifstream in(p);
    if (!in) fail("{}: cannot read {}", p.string(), what);
    try {
        return json::parse(in);
    } catch (const json::exception& e) {
        fail("{}: malformed JSON ({})", p.string(), e.what());
    }
}

// "" if the config has exactly the recorded value at `key`, else a description of the difference.
std::string config_difference(const json& config, const ConfigKey& key) {
    json::json_pointer ptr{std::string(key.path)};
    const bool has = config.contains(ptr);
    if (key.value_json.empty()) {
        if (!has) return "";
        return fmt::format("{} is {} here but absent in the compiled config", key.path.substr(1), config.at(ptr).dump());
    }
    json want = json::parse(key.value_json);
    if (!has) return fmt::format("{} is absent here but {} in the compiled config", key.path.substr(1), want.dump());
    if (config.at(ptr) == want) return "";
    return fmt::format("{} is {} here but {} in the compiled config", key.path.substr(1), config.at(ptr).dump(), want.dump());
}

std::string checkpoint_dtype_preset(const json& config) {
    // A field of another type (null, a number) counts as absent: config.json is untrusted input.
    auto string_field = [&](const char* key) {
        auto it = config.find(key);
        return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    std::string d = string_field("torch_dtype");
    if (d.empty()) d = string_field("dtype");
    if (d == "float32") return "f32";
    if (d == "bfloat16") return "bf16";
    if (d == "float16") return "f16";
    return "";
}

}  // namespace

std::string describe_compiled_models() {
    std::string s;
    for (auto& e : compiled_models())
        s += fmt::format("  {:<24} arch {:<10} quant {:<6} target {} ({})\n", e.info->stem, e.info->arch, e.info->quant,
                         e.info->target, e.info->hf_architecture);
    return s;
}

const ModelEntry& select_specialization(const json& config, const std::string& origin, const std::string& quant) {
    std::vector<const ModelEntry*> matches;
    std::string near;
    const json checkpoint_quant = checkpoint_quantization(config);
    std::string quant_refusal;  // why the explicitly requested preset does not serve this checkpoint
    for (auto& e : compiled_models()) {
        std::string diff;
        for (auto& k : e.info->config_keys) {
            diff = config_difference(config, k);
            if (!diff.empty()) break;
        }
        if (diff.empty()) {
            diff = quant_difference(checkpoint_quant, e.info->quant_config_json, e.info->quant);
            if (!diff.empty() && e.info->quant == quant) quant_refusal = diff;
        }
        if (diff.empty()) matches.push_back(&e);
        else if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
                 config["architectures"][0] == std::string(e.info->hf_architecture))
            near += fmt::format("\n  {} ({}): {}", e.info->stem, e.info->quant, diff);
    }
    if (!quant.empty() && !quant_refusal.empty())
        fail("{}: quant preset {} does not serve this checkpoint: {}", origin, quant, quant_refusal);
    if (matches.empty())
        fail("{}: this model's config matches no specialization compiled into this scr. Compiled in:\n{}{}{}\n"
             "Rebuild with -DSCR_MODELS=<path to this config.json>{} to add it.",
             origin, describe_compiled_models(), near.empty() ? "" : "Nearest (same architecture):", near,
             checkpoint_quant.is_null() ? "" : " and -DSCR_QUANT=<the preset of its quantization_config>");
    auto pick = [&](const std::string& q) -> const ModelEntry* {
        for (auto* m : matches)
            if (m->info->quant == q) return m;
        return nullptr;
    };
    if (!quant.empty()) {
        if (auto* m = pick(quant)) return *m;
        std::string have;
        for (auto* m : matches) have += std::string(have.empty() ? "" : ", ") + std::string(m->info->quant);
        fail("{}: no specialization with quant preset {} (this config is compiled with: {})", origin, quant, have);
    }
    if (auto* m = pick(checkpoint_dtype_preset(config))) return *m;
    return *matches.front();
}

LoadedModel load_model(const std::string& arg, const LoadOptions& options) {
    auto t0 = std::chrono::steady_clock::now();
    LoadedModel lm;
    lm.dir = arg.empty() ? default_model_dir() : resolve_model_path(arg);
    fs::path cfg = lm.dir / "config.json";
    if (!fs::exists(cfg)) fail("{}: no config.json in the model folder", lm.dir.string());
    lm.config = read_json_file(cfg, "config.json");
    if (!lm.config.is_object()) fail("{}: config.json must be a JSON object", cfg.string());
    lm.entry = &select_specialization(lm.config, cfg.string(), options.quant);
    if (options.threads > 0) ThreadPool::set_default_threads(options.threads);
    // An accelerator opens in the background from here (device_open.hpp) while the host work below
    // runs: the text files first, then mapping and checking the weights.
    DeviceOpenGuard device(lm.entry->info->target);
    if (fs::exists(lm.dir / "generation_config.json"))
        lm.generation_config = read_json_file(lm.dir / "generation_config.json", "generation_config.json");
    if (options.load_text && fs::exists(lm.dir / "tokenizer.json")) {
        lm.tokenizer = text::Tokenizer::load(lm.dir);
        if (fs::exists(lm.dir / "tokenizer_config.json") || fs::exists(lm.dir / "chat_template.jinja")) {
            try {
                lm.chat_template = text::ChatTemplate::load(lm.dir);
            } catch (const Error&) {
                lm.chat_template.reset();  // a tokenizer without a chat template is fine for completion
            }
        }
    }
    auto checkpoint = Checkpoint::open(lm.dir);
    // The huge-page copy speeds up CPU kernels streaming the weights; another target uploads them
    // once from the mapping, and a copy first would only double the start-up time.
    const bool huge_pages = options.huge_pages && lm.entry->info->target == "cpu";
    lm.weights = std::make_unique<WeightSet>(lm.entry->info->tensors, checkpoint, lm.entry->info->stem, huge_pages,
                                             mlx_router_overrides(checkpoint_quantization(lm.config)));
    lm.model = lm.entry->create(*lm.weights, ThreadPool::global());
    lm.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return lm;
}

}  // namespace scr
