// A small JSON cursor for the two huge members of tokenizer.json (model.vocab, model.merges):
// parsing those through a DOM costs more than our whole load budget, so they are streamed straight
// into the tokenizer's tables and every other member goes through nlohmann::json. Errors carry
// line:column and the JSON path being read.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace scr::text {

class JsonCursor {
public:
    JsonCursor(std::string_view text, std::string_view origin) : s_(text), origin_(origin) {}

    void skip_ws() {
        while (pos_ < s_.size()) {
            const char c = s_[pos_];
            if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
            ++pos_;
        }
    }
    bool at_end() {
        skip_ws();
        return pos_ >= s_.size();
    }
    char peek() {
        skip_ws();
        return pos_ < s_.size() ? s_[pos_] : '\0';
    }
    bool consume(char c) {
        if (peek() != c) return false;
        ++pos_;
        return true;
    }
    void expect(char c, std::string_view path);
    // Reads a string into `out` (escapes decoded). Fast path: no escapes -> one append.
    void read_string(std::string& out, std::string_view path);
    long long read_integer(std::string_view path);
    // Skips one value and returns its source text.
    std::string_view skip_value(std::string_view path);
    size_t position() const { return pos_; }

    [[noreturn]] void fail(std::string_view path, std::string_view what) const;

private:
    void skip_string(std::string_view path);

    std::string_view s_;
    std::string_view origin_;
    size_t pos_ = 0;
};

}  // namespace scr::text
