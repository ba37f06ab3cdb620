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

int int_field(const nlohmann::json& j, const char* key, const std::string& origin) {
    if (!j.contains(key)) fail("{}: a quantized preset needs the integer field \"{}\"", origin, key);
    if (!j[key].is_number_integer()) fail("{}: field \"{}\" must be an integer, got {}", origin, key, j[key].dump());
    return j[key].get<int>();
}

// Bits, group size, scale dtype and the checkpoint's quantization_config must agree: the preset is
// matched against a checkpoint by that block, and the kernels are instantiated from the fields.
void parse_quantized(const nlohmann::json& j, const std::string& origin, Preset& p) {
    p.bits = int_field(j, "bits", origin);
    p.scale_dtype = dtype_field(j, "scale_dtype", DType::bf16, origin, {DType::bf16, DType::f32, DType::f16});
    if (!j.contains("quantization_config") || !j["quantization_config"].is_object())
        fail("{}: a quantized preset needs the \"quantization_config\" object its checkpoints carry", origin);
    p.quantization_config = j["quantization_config"];
    const auto& qc = p.quantization_config;
    if (p.format == WeightFormat::mlx_affine) {
        p.group_size = int_field(j, "group_size", origin);
        if (p.bits != 4) fail("{}: mlx-affine bits {} is not supported (supported: 4)", origin, p.bits);
        if (p.group_size != 32 && p.group_size != 64 && p.group_size != 128)
            fail("{}: mlx-affine group_size {} is not supported (supported: 32, 64, 128)", origin, p.group_size);
        if (qc.value("bits", -1) != p.bits || qc.value("group_size", -1) != p.group_size)
            fail("{}: quantization_config {} disagrees with bits {} / group_size {}", origin, qc.dump(), p.bits,
                 p.group_size);
        p.packed = DType::u32;
        return;
    }
    const std::string type = j.value("weight_type", "");
    if (type != "int" && type != "float")
        fail("{}: compressed-tensors preset needs \"weight_type\": \"int\" or \"float\", got \"{}\"", origin, type);
    if (p.bits != 8) fail("{}: compressed-tensors bits {} is not supported (supported: 8)", origin, p.bits);
    const std::string strategy = j.value("strategy", "");
    if (strategy != "channel" && strategy != "tensor")
        fail("{}: \"strategy\" must be \"channel\" or \"tensor\", got \"{}\"", origin, strategy);
    if (type == "int" && strategy != "channel") fail("{}: int8 supports the channel strategy only", origin);
    p.per_tensor = strategy == "tensor";
    p.packed = type == "int" ? DType::i8 : DType::f8e4m3;
    if (qc.value("quant_method", "") != "compressed-tensors")
        fail("{}: quantization_config.quant_method must be \"compressed-tensors\"", origin);
    const auto* w = qc.contains("config_groups") && qc["config_groups"].is_object() && qc["config_groups"].contains("group_0")
                        ? &qc["config_groups"]["group_0"]["weights"]
                        : nullptr;
    if (!w || !w->is_object() || w->value("num_bits", -1) != p.bits || w->value("type", "") != type ||
        w->value("strategy", "") != strategy)
        fail("{}: quantization_config.config_groups.group_0.weights must say num_bits {}, type {}, strategy {}", origin,
             p.bits, type, strategy);
}

}  // namespace

Preset parse_preset(const nlohmann::json& j, const std::string& origin) {
    if (!j.is_object()) fail("{}: a quant preset must be a JSON object", origin);
    Preset p;
    p.raw = j;
    if (!j.contains("name") || !j["name"].is_string()) fail("{}: missing string field \"name\"", origin);
    p.name = j["name"].get<std::string>();
    const std::string format = j.contains("format") && j["format"].is_string() ? j["format"].get<std::string>() : "dense";
    if (j.contains("format") && !j["format"].is_string()) fail("{}: field \"format\" must be a string", origin);
    if (format == "mlx-affine") p.format = WeightFormat::mlx_affine;
    else if (format == "compressed-tensors") p.format = WeightFormat::compressed_tensors;
    else if (format != "dense")
        fail("{}: weight format \"{}\" is not supported (supported: dense, mlx-affine, compressed-tensors)", origin, format);
    if (p.quantized()) parse_quantized(j, origin, p);
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
