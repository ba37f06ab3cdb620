// Shared helpers for tests/text: where the npm oracles and their reference outputs live.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <memory>
#include <sstream>
#include <string>

#include "runtime/text/tokenizer.hpp"

namespace scr::text::test {

inline std::filesystem::path oracle_dir() { return SCR_TEXT_ORACLE_DIR; }
inline std::filesystem::path refs_dir() { return SCR_TEXT_REFS_DIR; }
inline std::filesystem::path corpus_dir() { return SCR_TEXT_CORPUS_DIR; }
inline bool oracles_installed() { return std::filesystem::exists(oracle_dir() / "node_modules" / "@lenml" / "tokenizers"); }
inline std::filesystem::path model_dir(const std::string& name) {
    return oracle_dir() / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models";
}

inline std::string read_text(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

inline nlohmann::ordered_json read_json(const std::filesystem::path& p) {
    if (!std::filesystem::exists(p)) throw std::runtime_error("missing reference file " + p.string() +
                                                             " (the text_refs CTest fixture makes it)");
    return nlohmann::ordered_json::parse(read_text(p));
}

// Python-stack references (tokenizers + jinja2 as transformers sets it up), committed under
// corpus/python_refs by tools/oracles/python_refs.py; where present they are the ground truth
// (the JS oracle differs from Python in a few documented places, see docs/TEXT.md).
inline std::optional<nlohmann::ordered_json> python_ref(const std::string& file) {
    const auto p = corpus_dir() / "python_refs" / file;
    if (!std::filesystem::exists(p)) return std::nullopt;
    return nlohmann::ordered_json::parse(read_text(p));
}

// Loaded once per process: the big tokenizers take a while.
inline const Tokenizer& tokenizer(const std::string& name) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    auto& slot = cache[name];
    if (!slot) slot = Tokenizer::load(model_dir(name));
    return *slot;
}

// Printable form of a text for failure messages.
inline std::string show(const std::string& s, size_t max = 120) {
    std::string out;
    for (unsigned char c : s) {
        if (out.size() >= max) {
            out += "...";
            break;
        }
        if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else if (c < 0x20) out += "\\x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
        else out.push_back(static_cast<char>(c));
    }
    return out;
}

}  // namespace scr::text::test

#define SCR_REQUIRE_ORACLES()                                                                        \
    do {                                                                                             \
        if (!::scr::text::test::oracles_installed())                                                 \
            GTEST_SKIP() << "npm oracles are not installed: run `npm ci --prefix tools/oracles` "    \
                            "(skipping reference comparisons)";                                      \
    } while (0)
