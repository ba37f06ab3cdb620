// Binding: run an architecture program against one config.json and one quant preset.
//
// Constants come from the config (every key read is recorded, so the runtime can later check
// that a model's config.json is the one this code was specialized for); the forward statements
// are executed with all of them known, producing the unrolled graph. Shape and dtype errors are
// reported here with the DSL location.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "compiler/dsl/ast.hpp"
#include "compiler/ir/graph.hpp"
#include "compiler/quant/preset.hpp"

namespace scr::bind {

struct BuildParams {
    int block_size = 16;
    int max_batch_tokens = 512;
    int max_logit_rows = 256;
};

struct RecordedKey {
    std::string pointer;     // JSON pointer into config.json
    std::string value_json;  // "" when absent
};

struct Bound {
    std::string stem, arch, hf_architecture, config_path;
    int64_t vocab = 0, hidden = 0, layers = 0, max_position = 0;
    int64_t bos = -1, eos = -1;
    quant::Preset preset;
    BuildParams params;
    ir::Graph graph;
    std::vector<RecordedKey> keys;
    std::vector<std::pair<std::string, std::string>> consts;  // name, value (for the plan)
};

// Throws scr::Error with file:line:col (DSL) or the config key on any problem.
Bound bind(const dsl::Program& program, const nlohmann::json& config, const std::string& config_path,
           const std::string& stem, const quant::Preset& preset, const BuildParams& params);

}  // namespace scr::bind
