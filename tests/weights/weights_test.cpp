// safetensors reading/writing and checkpoint validation against a plan: every bad input is an
// scr::Error naming the file and tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "runtime/core/error.hpp"
#include "runtime/weights/safetensors.hpp"
#include "runtime/weights/safetensors_writer.hpp"
#include "runtime/weights/weight_set.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;
using namespace scr;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() / ("scr_weights_test_" + std::to_string(std::random_device{}()));
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Two tensors: a [3, 4] f32 ramp and a [5] bf16 vector.
void write_model(const fs::path& file) {
    std::vector<TensorToWrite> ts;
    ts.push_back({"a.weight", DType::f32, {3, 4}, [](std::byte* b, size_t n) {
                      for (size_t i = 0; i < n / 4; ++i) reinterpret_cast<float*>(b)[i] = 0.5f * float(i) - 1.0f;
                  }});
    ts.push_back({"b.weight", DType::bf16, {5}, [](std::byte* b, size_t n) {
                      for (size_t i = 0; i < n / 2; ++i) reinterpret_cast<uint16_t*>(b)[i] = f32_to_bf16(float(i) + 0.25f);
                  }});
    write_safetensors(file, ts);
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

}  // namespace

TEST(Safetensors, RoundTripsThroughWriterAndReader) {
    TempDir d;
    write_model(d.path / "model.safetensors");
    auto f = SafetensorsFile::open(d.path / "model.safetensors");
    ASSERT_EQ(f->tensors().size(), 2u);
    const auto& a = f->tensors()[0];
    EXPECT_EQ(a.name, "a.weight");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 4}));
    const float* av = reinterpret_cast<const float*>(f->data(a));
    for (int i = 0; i < 12; ++i) EXPECT_EQ(av[i], 0.5f * float(i) - 1.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f->data(a)) % 64, 0u);  // 64-byte aligned data
}

