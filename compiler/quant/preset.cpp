#include "compiler/quant/preset.hpp"

#include <fstream>

#include "runtime/core/error.hpp"

namespace scr::quant {

namespace {

DType dtype_field(const nlohmann::json& j, const char* key, DType fallback, const std::string& origin,
                  std::initializer_list<DType> allowed) {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_string()) fail("{}: field \"{}\" must be a dtype name string", origin, key);
    auto name = j[key].get<std::string>();
    auto t = dtype_from_name(name);
    if (!t) fail("{}: field \"{}\": unknown dtype \"{}\"", origin, key, name);
    for (auto a : allowed)
        if (a == *t) return *t;
    std::string list;
    for (auto a : allowed) list += std::string(list.empty() ? "" : ", ") + std::string(dtype_name(a));
    fail("{}: field \"{}\": dtype {} is not supported for this role (supported: {})", origin, key, name, list);
}

}  // namespace

Preset parse_preset(const nlohmann::json& j, const std::string& origin) {
    if (!j.is_object()) fail("{}: a quant preset must be a JSON object", origin);
    Preset p;
    p.raw = j;
    if (!j.contains("name") || !j["name"].is_string()) fail("{}: missing string field \"name\"", origin);
    p.name = j["name"].get<std::string>();
    if (j.contains("format") && j["format"] != "dense")
        fail("{}: weight format \"{}\" is not supported by this compiler yet (supported: dense)", origin,
             j["format"].dump());
    p.description = j.value("description", "");
    const auto floats = {DType::f32, DType::bf16, DType::f16};
    p.linear = dtype_field(j, "linear", DType::bf16, origin, floats);
    p.embedding = dtype_field(j, "embedding", p.linear, origin, floats);
    p.norm = dtype_field(j, "norm", DType::f32, origin, {DType::f32});
    p.router = dtype_field(j, "router", DType::f32, origin, floats);
    p.kv_cache = dtype_field(j, "kv_cache", DType::bf16, origin, {DType::f32, DType::bf16});
    return p;
}

Preset load_preset(const std::string& path) {
    std::ifstream in(path);
    if (!in) fail("cannot read quant preset {}", path);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        fail("{}: malformed JSON: {}", path, e.what());
    }
    return parse_preset(j, path);
}

}  // namespace scr::quant
