// Emitters: turn a bound, fused, planned graph into target source. The common part (tensor table,
// config keys, ModelInfo, the printed plan) is shared by every target.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "compiler/bind/binder.hpp"

namespace scr::emit {

struct Sizes {
    int64_t weight_bytes = 0, active_weight_bytes = 0;
    int64_t kv_bytes_per_token = 0, kv_block_bytes = 0;
    std::vector<int64_t> k_offsets, v_offsets;  // bytes inside one KV block, per attention layer
    int64_t scratch_bytes = 0;
};

Sizes sizes_of(const bind::Bound& b);
// ModelInfo::sliding_window: the largest window when every attention layer has one, else 0.
int freeable_window(const ir::Graph& g);
std::string plan_text(const bind::Bound& b, const Sizes& s);
std::string info_tables(const bind::Bound& b, const Sizes& s, const std::string& target);
std::string symbol_for(const bind::Bound& b, const std::string& target);
std::string cpp_string(std::string_view s);
std::string float_literal(double v);

// The CPU target: one .cpp per specialization, calling kernels/cpu templates with literal shapes.
std::string emit_cpu(const bind::Bound& b);

// The CUDA target (sm_90a): one .cu per specialization, calling kernels/cuda templates.
std::string emit_cuda(const bind::Bound& b);

// The registry translation unit listing every specialization's entry symbol.
std::string emit_registry(const std::vector<std::string>& symbols);

}  // namespace scr::emit
