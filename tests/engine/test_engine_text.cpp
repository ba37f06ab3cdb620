// The engine with a real tokenizer (a byte-level BPE built here, one token per byte): streamed
// text, stop strings with hold-back, eos from the tokenizer, min_tokens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/engine/engine.hpp"
#include "runtime/text/tokenizer.hpp"
#include "tests/engine/engine_test_util.hpp"
#include "tests/engine/fake_model.hpp"

using namespace scr;
using namespace scr::test;

namespace {

// GPT-2's byte-to-unicode table: byte b is the vocabulary string of token id b; id 256 is <|eos|>.
std::unique_ptr<text::Tokenizer> byte_tokenizer() {
    std::vector<int> bs, cs;
    for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
    cs = bs;
    int n = 0;
    for (int b = 0; b < 256; ++b)
        if (std::find(bs.begin(), bs.end(), b) == bs.end()) { bs.push_back(b); cs.push_back(256 + n++); }
    nlohmann::json vocab = nlohmann::json::object();
    for (size_t i = 0; i < bs.size(); ++i) {
        std::string utf8;
        int c = cs[i];
        if (c < 0x80) utf8 += char(c);
        else { utf8 += char(0xC0 | (c >> 6)); utf8 += char(0x80 | (c & 0x3F)); }
        vocab[utf8] = bs[i];
    }
    nlohmann::json tok = {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
        {"added_tokens", {{{"id", 256}, {"content", "<|eos|>"}, {"special", true}}}},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
        {"decoder", {{"type", "ByteLevel"}}},
    };
    nlohmann::json cfg = {{"eos_token", "<|eos|>"}};
    return text::Tokenizer::from_json_text(tok.dump(), cfg.dump());
}

FakeModelShape letters_shape() {
    FakeModelShape s;
    s.vocab = 257;
    s.letters_only = true;
    return s;
}

EngineConfig small_config() {
    EngineConfig c;
    c.kv_cache_bytes = 400 * 8 * 4;
    return c;
}

std::string as_text(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s += char(t);
    return s;
}

}  // namespace

TEST(EngineText, StreamsTextAndStopsAtStopStringWithHoldBack) {
    auto tok = byte_tokenizer();
    ASSERT_EQ(tok->eos_ids(), std::vector<int32_t>{256});
    FakeModel model(letters_shape());
    const std::vector<int32_t> prompt = {'h', 'e', 'l', 'l', 'o'};
    const std::string full = as_text(reference_greedy(prompt, 257, 40, -1, true));
    ASSERT_EQ(full.size(), 40u);
    for (bool include : {false, true}) {
        const std::string stop = full.substr(12, 3);
        const size_t k = full.find(stop);
        Engine engine(model, tok.get(), small_config());
        Request r;
        r.id = "s";
        r.prompt_ids = prompt;
        r.params.temperature = 0;
        r.params.max_tokens = 40;
        r.params.stop = {"no-such-stop", stop};
        r.params.include_stop_str_in_output = include;
        Results res;
        engine.add_request(r, collect_into(res));
        run_to_completion(engine);
        const Collected& c = at(res, "s");
        EXPECT_EQ(c.reason, FinishReason::stop);
        EXPECT_EQ(c.stop_reason, stop);
        EXPECT_EQ(c.ids.size(), k + 3);  // generation ends on the token completing the stop string
        EXPECT_EQ(c.text, include ? full.substr(0, k + 3) : full.substr(0, k));
        if (!include) {  // no streamed chunk ever showed the stop string's first two characters
            for (const std::string& chunk : c.chunks) EXPECT_EQ(chunk.find(stop.substr(0, 2)), std::string::npos);
        }
        EXPECT_GT(c.chunks.size(), 3u) << "text should stream in several chunks";
        EXPECT_EQ(engine.stats().kv_blocks_free, engine.stats().kv_blocks_total);
    }
}

TEST(EngineText, TokenizerEosMinTokensAndTextOfStopToken) {
    auto tok = byte_tokenizer();
    FakeModel model(letters_shape());
    Engine engine(model, tok.get(), small_config());
    Request r;
    r.id = "e";
    r.prompt_ids = {'a', 'b'};
    r.params.temperature = 0;
    r.params.max_tokens = 20;
    r.params.min_tokens = 3;
    r.params.logit_bias = {{256, 100.f}};  // eos would win every step
    Results res;
    engine.add_request(r, collect_into(res));
    run_to_completion(engine);
    const Collected& c = at(res, "e");
    ASSERT_EQ(c.ids.size(), 4u);  // 3 forced non-eos tokens, then eos
    EXPECT_EQ(c.ids.back(), 256);
    EXPECT_EQ(c.reason, FinishReason::stop);
    EXPECT_EQ(c.text, as_text({c.ids[0], c.ids[1], c.ids[2]}));  // eos itself adds no text
}
