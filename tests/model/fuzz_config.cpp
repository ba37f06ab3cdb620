// Fuzz entry point for a model's config.json (untrusted input): any bytes must select a compiled
// specialization or give an scr::Error naming the problem, never a crash or another exception
// type (a nlohmann type_error escaping would mean a field was read without checking its type).
// Built as a libFuzzer target with -DSCR_FUZZ=ON (clang); scr_model_tests also drives it with
// mutated real configs under ASan/UBSan.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "runtime/core/error.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/model/quant_match.hpp"
#include "runtime/weights/mlx_layout.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view text(reinterpret_cast<const char*>(data), size);
    nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) return 0;  // malformed JSON is reported by the loader's parse step
    // The loader's other read of the quantization block: its router overrides (mlx_layout.hpp).
    for (auto& [module, o] : scr::mlx_router_overrides(scr::checkpoint_quantization(config)))
        if ((o.bits != 4 && o.bits != 8) || o.group_size <= 0 || module.empty()) __builtin_trap();
    try {
        const scr::ModelEntry& e = scr::select_specialization(config, "fuzz");
        if (!e.info) __builtin_trap();  // a selection must name a real specialization
    } catch (const scr::Error&) {
    }
    return 0;
}
