// Stop strings on streamed text: the concatenated chunks equal the final text, which ends right
// before the stop string; no chunk ever shows a stop string or a prefix of one that later completes.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "runtime/engine/text_stream.hpp"

using scr::engine::TextStream;

namespace {
struct StreamRun {
    std::string streamed;
    std::vector<std::string> chunks;
    int matched = -1;
};
// Feeds `pieces` one by one as a detokenizer would, collecting streamed chunks.
StreamRun feed(const std::vector<std::string>& stop, bool include, const std::vector<std::string>& pieces) {
    TextStream ts(&stop, include);
    StreamRun r;
    for (size_t i = 0; i < pieces.size(); ++i) {
        r.matched = ts.append(pieces[i]);
        bool finished = r.matched >= 0 || i + 1 == pieces.size();
        std::string c(ts.next_chunk(finished));
        r.chunks.push_back(c);
        r.streamed += c;
        if (r.matched >= 0) break;
    }
    return r;
}
}  // namespace

TEST(TextStream, HoldsBackPartialStopStringAcrossPieces) {
    const std::vector<std::string> stop = {"STOP"};
    StreamRun r = feed(stop, false, {"Hello ", "wor", "ld S", "TO", "P and more"});
    EXPECT_EQ(r.matched, 0);
    EXPECT_EQ(r.streamed, "Hello world ");
    // While "S" then "STO" was pending it was held back: no chunk contains an 'S'.
    for (const std::string& c : r.chunks) EXPECT_EQ(c.find('S'), std::string::npos) << c;
}

TEST(TextStream, FalseStartIsReleased) {
    const std::vector<std::string> stop = {"STOP"};
    StreamRun r = feed(stop, false, {"a ST", "ONE b", " c"});
    EXPECT_EQ(r.matched, -1);
    EXPECT_EQ(r.streamed, "a STONE b c");
}

TEST(TextStream, IncludeStopString) {
    const std::vector<std::string> stop = {"\n\n", "END"};
    StreamRun r = feed(stop, true, {"x", "yEN", "Dz"});
    EXPECT_EQ(r.matched, 1);
    EXPECT_EQ(r.streamed, "xyEND");
}

TEST(TextStream, FirstStopInListOrderWins) {
    // vLLM checks stop strings in list order, not by position.
    const std::vector<std::string> stop = {"b", "a"};
    StreamRun r = feed(stop, false, {"xab"});
    EXPECT_EQ(r.matched, 0);
    EXPECT_EQ(r.streamed, "xa");
}

TEST(TextStream, ChunksNeverSplitUtf8) {
    const std::vector<std::string> stop = {"\xE2\x82\xAC\xE2\x82\xAC!"};  // "€€!" (7 bytes)
    TextStream ts(&stop, false);
    std::string all = "price: 5\xE2\x82\xAC each \xC3\xA9t\xC3\xA9";
    std::string streamed;
    for (char c : all) {  // one byte at a time: worst case for boundaries
        ts.append(std::string(1, c));
        std::string_view chunk = ts.next_chunk(false);
        if (!chunk.empty()) {
            unsigned char last = static_cast<unsigned char>(chunk.back());
            // a chunk ends with ASCII or the last byte of a complete sequence
            size_t i = chunk.size() - 1;
            while (i > 0 && (static_cast<unsigned char>(chunk[i]) & 0xC0) == 0x80) --i;
            unsigned char lead = static_cast<unsigned char>(chunk[i]);
            size_t need = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            EXPECT_EQ(chunk.size() - i, need) << "chunk ends inside a character (last byte " << int(last) << ")";
        }
        streamed += chunk;
    }
    streamed += ts.next_chunk(true);
    EXPECT_EQ(streamed, all);
}

// Random texts and stop strings: the streamed result equals the text cut at the first stop
// occurrence (computed directly), whatever the piece boundaries.
TEST(TextStream, RandomSplitsAgreeWithDirectSearch) {
    std::mt19937 g(99);
    for (int trial = 0; trial < 500; ++trial) {
        std::string text;
        for (int i = 0; i < 40; ++i) text += char('a' + g() % 3);
        const std::vector<std::string> stop = {std::string("abc").substr(0, 1 + g() % 3) + "c", "cc" + std::string(1, char('a' + g() % 3))};
        std::vector<std::string> pieces;
        for (size_t i = 0; i < text.size();) {
            size_t n = 1 + g() % 4;
            pieces.push_back(text.substr(i, n));
            i += n;
        }
        StreamRun r = feed(stop, false, pieces);
        // Direct: the earliest end position at which some stop string is complete; among stop
        // strings completing in the same piece, list order decides (as vLLM).
        size_t best_cut = text.size();
        int expect = -1;
        size_t consumed = 0;
        for (const std::string& p : pieces) {
            consumed += p.size();
            std::string prefix = text.substr(0, consumed);
            for (size_t k = 0; k < stop.size(); ++k) {
                size_t at = prefix.find(stop[k]);
                if (at != std::string::npos) { best_cut = at; expect = int(k); break; }
            }
            if (expect >= 0) break;
        }
        ASSERT_EQ(r.matched, expect) << text;
        ASSERT_EQ(r.streamed, text.substr(0, best_cut)) << text;
    }
}
