// UTF-8 helpers shared by the tokenizer and the Jinja engine. Decoding of invalid input follows the
// "maximal subpart" rule (Unicode ch. 3, also Rust's String::from_utf8_lossy and WHATWG TextDecoder):
// each maximal invalid subsequence becomes one U+FFFD, so our lossy output matches both references.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace scr::text::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

inline void append(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

// Length of the valid sequence starting at s[i], or 0 when s[i..] starts an invalid sequence; in
// that case `bad_len` receives the length of the maximal invalid subpart (>= 1).
inline size_t valid_seq_len(std::string_view s, size_t i, size_t& bad_len) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    bad_len = 1;
    if (b0 < 0x80) return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;  // no surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (size_t k = 1; k <= need; ++k) {
        if (i + k >= s.size()) return 0;
        const auto b = static_cast<unsigned char>(s[i + k]);
        const unsigned char l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
        if (b < l || b > h) return 0;
        bad_len = k + 1;
    }
    return need + 1;
}

inline bool is_valid(std::string_view s) {
    size_t bad;
    for (size_t i = 0; i < s.size();) {
        const size_t n = valid_seq_len(s, i, bad);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

// Appends s to out with invalid sequences replaced by U+FFFD.
inline void append_lossy(std::string& out, std::string_view s) {
    size_t bad;
    size_t run = 0;  // start of the current run of valid bytes
    size_t i = 0;
    while (i < s.size()) {
        const size_t n = valid_seq_len(s, i, bad);
        if (n != 0) {
            i += n;
            continue;
        }
        out.append(s.substr(run, i - run));
        out.append(kReplacement);
        i += bad;
        run = i;
    }
    out.append(s.substr(run));
}

inline std::string lossy(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    append_lossy(out, s);
    return out;
}

// Decodes one code point at s[i] (s must be valid UTF-8) and advances i.
inline char32_t next(std::string_view s, size_t& i) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
        ++i;
        return b0;
    }
    if (b0 < 0xE0) {
        char32_t cp = ((b0 & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
        i += 2;
        return cp;
    }
    if (b0 < 0xF0) {
        char32_t cp = ((b0 & 0x0F) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 6) |
                      (static_cast<unsigned char>(s[i + 2]) & 0x3F);
        i += 3;
        return cp;
    }
    char32_t cp = ((b0 & 0x07) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3F) << 12) |
                  ((static_cast<unsigned char>(s[i + 2]) & 0x3F) << 6) |
                  (static_cast<unsigned char>(s[i + 3]) & 0x3F);
    i += 4;
    return cp;
}

// Byte length of the (valid) sequence whose lead byte is b.
inline size_t seq_len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

// Number of code points in valid UTF-8.
inline size_t count(std::string_view s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

// Byte offset of the code point with index `cp_index` (clamped to s.size()).
inline size_t offset_of(std::string_view s, size_t cp_index) {
    size_t i = 0;
    while (i < s.size() && cp_index > 0) {
        i += seq_len(static_cast<unsigned char>(s[i]));
        --cp_index;
    }
    return i < s.size() ? i : s.size();
}

}  // namespace scr::text::utf8
