// From a model argument to a running specialization: resolve the folder (or HF cache id), read
// config.json, pick the compiled specialization whose recorded config values all match (or refuse
// with the list of what is compiled in), map and check the weights, load the tokenizer and chat
// template when the folder has them.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/model/compiled_model.hpp"
#include "runtime/weights/weight_set.hpp"

namespace scr {

namespace text {
class Tokenizer;
class ChatTemplate;
}  // namespace text

struct LoadOptions {
    std::string quant;        // preset name; empty: the one matching the checkpoint's dtype, else the first
    bool load_text = true;    // tokenizer + chat template when present
    int threads = 0;          // CPU threads for the kernels; 0: all cores
    // Copy mapped weights into 2 MiB pages once (faster decode; costs a copy at start; see
    // WeightSet for when it is skipped). Default: on, unless the environment sets SCR_HUGE_PAGES=0.
    bool huge_pages = huge_pages_from_env();
    static bool huge_pages_from_env();
};

struct LoadedModel {
    LoadedModel();
    LoadedModel(LoadedModel&&) noexcept;
    LoadedModel& operator=(LoadedModel&&) noexcept;
    ~LoadedModel();

    std::filesystem::path dir;
    nlohmann::json config;
    const ModelEntry* entry = nullptr;
    std::unique_ptr<WeightSet> weights;
    std::unique_ptr<CompiledModel> model;
    std::unique_ptr<text::Tokenizer> tokenizer;          // null when the folder has no tokenizer.json
    std::unique_ptr<text::ChatTemplate> chat_template;   // null when it has no chat template
    nlohmann::json generation_config = nlohmann::json::object();
    double load_seconds = 0;
};

// "" loads the embedded default model. Throws scr::Error with a message naming the problem.
LoadedModel load_model(const std::string& path_or_hf_id, const LoadOptions& options = {});

// The shipped default model's folder ($SCR_DEFAULT_MODEL overrides).
std::filesystem::path default_model_dir();

// The specialization serving this config, or an scr::Error listing what is compiled in and, for
// specializations of the same architecture, the first config value that differs.
const ModelEntry& select_specialization(const nlohmann::json& config, const std::string& origin,
                                        const std::string& quant = "");

// One line per compiled specialization, for `scr models` and error messages.
std::string describe_compiled_models();

}  // namespace scr
