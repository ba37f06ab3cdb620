// Malformed inputs: specific clear errors, and a few hundred mutated tokenizer.json files, texts,
// id streams, templates and chat contexts fed through the fuzz entry point (fuzz_tokenizer.cpp).
// Under -DSCR_SANITIZE=ON this is the CI's sanitizer run of the fuzz target.
#include <gtest/gtest.h>

#include <random>

#include "runtime/core/error.hpp"
#include "runtime/text/jinja.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tests/text/test_support.hpp"

namespace scr::text::fuzz {
std::string byte_level_tokenizer_json();
std::string sentencepiece_tokenizer_json();
int fuzz_one(const uint8_t* data, size_t size);
}  // namespace scr::text::fuzz

namespace scr::text::test {
namespace {

using nlohmann::ordered_json;

std::string load_error(const std::string& json) {
    try {
        Tokenizer::from_json_text(json, "", "", "tok.json");
    } catch (const scr::Error& e) {
        return e.what();
    }
    return "(no error)";
}

ordered_json base() { return ordered_json::parse(fuzz::byte_level_tokenizer_json()); }

TEST(TokenizerErrors, NameTheFileThePathAndTheProblem) {
    EXPECT_NE(load_error("{\"model\": {\"vocab\": {\"a\": 0}, \n \"merges\": [1]}}").find("tok.json:2:"), std::string::npos)
        << load_error("{\"model\": {\"vocab\": {\"a\": 0}, \n \"merges\": [1]}}");
    EXPECT_NE(load_error("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [1]}}").find("model.merges"), std::string::npos);
    EXPECT_NE(load_error("{\"version\": \"1.0\"}").find("missing \"model\""), std::string::npos);
    EXPECT_NE(load_error("{\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}}").find("out of range"), std::string::npos);
    EXPECT_NE(load_error("{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}").find("model.merges[0]: token \"c\" is not in the vocabulary"),
              std::string::npos);
    EXPECT_NE(load_error("{\"model\": {\"vocab\": {}, \"merges\": []}").find("unexpected end of file"), std::string::npos);

    auto j = base();
    j["model"]["type"] = "WordPiece";
    EXPECT_NE(load_error(j.dump()).find("model type \"WordPiece\" is not supported"), std::string::npos) << load_error(j.dump());
    j = base();
    j["pre_tokenizer"]["pretokenizers"][1]["type"] = "UnicodeScripts";
    EXPECT_NE(load_error(j.dump()).find("pre_tokenizer.pretokenizers[1]: pre-tokenizer type \"UnicodeScripts\" is not supported"),
              std::string::npos)
        << load_error(j.dump());
    j = base();
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
    EXPECT_NE(load_error(j.dump()).find("cannot compile regex"), std::string::npos);
    j = base();
    j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
    EXPECT_NE(load_error(j.dump()).find("normalizer type \"Precompiled\" is not supported"), std::string::npos);
    j = base();
    j["added_tokens"][0]["id"] = 1LL << 40;
    EXPECT_NE(load_error(j.dump()).find("added_tokens[0]: id"), std::string::npos);
    j = base();
    j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
    EXPECT_NE(load_error(j.dump()).find("must be one character"), std::string::npos);
}

TEST(TokenizerErrors, MissingFilesAndBadConfig) {
    EXPECT_THROW(Tokenizer::load("/nonexistent/dir"), scr::Error);
    EXPECT_THROW(Tokenizer::from_json_text(fuzz::byte_level_tokenizer_json(), "{not json", "", "t"), scr::Error);
}

// The built-in fuzz tokenizers behave: specials unsplit, lstrip/rstrip/single_word as HF does.
TEST(TokenizerErrors, BuiltinFuzzTokenizersWork) {
    const auto tok = Tokenizer::from_json_text(fuzz::byte_level_tokenizer_json());
    const int32_t end = *tok->token_to_id("<|end|>"), tool = *tok->token_to_id("<tool>"), word = *tok->token_to_id("word");
    auto ids = tok->encode("hello<|end|>");
    ASSERT_EQ(ids.size(), 2u);
    EXPECT_EQ(ids[1], end);
    // rstrip/lstrip swallow the spaces around <tool>.
    ids = tok->encode("a  <tool>  b");
    EXPECT_EQ(tok->decode(ids), "a<tool>b");
    // single_word: only matched as a whole word.
    ids = tok->encode("words word");
    EXPECT_EQ(std::count(ids.begin(), ids.end(), word), 1);
    EXPECT_EQ(tok->decode(tok->encode("hello world")), "hello world");
    EXPECT_EQ(tok->encode("x", true).front(), *tok->token_to_id("<s>"));
    (void)tool;

    const auto sp = Tokenizer::from_json_text(fuzz::sentencepiece_tokenizer_json());
    EXPECT_EQ(sp->decode(sp->encode("the thé")), "the thé");  // é through byte fallback
    EXPECT_EQ(sp->encode("the"), std::vector<int32_t>{*sp->token_to_id("\u2581the")});
}

// Deterministic mutations.
class Mutator {
public:
    explicit Mutator(uint32_t seed) : rng_(seed) {}
    size_t pick(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

    std::string bytes(std::string s) {
        static const char* fragments[] = {"{", "}", "[", "]", "\"", "\\u", "\\ud800", ",", ":", "-1", "1e99",
                                          "null", "[[[[[[[[", "{{", "{%", "%}", "}}", "{#", "\xff", "\xc3", "\xe2\x96\x81",
                                          "99999999999", "<|end|>", "(?!\\S)", "*", "|"};
        const int n = 1 + static_cast<int>(pick(4));
        for (int k = 0; k < n; ++k) {
            const size_t pos = pick(s.size() + 1);
            switch (pick(5)) {
                case 0: if (!s.empty()) s[pick(s.size())] = static_cast<char>(pick(256)); break;
                case 1: s.resize(pos); break;
                case 2: s.insert(pos, fragments[pick(std::size(fragments))]); break;
                case 3: if (pos < s.size()) s.erase(pos, pick(16) + 1); break;
                case 4: if (pos < s.size()) s.insert(pos, s.substr(pos, pick(64) + 1)); break;
            }
        }
        return s;
    }

    // Replace a random value somewhere in the JSON with a value of another type.
    void json(ordered_json& j, int depth = 0) {
        if ((j.is_object() || j.is_array()) && !j.empty() && depth < 6 && pick(4) != 0) {
            auto it = j.begin();
            std::advance(it, static_cast<std::ptrdiff_t>(pick(j.size())));
            json(*it, depth + 1);
            return;
        }
        static const ordered_json replacements[] = {nullptr, -5, 1LL << 33, 3.5, "", "BPE", "Regex", ordered_json::array(),
                                                    ordered_json::object(), true, "\u2581", ordered_json::array({1, "x"})};
        j = replacements[pick(std::size(replacements))];
    }

private:
    std::mt19937 rng_;
};

void feed(int mode, const std::string& payload) {
    std::string data(1, static_cast<char>(mode));
    data += payload;
    fuzz::fuzz_one(reinterpret_cast<const uint8_t*>(data.data()), data.size());
}

TEST(FuzzInputs, MutatedTokenizerJsonFiles) {
    Mutator m(1);
    for (const std::string& seed : {fuzz::byte_level_tokenizer_json(), fuzz::sentencepiece_tokenizer_json()}) {
        for (int k = 0; k < 60; ++k) feed(0, m.bytes(seed));
        for (int k = 0; k < 60; ++k) {
            auto j = ordered_json::parse(seed);
            m.json(j);
            feed(0, j.dump());
        }
    }
}

TEST(FuzzInputs, MutatedTextsAndIdStreams) {
    Mutator m(2);
    auto texts = ordered_json::parse(read_text(corpus_dir() / "texts.json"));
    for (int k = 0; k < 160; ++k) {
        std::string t = texts[m.pick(texts.size())].get<std::string>();
        if (t.size() > 400) t.resize(400);
        feed(1 + k % 2, m.bytes(t) + m.bytes("\x01\x02\xff\xfe\x00\x05<|end|>"));
    }
}

TEST(FuzzInputs, MutatedTemplatesAndContexts) {
    Mutator m(3);
    std::vector<std::string> templates;
    for (const auto& e : std::filesystem::directory_iterator(corpus_dir() / "templates")) templates.push_back(read_text(e.path()));
    if (oracles_installed())
        for (const char* name : {"qwen3", "llama3_2", "gemma3", "mistral_nemo"})
            templates.push_back(ordered_json::parse(read_text(model_dir(name) / "tokenizer_config.json"))["chat_template"]);
    for (int k = 0; k < 200; ++k) feed(3, m.bytes(templates[m.pick(templates.size())]));
    const auto spec = ordered_json::parse(read_text(corpus_dir() / "conversations.json"));
    for (int k = 0; k < 100; ++k) {
        const auto& c = spec["cases"][m.pick(spec["cases"].size())]["conversations"];
        ordered_json conv = c[m.pick(c.size())];
        m.json(conv);
        feed(4, k % 2 ? conv.dump() : m.bytes(conv.dump()));
    }
}

TEST(FuzzInputs, HostileTemplatesFailCleanly) {
    const jinja::Value ctx = jinja::Value::from_json(ordered_json::object());
    for (const std::string& src : {"{{ " + std::string(5000, '(') + "1 }}", "{{ " + std::string(5000, '[') + " }}", std::string("{{ ") + std::string(3000, '-') + "1 }}",
                                   std::string("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
                                   std::string("{{ 'x' * 100000000000 }}"), std::string("{{ 2 ** 100000000000 }}"),
                                   std::string("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"),
                                   std::string("{{ range(100000000) | length }}")}) {
        // A clear error, not a stack overflow, an out-of-memory or a hang.
        EXPECT_THROW(jinja::Template(src).render(ctx), scr::Error) << src.substr(0, 80);
    }
}

}  // namespace
}  // namespace scr::text::test