TEST(Safetensors, TruncatedFileIsNamed) {
    TempDir d;
    write_model(d.path / "model.safetensors");
    std::string bytes = slurp(d.path / "model.safetensors");
    spit(d.path / "cut.safetensors", bytes.substr(0, bytes.size() - 3));
    std::string msg = error_of([&] { SafetensorsFile::open(d.path / "cut.safetensors"); });
    EXPECT_NE(msg.find("cut.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    spit(d.path / "tiny.safetensors", bytes.substr(0, 5));
    msg = error_of([&] { SafetensorsFile::open(d.path / "tiny.safetensors"); });
    EXPECT_NE(msg.find("too short"), std::string::npos) << msg;
    spit(d.path / "head.safetensors", bytes.substr(0, 40));
    msg = error_of([&] { SafetensorsFile::open(d.path / "head.safetensors"); });
    EXPECT_NE(msg.find("runs past the end"), std::string::npos) << msg;
}

TEST(Safetensors, MalformedHeadersAreRejected) {
    auto err = [](const std::string& json, uint64_t data) {
        return error_of([&] { parse_safetensors_header(json, data, "h"); });
    };
    EXPECT_NE(err("{not json", 0).find("not valid JSON"), std::string::npos);
    EXPECT_NE(err("[]", 0).find("must be a JSON object"), std::string::npos);
    EXPECT_NE(err(R"({"t":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 8).find("unsupported dtype Q7"), std::string::npos);
    EXPECT_NE(err(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8).find("4 data bytes for shape of 8"), std::string::npos);
    EXPECT_NE(err(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4).find("truncated"), std::string::npos);
    EXPECT_NE(err(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8).find("non-negative"), std::string::npos);
    EXPECT_NE(err(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8).find("reversed"), std::string::npos);
    EXPECT_NE(err(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8).find("overflow"), std::string::npos);
    EXPECT_TRUE(err(R"({"__metadata__":{"format":"pt"},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8).empty());
}

TEST(Safetensors, FuzzEntryPointSurvivesMutations) {
    std::mt19937 rng(12345);
    const std::string seed = R"({"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})";
    for (int i = 0; i < 3000; ++i) {
        std::string s = seed;
        int edits = 1 + int(rng() % 6);
        for (int e = 0; e < edits; ++e) {
            size_t pos = rng() % s.size();
            switch (rng() % 4) {
                case 0: s[pos] = char(rng() % 256); break;
                case 1: s.erase(pos, 1 + rng() % 8); break;
                case 2: s.insert(pos, std::string(1 + rng() % 4, "{}[],:\"0123456789-e"[rng() % 19])); break;
                case 3: s = s.substr(0, pos); break;
            }
            if (s.empty()) s = "{";
        }
        std::string input(8, '\0');
        uint64_t data = rng() % 64;
        std::memcpy(input.data(), &data, 8);
        input += s;
        LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    }
}

namespace {
TensorSpec spec(const char* name, std::initializer_list<int64_t> shape, DType dt, bool optional = false) {
    TensorSpec s{name, int(shape.size()), {0, 0, 0, 0}, dt, optional};
    int i = 0;
    for (auto d : shape) s.shape[i++] = d;
    return s;
}
}  // namespace

TEST(WeightSet, MapsSameDtypeAndConvertsOthers) {
    TempDir d;
    write_model(d.path / "model.safetensors");
    auto cp = Checkpoint::open(d.path);
    TensorSpec specs[] = {spec("a.weight", {3, 4}, DType::f32), spec("b.weight", {5}, DType::f32),
                          spec("c.weight", {2}, DType::f32, /*optional=*/true)};
    WeightSet ws(specs, cp, "m");
    EXPECT_EQ(ws.mapped_bytes(), 48);
    EXPECT_EQ(ws.converted_bytes(), 20);
    const float* b = static_cast<const float*>(ws.data(1));
    for (int i = 0; i < 5; ++i) EXPECT_EQ(b[i], bf16_to_f32(f32_to_bf16(float(i) + 0.25f)));
    EXPECT_EQ(ws.data(2), nullptr);
}

TEST(WeightSet, WrongShapeAndMissingTensorAreNamed) {
    TempDir d;
    write_model(d.path / "model.safetensors");
    auto cp = Checkpoint::open(d.path);
    TensorSpec wrong[] = {spec("a.weight", {4, 3}, DType::f32)};
    std::string msg = error_of([&] { WeightSet(wrong, cp, "tiny"); });
    EXPECT_NE(msg.find("tensor a.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("has shape [3, 4] but the compiled plan expects [4, 3]"), std::string::npos) << msg;
    TensorSpec missing[] = {spec("z.weight", {1}, DType::f32)};
    msg = error_of([&] { WeightSet(missing, cp, "tiny"); });
    EXPECT_NE(msg.find("tensor z.weight is missing"), std::string::npos) << msg;
}

TEST(Checkpoint, ShardedIndexAndItsErrors) {
    TempDir d;
    write_model(d.path / "part-1.safetensors");
    std::vector<TensorToWrite> second{{"c.weight", DType::f32, {2}, [](std::byte* b, size_t) {
                                          reinterpret_cast<float*>(b)[0] = 1;
                                          reinterpret_cast<float*>(b)[1] = 2;
                                      }}};
    write_safetensors(d.path / "part-2.safetensors", second);
    spit(d.path / "model.safetensors.index.json",
         R"({"weight_map":{"a.weight":"part-1.safetensors","b.weight":"part-1.safetensors","c.weight":"part-2.safetensors"}})");
    auto cp = Checkpoint::open(d.path);
    ASSERT_NE(cp->find("c.weight"), nullptr);
    EXPECT_NE(cp->find("a.weight"), nullptr);
    spit(d.path / "model.safetensors.index.json", R"({"weight_map":{"a.weight":"part-9.safetensors"}})");
    std::string msg = error_of([&] { Checkpoint::open(d.path); });
    EXPECT_NE(msg.find("part-9.safetensors listed in the index is missing"), std::string::npos) << msg;
    spit(d.path / "model.safetensors.index.json", R"({"weight_map":{"a.weight":"../etc/passwd"}})");
    msg = error_of([&] { Checkpoint::open(d.path); });
    EXPECT_NE(msg.find("plain file name"), std::string::npos) << msg;
}

// mlx-lm's layout (runtime/weights/mlx_layout.hpp): per-expert plan names read from stacked tensors.
TEST(MlxLayout, StackedExpertNames) {
    auto s = stacked_expert_source("model.layers.3.mlp.experts.17.gate_proj.scales");
    ASSERT_TRUE(s);
    EXPECT_EQ(s->stacked_name, "model.layers.3.mlp.switch_mlp.gate_proj.scales");
    EXPECT_EQ(s->expert, 17);
    // Mixtral: w1 / w2 / w3 are stacked as gate_proj / down_proj / up_proj (mlx-lm's mixtral sanitize).
    const std::pair<const char*, const char*> mixtral[] = {{"w1", "gate_proj"}, {"w2", "down_proj"}, {"w3", "up_proj"}};
    for (auto [from, to] : mixtral) {
        s = stacked_expert_source(std::string("model.layers.0.block_sparse_moe.experts.7.") + from + ".weight");
        ASSERT_TRUE(s) << from;
        EXPECT_EQ(s->stacked_name, std::string("model.layers.0.block_sparse_moe.switch_mlp.") + to + ".weight");
        EXPECT_EQ(s->expert, 7);
    }
    for (const char* not_expert : {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj",
                                   "model.layers.0.mlp.experts.x.up_proj.weight", "model.layers.0.mlp.experts.2",
                                   "model.layers.0.mlp.experts.-1.up_proj.weight", "model.layers.0.mlp.experts.2.weight"})
        EXPECT_FALSE(stacked_expert_source(not_expert)) << not_expert;
}

TEST(MlxLayout, RouterOverrideRules) {
    using nlohmann::json;
    EXPECT_EQ(mlx_override_refusal("model.layers.0.mlp.gate", json{{"group_size", 64}, {"bits", 8}}), "");
    EXPECT_EQ(mlx_override_refusal("model.layers.0.block_sparse_moe.gate", json{{"group_size", 32}, {"bits", 4}}), "");
    EXPECT_EQ(mlx_override_refusal("model.layers.0.mlp.gate", false), "");
    const std::pair<const char*, json> refused[] = {
        {"model.layers.0.self_attn.q_proj", json{{"group_size", 64}, {"bits", 8}}},
        {"model.layers.0.mlp.gate", json{{"group_size", 64}, {"bits", 3}}},
        {"model.layers.0.mlp.gate", json{{"group_size", 48}, {"bits", 8}}},
        {"model.layers.0.mlp.gate", json{{"group_size", 64}, {"bits", 8}, {"mode", "mxfp4"}}},
        {"model.layers.0.mlp.gate", json{{"group_size", 64}, {"bits", 8}, {"scale", 2}}},
        {"model.layers.0.mlp.gate", json("8 bits")},
    };
    for (auto& [key, value] : refused) {
        const std::string why = mlx_override_refusal(key, value);
        EXPECT_NE(why.find(key), std::string::npos) << key << " " << value.dump() << ": " << why;
    }
    const json block = {{"group_size", 64}, {"bits", 4}, {"model.layers.0.mlp.gate", {{"group_size", 64}, {"bits", 8}}},
                        {"model.layers.1.mlp.gate", true}, {"model.layers.2.mlp.gate", false}};
    const MlxRouterOverrides o = mlx_router_overrides(block);
    ASSERT_EQ(o.size(), 2u);
    EXPECT_EQ(o.at("model.layers.0.mlp.gate").bits, 8);
    EXPECT_EQ(o.at("model.layers.1.mlp.gate").bits, 4);  // true: the block's own format
    EXPECT_EQ(o.at("model.layers.1.mlp.gate").group_size, 64);
    EXPECT_TRUE(mlx_router_overrides(nullptr).empty());
}

TEST(WeightSet, ReadsStackedExpertSlicesInPlace) {
    TempDir d;
    std::vector<TensorToWrite> ts;
    ts.push_back({"l.mlp.switch_mlp.up_proj.weight", DType::f32, {3, 2, 4}, [](std::byte* b, size_t n) {
                      for (size_t i = 0; i < n / 4; ++i) reinterpret_cast<float*>(b)[i] = 0.75f * float(i) - 3.0f;
                  }});
    ts.push_back({"l.mlp.switch_mlp.up_proj.scales", DType::bf16, {3, 2}, [](std::byte* b, size_t n) {
                      for (size_t i = 0; i < n / 2; ++i) reinterpret_cast<uint16_t*>(b)[i] = f32_to_bf16(float(i) * 1.5f + 0.5f);
                  }});
    write_safetensors(d.path / "model.safetensors", ts);
    auto cp = Checkpoint::open(d.path);
    std::vector<TensorSpec> specs;
    std::vector<std::string> names;
    for (int e = 0; e < 3; ++e) names.push_back("l.mlp.experts." + std::to_string(e) + ".up_proj.weight");
    for (int e = 0; e < 3; ++e) names.push_back("l.mlp.experts." + std::to_string(e) + ".up_proj.scales");
    for (int e = 0; e < 3; ++e) specs.push_back(spec(names[size_t(e)].c_str(), {2, 4}, DType::f32));
    for (int e = 0; e < 3; ++e) specs.push_back(spec(names[size_t(3 + e)].c_str(), {2}, DType::f32));  // converted from bf16
    WeightSet ws(specs, cp, "m");
    EXPECT_EQ(ws.mapped_bytes(), 96);
    EXPECT_EQ(ws.converted_bytes(), 24);
    for (int e = 0; e < 3; ++e) {
        const float* w = static_cast<const float*>(ws.data(size_t(e)));
        for (int i = 0; i < 8; ++i) EXPECT_EQ(w[i], 0.75f * float(8 * e + i) - 3.0f) << e << " " << i;
        const float* s = static_cast<const float*>(ws.data(size_t(3 + e)));
        for (int i = 0; i < 2; ++i) EXPECT_EQ(s[i], float(2 * e + i) * 1.5f + 0.5f) << e << " " << i;
    }
    TensorSpec beyond[] = {spec("l.mlp.experts.3.up_proj.weight", {2, 4}, DType::f32)};
    std::string msg = error_of([&] { WeightSet(beyond, cp, "m"); });
    EXPECT_NE(msg.find("l.mlp.switch_mlp.up_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("holds 3 experts"), std::string::npos) << msg;
    TensorSpec misshapen[] = {spec("l.mlp.experts.0.up_proj.weight", {4, 2}, DType::f32)};
    msg = error_of([&] { WeightSet(misshapen, cp, "m"); });
    EXPECT_NE(msg.find("has shape [3, 2, 4] but the compiled plan expects [experts, 4, 2]"), std::string::npos) << msg;
    TensorSpec absent[] = {spec("l.mlp.experts.0.down_proj.weight", {2, 4}, DType::f32)};
    msg = error_of([&] { WeightSet(absent, cp, "m"); });
    EXPECT_NE(msg.find("nor is its stacked form l.mlp.switch_mlp.down_proj.weight"), std::string::npos) << msg;
}

// A router the file quantizes (an 8-bit override) read into the plan's dense f32: scale * q + bias.
TEST(WeightSet, DequantizesAnMlxRouterOverride) {
    TempDir d;
    constexpr int n = 3, k = 64, g = 32;
    std::mt19937 rng(11);
    std::vector<uint32_t> words(n * k / 4);
    for (auto& w : words) w = rng();
    std::vector<uint16_t> scales(n * k / g), biases(n * k / g);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (auto& s : scales) s = f32_to_bf16(u(rng) * 0.01f);
    for (auto& b : biases) b = f32_to_bf16(u(rng));
    auto copy = [](const void* src) { return [src](std::byte* b, size_t len) { std::memcpy(b, src, len); }; };
    std::vector<TensorToWrite> ts;
    ts.push_back({"l.mlp.gate.weight", DType::u32, {n, k / 4}, copy(words.data())});
    ts.push_back({"l.mlp.gate.scales", DType::bf16, {n, k / g}, copy(scales.data())});
    ts.push_back({"l.mlp.gate.biases", DType::bf16, {n, k / g}, copy(biases.data())});
    write_safetensors(d.path / "model.safetensors", ts);
    auto cp = Checkpoint::open(d.path);
    TensorSpec router[] = {spec("l.mlp.gate.weight", {n, k}, DType::f32)};
    WeightSet ws(router, cp, "m", false, {{"l.mlp.gate", {8, g}}});
    const float* w = static_cast<const float*>(ws.data(0));
    for (int r = 0; r < n; ++r)
        for (int c = 0; c < k; ++c) {
            const double q = double((words[size_t(r * k + c) / 4] >> (8 * (c % 4))) & 0xFF);
            const double want = double(bf16_to_f32(scales[size_t(r * 2 + c / g)])) * q + double(bf16_to_f32(biases[size_t(r * 2 + c / g)]));
            EXPECT_EQ(w[r * k + c], float(want)) << r << " " << c;
        }
    // The same file read as 4 bits per value (a wrong override) is a shape error naming the tensor.
    std::string msg = error_of([&] { WeightSet(router, cp, "m", false, {{"l.mlp.gate", {4, g}}}); });
    EXPECT_NE(msg.find("tensor l.mlp.gate.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4-bit MLX packing of the plan's [3, 64] expects [3, 8]"), std::string::npos) << msg;
    msg = error_of([&] { WeightSet(router, cp, "m", false, {{"l.mlp.gate", {8, 64}}}); });
    EXPECT_NE(msg.find("l.mlp.gate.scales"), std::string::npos) << msg;
}
