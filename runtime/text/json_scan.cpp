#include "runtime/text/json_scan.hpp"

#include <cstring>

#include "runtime/core/error.hpp"
#include "runtime/text/utf8.hpp"

namespace scr::text {

void JsonCursor::fail(std::string_view path, std::string_view what) const {
    size_t line = 1, col = 1;
    const size_t end = pos_ < s_.size() ? pos_ : s_.size();
    for (size_t i = 0; i < end; ++i) {
        if (s_[i] == '\n') {
            ++line;
            col = 1;
        } else {
            ++col;
        }
    }
    scr::fail("{}:{}:{}: {}: {}", origin_, line, col, path.empty() ? "(root)" : path, what);
}

void JsonCursor::expect(char c, std::string_view path) {
    if (!consume(c)) {
        if (pos_ >= s_.size()) fail(path, std::string("unexpected end of file, expected '") + c + "'");
        fail(path, std::string("expected '") + c + "', found '" + s_[pos_] + "'");
    }
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

void JsonCursor::read_string(std::string& out, std::string_view path) {
    out.clear();
    skip_ws();
    if (pos_ >= s_.size() || s_[pos_] != '"') fail(path, "expected a string");
    ++pos_;
    while (true) {
        // Copy the run up to the next quote or backslash in one go.
        size_t run = pos_;
        while (run < s_.size() && s_[run] != '"' && s_[run] != '\\') {
            if (static_cast<unsigned char>(s_[run]) < 0x20) {
                pos_ = run;
                fail(path, "control character inside a string");
            }
            ++run;
        }
        out.append(s_.data() + pos_, run - pos_);
        pos_ = run;
        if (pos_ >= s_.size()) fail(path, "unterminated string");
        if (s_[pos_] == '"') {
            ++pos_;
            break;
        }
        // Escape sequence.
        if (pos_ + 1 >= s_.size()) fail(path, "unterminated escape");
        const char e = s_[pos_ + 1];
        pos_ += 2;
        switch (e) {
            case '"': out.push_back('"'); break;
            case '\\': out.push_back('\\'); break;
            case '/': out.push_back('/'); break;
            case 'b': out.push_back('\b'); break;
            case 'f': out.push_back('\f'); break;
            case 'n': out.push_back('\n'); break;
            case 'r': out.push_back('\r'); break;
            case 't': out.push_back('\t'); break;
            case 'u': {
                auto read4 = [&]() -> char32_t {
                    if (pos_ + 4 > s_.size()) fail(path, "truncated \\u escape");
                    char32_t v = 0;
                    for (int k = 0; k < 4; ++k) {
                        const int h = hex_value(s_[pos_ + k]);
                        if (h < 0) fail(path, "bad hex digit in \\u escape");
                        v = (v << 4) | static_cast<char32_t>(h);
                    }
                    pos_ += 4;
                    return v;
                };
                char32_t cp = read4();
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    // A high surrogate must pair with a low one; a lone one becomes U+FFFD.
                    if (pos_ + 1 < s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
                        const size_t save = pos_;
                        pos_ += 2;
                        const char32_t lo = read4();
                        if (lo >= 0xDC00 && lo <= 0xDFFF) {
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        } else {
                            pos_ = save;
                            cp = 0xFFFD;
                        }
                    } else {
                        cp = 0xFFFD;
                    }
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    cp = 0xFFFD;
                }
                utf8::append(out, cp);
                break;
            }
            default: fail(path, std::string("invalid escape '\\") + e + "'");
        }
    }
}

long long JsonCursor::read_integer(std::string_view path) {
    skip_ws();
    const size_t start = pos_;
    bool neg = false;
    if (pos_ < s_.size() && s_[pos_] == '-') {
        neg = true;
        ++pos_;
    }
    long long v = 0;
    size_t digits = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (digits > 17) fail(path, "integer out of range");
        v = v * 10 + (s_[pos_] - '0');
        ++pos_;
        ++digits;
    }
    if (digits == 0) {
        pos_ = start;
        fail(path, "expected an integer");
    }
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E')) {
        pos_ = start;
        fail(path, "expected an integer, found a non-integer number");
    }
    return neg ? -v : v;
}

void JsonCursor::skip_string(std::string_view path) {
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
        const char c = s_[pos_];
        if (c == '"') {
            ++pos_;
            return;
        }
        pos_ += (c == '\\') ? 2 : 1;
    }
    fail(path, "unterminated string");
}

std::string_view JsonCursor::skip_value(std::string_view path) {
    skip_ws();
    const size_t start = pos_;
    if (pos_ >= s_.size()) fail(path, "unexpected end of file, expected a value");
    int depth = 0;
    do {
        skip_ws();
        if (pos_ >= s_.size()) fail(path, "unexpected end of file inside a value");
        const char c = s_[pos_];
        if (c == '"') {
            skip_string(path);
        } else if (c == '{' || c == '[') {
            ++depth;
            ++pos_;
        } else if (c == '}' || c == ']') {
            if (depth == 0) fail(path, "unbalanced bracket");
            --depth;
            ++pos_;
        } else {
            // Scalars and separators: let nlohmann validate them later.
            ++pos_;
            while (pos_ < s_.size() && std::strchr(",:{}[]\" \n\r\t", s_[pos_]) == nullptr) ++pos_;
        }
    } while (depth > 0);
    return s_.substr(start, pos_ - start);
}

}  // namespace scr::text
