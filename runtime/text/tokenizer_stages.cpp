// Normalizers, pre-tokenizers, decoders and post-processors of tokenizer.json, each following the
// corresponding struct of Hugging Face `tokenizers` (tokenizers/src/{normalizers,pre_tokenizers,
// decoders,processors}/). Unknown types are errors naming the type and the JSON path.
#include <utf8proc.h>

#include <algorithm>
#include <cstring>

#include "runtime/core/error.hpp"
#include "runtime/text/tokenizer_impl.hpp"
#include "runtime/text/utf8.hpp"

namespace scr::text {

using nlohmann::json;

namespace {

// Rust's char::is_whitespace (the Unicode White_Space property).
bool is_unicode_whitespace(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

const json& member(const json& j, const char* key, const std::string& where) {
    if (!j.is_object() || !j.contains(key)) scr::fail("{}: missing \"{}\"", where, key);
    return j.at(key);
}

std::string get_string(const json& j, const char* key, const std::string& where) {
    const json& v = member(j, key, where);
    if (!v.is_string()) scr::fail("{}.{}: expected a string", where, key);
    return v.get<std::string>();
}

bool get_bool(const json& j, const char* key, bool fallback, const std::string& where) {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    if (!j.at(key).is_boolean()) scr::fail("{}.{}: expected true/false", where, key);
    return j.at(key).get<bool>();
}

const json& get_array(const json& j, const char* key, const std::string& where) {
    const json& v = member(j, key, where);
    if (!v.is_array()) scr::fail("{}.{}: expected an array", where, key);
    return v;
}

std::string type_of(const json& j, const std::string& where) {
    if (!j.is_object()) scr::fail("{}: expected an object", where);
    return get_string(j, "type", where);
}

// Replaces every match of `pattern` in s by `content`.
void replace_all(const Pattern& pattern, const std::string& content, std::string& s) {
    thread_local std::vector<std::pair<size_t, size_t>> matches;
    matches.clear();
    pattern.find_all(s, matches);
    if (matches.empty()) return;
    std::string out;
    out.reserve(s.size() + matches.size() * content.size());
    size_t prev = 0;
    for (auto [a, b] : matches) {
        out.append(s, prev, a - prev);
        out.append(content);
        prev = b;
    }
    out.append(s, prev, std::string::npos);
    s.swap(out);
}

bool all_ascii(std::string_view s) {
    for (unsigned char c : s)
        if (c >= 0x80) return false;
    return true;
}

}  // namespace

// ---- Regex ----------------------------------------------------------------------------------

Regex::Regex(const std::string& pattern, std::string_view where) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
    if (code_ == nullptr) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(err, buf, sizeof buf);
        scr::fail("{}: cannot compile regex /{}/ at offset {}: {}", where, pattern, err_off,
                  reinterpret_cast<const char*>(buf));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
    // One match-data block per thread, grown on demand: no allocation per call.
    struct MatchData {
        pcre2_match_data* md = nullptr;
        ~MatchData() { pcre2_match_data_free(md); }
    };
    thread_local MatchData tl;
    if (tl.md == nullptr) tl.md = pcre2_match_data_create(16, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    while (pos <= s.size()) {
        // Input is valid UTF-8 (sanitized at encode entry), so skip PCRE2's check.
        const int rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, tl.md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR buf[256];
            pcre2_get_error_message(rc, buf, sizeof buf);
            scr::fail("regex match failed: {}", reinterpret_cast<const char*>(buf));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tl.md);
        const size_t a = ov[0], b = ov[1];
        out.emplace_back(a, b);
        if (b > a) {
            pos = b;
        } else {
            // Empty match: step over one code point.
            if (a >= s.size()) break;
            pos = a + utf8::seq_len(static_cast<unsigned char>(s[a]));
        }
    }
}

void Pattern::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
    if (regex) {
        regex->find_all(s, out);
        return;
    }
    if (literal.empty()) return;
    size_t pos = 0;
    while ((pos = s.find(literal, pos)) != std::string_view::npos) {
        out.emplace_back(pos, pos + literal.size());
        pos += literal.size();
    }
}

Pattern parse_pattern(const json& j, std::string_view where) {
    Pattern p;
    if (j.is_object() && j.contains("String") && j["String"].is_string()) {
        p.literal = j["String"].get<std::string>();
    } else if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
        p.regex = std::make_unique<Regex>(j["Regex"].get<std::string>(), where);
    } else if (j.is_string()) {
        p.literal = j.get<std::string>();
    } else {
        scr::fail("{}: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
    }
    return p;
}

// ---- ByteLevel map ----------------------------------------------------------------------------

ByteLevelMap::ByteLevelMap() {
    std::fill(std::begin(dec), std::end(dec), int16_t{-1});
    int n = 0;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
        std::string s;
        utf8::append(s, cp);
        std::memset(enc[b], 0, sizeof enc[b]);
        std::memcpy(enc[b], s.data(), s.size());
        enc_len[b] = static_cast<uint8_t>(s.size());
        dec[cp] = static_cast<int16_t>(b);
    }
}

void ByteLevelMap::append_decoded(std::string& bytes, std::string_view token) const {
    const size_t before = bytes.size();
    for (size_t i = 0; i < token.size();) {
        const char32_t c = utf8::next(token, i);
        if (c >= 512 || dec[c] < 0) {
            bytes.resize(before);
            bytes.append(token);
            return;
        }
        bytes.push_back(static_cast<char>(dec[c]));
    }
}

const ByteLevelMap& byte_level_map() {
    static const ByteLevelMap map;
    return map;
}

// ---- Normalizers ----------------------------------------------------------------------------

namespace {

struct UnicodeNormalizer final : Normalizer {
    int options;
    bool ascii_is_fixed_point;
    explicit UnicodeNormalizer(int opts) : options(opts), ascii_is_fixed_point(true) {}
    void normalize(std::string& s) const override {
        if (ascii_is_fixed_point && all_ascii(s)) return;
        utf8proc_uint8_t* out = nullptr;
        const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out,
                                    static_cast<utf8proc_option_t>(options));
        if (n < 0) scr::fail("unicode normalization failed: {}", utf8proc_errmsg(n));
        s.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
        std::free(out);
    }
};

struct LowercaseNormalizer final : Normalizer {
    void normalize(std::string& s) const override {
        std::string out;
        out.reserve(s.size());
        for (size_t i = 0; i < s.size();) utf8::append(out, static_cast<char32_t>(utf8proc_tolower(
                                                                 static_cast<utf8proc_int32_t>(utf8::next(s, i)))));
        s.swap(out);
    }
};

struct StripNormalizer final : Normalizer {
    bool left, right;
    void normalize(std::string& s) const override {
        size_t a = 0, b = s.size();
        if (left) {
            while (a < b) {
                size_t j = a;
                if (!is_unicode_whitespace(utf8::next(s, j))) break;
                a = j;
            }
        }
        if (right) {
            while (b > a) {
                size_t k = b - 1;
                while (k > a && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
                size_t j = k;
                if (!is_unicode_whitespace(utf8::next(s, j))) break;
                b = k;
            }
        }
        s = s.substr(a, b - a);
    }
};

struct StripAccentsNormalizer final : Normalizer {
    void normalize(std::string& s) const override {
        std::string out;
        out.reserve(s.size());
        for (size_t i = 0; i < s.size();) {
            const char32_t c = utf8::next(s, i);
            if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) != UTF8PROC_CATEGORY_MN) utf8::append(out, c);
        }
        s.swap(out);
    }
};

struct ReplaceNormalizer final : Normalizer {
    Pattern pattern;
    std::string content;
    void normalize(std::string& s) const override { replace_all(pattern, content, s); }
};

struct PrependNormalizer final : Normalizer {
    std::string prepend;
    void normalize(std::string& s) const override {
        if (!s.empty()) s.insert(0, prepend);
    }
};

struct SequenceNormalizer final : Normalizer {
    std::vector<std::unique_ptr<Normalizer>> steps;
    void normalize(std::string& s) const override {
        for (const auto& n : steps) n->normalize(s);
    }
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
    if (j.is_null()) return nullptr;
    const std::string type = type_of(j, where);
    if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    if (type == "NFKC")
        return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    if (type == "NFKD")
        return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
    if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
    if (type == "Strip") {
        auto n = std::make_unique<StripNormalizer>();
        n->left = get_bool(j, "strip_left", true, where);
        n->right = get_bool(j, "strip_right", true, where);
        return n;
    }
    if (type == "Replace") {
        auto n = std::make_unique<ReplaceNormalizer>();
        n->pattern = parse_pattern(member(j, "pattern", where), where + ".pattern");
        n->content = get_string(j, "content", where);
        return n;
    }
    if (type == "Prepend") {
        auto n = std::make_unique<PrependNormalizer>();
        n->prepend = get_string(j, "prepend", where);
        return n;
    }
    if (type == "Sequence") {
        auto n = std::make_unique<SequenceNormalizer>();
        const json& list = get_array(j, "normalizers", where);
        for (size_t i = 0; i < list.size(); ++i)
            if (auto step = make_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i)))
                n->steps.push_back(std::move(step));
        return n;
    }
    scr::fail("{}: normalizer type \"{}\" is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, "
              "Strip, StripAccents, Replace, Prepend, Sequence)",
              where, type);
}

// ---- Pre-tokenizers ---------------------------------------------------------------------------

namespace {

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

SplitBehavior parse_behavior(const json& j, const std::string& where) {
    const std::string b = j.is_string() ? j.get<std::string>() : "";
    if (b == "Removed") return SplitBehavior::Removed;
    if (b == "Isolated") return SplitBehavior::Isolated;
    if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (b == "Contiguous") return SplitBehavior::Contiguous;
    scr::fail("{}: unknown split behavior \"{}\"", where, b);
}

struct Segment {
    size_t start, end;
    bool is_match;
};

// tokenizers' NormalizedString::split: segments covering the piece, folded by behavior, empty
// segments dropped.
void split_piece(Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out) {
    thread_local std::vector<Segment> segs;
    thread_local std::vector<Segment> folded;
    segs.clear();
    folded.clear();
    const std::string& s = piece.text;
    size_t prev = 0;
    for (auto [a, b] : matches) {
        if (prev != a) segs.push_back({prev, a, invert});
        segs.push_back({a, b, !invert});
        prev = b;
    }
    if (prev != s.size()) segs.push_back({prev, s.size(), invert});

    switch (behavior) {
        case SplitBehavior::Isolated: folded = segs; break;
        case SplitBehavior::Removed:
            for (const auto& g : segs)
                if (!g.is_match) folded.push_back(g);
            break;
        case SplitBehavior::MergedWithPrevious: {
            bool previous_match = false;
            for (const auto& g : segs) {
                if (g.is_match && !previous_match && !folded.empty()) {
                    folded.back().end = g.end;
                } else {
                    folded.push_back({g.start, g.end, false});
                }
                previous_match = g.is_match;
            }
            break;
        }
        case SplitBehavior::MergedWithNext: {
            bool previous_match = false;
            for (size_t k = segs.size(); k-- > 0;) {
                const auto& g = segs[k];
                if (g.is_match && !previous_match && !folded.empty()) {
                    folded.back().start = g.start;
                } else {
                    folded.push_back({g.start, g.end, false});
                }
                previous_match = g.is_match;
            }
            std::reverse(folded.begin(), folded.end());
            break;
        }
        case SplitBehavior::Contiguous: {
            int previous = -1;
            for (const auto& g : segs) {
                if (previous == static_cast<int>(g.is_match) && !folded.empty()) {
                    folded.back().end = g.end;
                } else {
                    folded.push_back(g);
                }
                previous = g.is_match;
            }
            break;
        }
    }
    if (folded.size() == 1 && folded[0].start == 0 && folded[0].end == s.size()) {
        out.push_back(std::move(piece));
        return;
    }
    for (const auto& g : folded) {
        if (g.start == g.end) continue;
        out.push_back(Piece{s.substr(g.start, g.end - g.start), piece.at_origin && g.start == 0});
    }
}

// Applies `fn(piece, out)` to every piece.
template <typename Fn>
void for_each_piece(std::vector<Piece>& pieces, Fn&& fn) {
    thread_local std::vector<Piece> out;
    out.clear();
    for (auto& p : pieces) fn(p, out);
    pieces.swap(out);
}

struct SplitPreTokenizer final : PreTokenizer {
    Pattern pattern;
    SplitBehavior behavior;
    bool invert;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        thread_local std::vector<std::pair<size_t, size_t>> matches;
        for_each_piece(pieces, [&](Piece& p, std::vector<Piece>& out) {
            matches.clear();
            pattern.find_all(p.text, matches);
            split_piece(p, matches, behavior, invert, out);
        });
    }
};

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
const Regex& gpt2_regex() {
    static const Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                          "ByteLevel");
    return re;
}

struct ByteLevelPreTokenizer final : PreTokenizer {
    bool add_prefix_space, use_regex;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        if (add_prefix_space || use_regex) {
            thread_local std::vector<std::pair<size_t, size_t>> matches;
            for_each_piece(pieces, [&](Piece& p, std::vector<Piece>& out) {
                if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
                if (!use_regex) {
                    out.push_back(std::move(p));
                    return;
                }
                matches.clear();
                gpt2_regex().find_all(p.text, matches);
                split_piece(p, matches, SplitBehavior::Isolated, false, out);
            });
        }
        const ByteLevelMap& map = byte_level_map();
        std::string mapped;
        for (auto& p : pieces) {
            mapped.clear();
            for (unsigned char c : p.text) mapped.append(map.enc[c], map.enc_len[c]);
            p.text.swap(mapped);
        }
    }
};

struct MetaspacePreTokenizer final : PreTokenizer {
    std::string replacement;
    enum class Prepend { Always, First, Never } prepend;
    bool split;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        std::vector<std::pair<size_t, size_t>> matches;
        for_each_piece(pieces, [&](Piece& p, std::vector<Piece>& out) {
            std::string replaced;
            for (char c : p.text) {
                if (c == ' ') replaced += replacement;
                else replaced.push_back(c);
            }
            p.text.swap(replaced);
            const bool starts = p.text.compare(0, replacement.size(), replacement) == 0;
            if (!starts && (prepend == Prepend::Always || (prepend == Prepend::First && p.at_origin)))
                p.text.insert(0, replacement);
            if (!split) {
                out.push_back(std::move(p));
                return;
            }
            matches.clear();
            size_t pos = 0;
            while ((pos = p.text.find(replacement, pos)) != std::string::npos) {
                matches.emplace_back(pos, pos + replacement.size());
                pos += replacement.size();
            }
            split_piece(p, matches, SplitBehavior::MergedWithNext, false, out);
        });
    }
};

// Splits by a per-code-point predicate (Digits, Punctuation, whitespace).
template <typename Pred>
void split_by_char(std::vector<Piece>& pieces, Pred&& is_delim, SplitBehavior behavior) {
    std::vector<std::pair<size_t, size_t>> matches;
    for_each_piece(pieces, [&](Piece& p, std::vector<Piece>& out) {
        matches.clear();
        for (size_t i = 0; i < p.text.size();) {
            const size_t start = i;
            const char32_t c = utf8::next(p.text, i);
            if (is_delim(c)) matches.emplace_back(start, i);
        }
        split_piece(p, matches, behavior, false, out);
    });
}

bool is_numeric(char32_t c) {
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t c) {
    if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

struct DigitsPreTokenizer final : PreTokenizer {
    bool individual;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        split_by_char(pieces, is_numeric, individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous);
    }
};

struct PunctuationPreTokenizer final : PreTokenizer {
    SplitBehavior behavior = SplitBehavior::Isolated;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        split_by_char(pieces, is_punctuation, behavior);
    }
};

struct WhitespaceSplitPreTokenizer final : PreTokenizer {
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        split_by_char(pieces, is_unicode_whitespace, SplitBehavior::Removed);
    }
};

struct WhitespacePreTokenizer final : PreTokenizer {
    Regex re{R"(\w+|[^\w\s]+)", "Whitespace"};
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        std::vector<std::pair<size_t, size_t>> matches;
        for_each_piece(pieces, [&](Piece& p, std::vector<Piece>& out) {
            matches.clear();
            re.find_all(p.text, matches);
            split_piece(p, matches, SplitBehavior::Removed, true, out);
        });
    }
};

struct SequencePreTokenizer final : PreTokenizer {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    void pre_tokenize(std::vector<Piece>& pieces) const override {
        for (const auto& p : steps) p->pre_tokenize(pieces);
    }
};

// Metaspace's prepend_scheme (newer files) or add_prefix_space (older ones).
MetaspacePreTokenizer::Prepend parse_prepend_scheme(const json& j, const std::string& where) {
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
        const auto s = j["prepend_scheme"].get<std::string>();
        if (s == "always") return MetaspacePreTokenizer::Prepend::Always;
        if (s == "first") return MetaspacePreTokenizer::Prepend::First;
        if (s == "never") return MetaspacePreTokenizer::Prepend::Never;
        scr::fail("{}.prepend_scheme: unknown value \"{}\"", where, s);
    }
    return get_bool(j, "add_prefix_space", true, where) ? MetaspacePreTokenizer::Prepend::Always
                                                         : MetaspacePreTokenizer::Prepend::Never;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
    if (j.is_null()) return nullptr;
    const std::string type = type_of(j, where);
    if (type == "Split") {
        auto p = std::make_unique<SplitPreTokenizer>();
        p->pattern = parse_pattern(member(j, "pattern", where), where + ".pattern");
        p->behavior = parse_behavior(member(j, "behavior", where), where + ".behavior");
        p->invert = get_bool(j, "invert", false, where);
        return p;
    }
    if (type == "ByteLevel") {
        auto p = std::make_unique<ByteLevelPreTokenizer>();
        p->add_prefix_space = get_bool(j, "add_prefix_space", true, where);
        p->use_regex = get_bool(j, "use_regex", true, where);
        return p;
    }
    if (type == "Metaspace") {
        auto p = std::make_unique<MetaspacePreTokenizer>();
        p->replacement = j.contains("replacement") ? get_string(j, "replacement", where) : "\u2581";
        if (utf8::count(p->replacement) != 1) scr::fail("{}.replacement: must be one character", where);
        p->prepend = parse_prepend_scheme(j, where);
        p->split = get_bool(j, "split", true, where);
        return p;
    }
    if (type == "Digits") {
        auto p = std::make_unique<DigitsPreTokenizer>();
        p->individual = get_bool(j, "individual_digits", false, where);
        return p;
    }
    if (type == "Punctuation") {
        auto p = std::make_unique<PunctuationPreTokenizer>();
        if (j.contains("behavior")) p->behavior = parse_behavior(j["behavior"], where + ".behavior");
        return p;
    }
    if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
    if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
    if (type == "BertPreTokenizer") {
        auto p = std::make_unique<SequencePreTokenizer>();
        p->steps.push_back(std::make_unique<WhitespaceSplitPreTokenizer>());
        p->steps.push_back(std::make_unique<PunctuationPreTokenizer>());
        return p;
    }
    if (type == "Sequence") {
        auto p = std::make_unique<SequencePreTokenizer>();
        const json& list = get_array(j, "pretokenizers", where);
        for (size_t i = 0; i < list.size(); ++i)
            if (auto step = make_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i)))
                p->steps.push_back(std::move(step));
        return p;
    }
    scr::fail("{}: pre-tokenizer type \"{}\" is not supported (supported: Split, ByteLevel, Metaspace, "
              "Digits, Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer, Sequence)",
              where, type);
}

// ---- Decoders ---------------------------------------------------------------------------------

namespace {

struct ByteLevelDecoder final : Decoder {
    void decode_chain(std::vector<std::string>& tokens) const override {
        const ByteLevelMap& map = byte_level_map();
        std::string bytes;
        for (const auto& t : tokens) map.append_decoded(bytes, t);
        tokens.clear();
        tokens.push_back(utf8::lossy(bytes));
    }
};

struct ReplaceDecoder final : Decoder {
    Pattern pattern;
    std::string content;
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (auto& t : tokens) replace_all(pattern, content, t);
    }
};

int byte_token_value(std::string_view t) {
    auto hex = [](char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    const int h = hex(t[3]), l = hex(t[4]);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
}

struct ByteFallbackDecoder final : Decoder {
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::vector<std::string> out;
        out.reserve(tokens.size());
        std::string pending;
        auto flush = [&] {
            if (pending.empty()) return;
            if (utf8::is_valid(pending)) {
                out.push_back(pending);
            } else {
                for (size_t k = 0; k < pending.size(); ++k) out.emplace_back(utf8::kReplacement);
            }
            pending.clear();
        };
        for (auto& t : tokens) {
            const int b = byte_token_value(t);
            if (b >= 0) {
                pending.push_back(static_cast<char>(b));
            } else {
                flush();
                out.push_back(std::move(t));
            }
        }
        flush();
        tokens.swap(out);
    }
};

struct FuseDecoder final : Decoder {
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::string all;
        for (const auto& t : tokens) all += t;
        tokens.clear();
        tokens.push_back(std::move(all));
    }
};

struct StripDecoder final : Decoder {
    std::string content;  // one character
    size_t start, stop;
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (auto& t : tokens) {
            size_t a = 0;
            for (size_t k = 0; k < start && t.compare(a, content.size(), content) == 0; ++k) a += content.size();
            size_t b = t.size();
            for (size_t k = 0; k < stop && b >= a + content.size() &&
                               t.compare(b - content.size(), content.size(), content) == 0;
                 ++k)
                b -= content.size();
            t = t.substr(a, b - a);
        }
    }
};

struct MetaspaceDecoder final : Decoder {
    std::string replacement;
    bool strip_first;  // prepend_scheme != never
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (size_t i = 0; i < tokens.size(); ++i) {
            std::string out;
            const std::string& t = tokens[i];
            for (size_t p = 0; p < t.size();) {
                if (t.compare(p, replacement.size(), replacement) == 0) {
                    // tokenizers drops every replacement char of the first token when prepending.
                    if (!(i == 0 && strip_first)) out.push_back(' ');
                    p += replacement.size();
                } else {
                    out.push_back(t[p++]);
                }
            }
            tokens[i].swap(out);
        }
    }
};

struct SequenceDecoder final : Decoder {
    std::vector<std::unique_ptr<Decoder>> steps;
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (const auto& d : steps) d->decode_chain(tokens);
    }
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where) {
    if (j.is_null()) return nullptr;
    const std::string type = type_of(j, where);
    if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
    if (type == "Replace") {
        auto d = std::make_unique<ReplaceDecoder>();
        d->pattern = parse_pattern(member(j, "pattern", where), where + ".pattern");
        d->content = get_string(j, "content", where);
        return d;
    }
    if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
    if (type == "Fuse") return std::make_unique<FuseDecoder>();
    if (type == "Strip") {
        auto d = std::make_unique<StripDecoder>();
        d->content = get_string(j, "content", where);
        if (utf8::count(d->content) != 1) scr::fail("{}.content: must be one character", where);
        const json& a = member(j, "start", where);
        const json& b = member(j, "stop", where);
        if (!a.is_number_unsigned() || !b.is_number_unsigned())
            scr::fail("{}: start/stop must be non-negative integers", where);
        d->start = a.get<size_t>();
        d->stop = b.get<size_t>();
        return d;
    }
    if (type == "Metaspace") {
        auto d = std::make_unique<MetaspaceDecoder>();
        d->replacement = j.contains("replacement") ? get_string(j, "replacement", where) : "\u2581";
        d->strip_first = parse_prepend_scheme(j, where) != MetaspacePreTokenizer::Prepend::Never;
        return d;
    }
    if (type == "Sequence") {
        auto d = std::make_unique<SequenceDecoder>();
        const json& list = get_array(j, "decoders", where);
        for (size_t i = 0; i < list.size(); ++i)
            if (auto step = make_decoder(list[i], fmt::format("{}.decoders[{}]", where, i)))
                d->steps.push_back(std::move(step));
        return d;
    }
    scr::fail("{}: decoder type \"{}\" is not supported (supported: ByteLevel, Replace, ByteFallback, "
              "Fuse, Strip, Metaspace, Sequence)",
              where, type);
}

// ---- Post-processors ---------------------------------------------------------------------------

namespace {

struct TemplatePostProcessor final : PostProcessor {
    // Each item: the special ids to insert, or empty with is_sequence set.
    struct Item {
        bool is_sequence;
        std::vector<int32_t> ids;
    };
    std::vector<Item> single;
    void process(std::vector<int32_t>& ids) const override {
        std::vector<int32_t> out;
        for (const auto& item : single) {
            if (item.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
            else out.insert(out.end(), item.ids.begin(), item.ids.end());
        }
        ids.swap(out);
    }
    std::vector<int32_t> prefix_ids() const override {
        std::vector<int32_t> out;
        for (const auto& item : single) {
            if (item.is_sequence) break;
            out.insert(out.end(), item.ids.begin(), item.ids.end());
        }
        return out;
    }
};

struct WrapPostProcessor final : PostProcessor {  // RobertaProcessing / BertProcessing
    int32_t cls, sep;
    void process(std::vector<int32_t>& ids) const override {
        ids.insert(ids.begin(), cls);
        ids.push_back(sep);
    }
    std::vector<int32_t> prefix_ids() const override { return {cls}; }
};

struct NoopPostProcessor final : PostProcessor {  // ByteLevel: offsets only
    void process(std::vector<int32_t>&) const override {}
};

struct SequencePostProcessor final : PostProcessor {
    std::vector<std::unique_ptr<PostProcessor>> steps;
    void process(std::vector<int32_t>& ids) const override {
        for (const auto& s : steps) s->process(ids);
    }
    std::vector<int32_t> prefix_ids() const override {
        for (const auto& s : steps)
            if (auto p = s->prefix_ids(); !p.empty()) return p;
        return {};
    }
};

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where,
                                                   const TokenIndex& vocab_index, const TokenTable& tokens) {
    if (j.is_null()) return nullptr;
    const std::string type = type_of(j, where);
    if (type == "ByteLevel") return std::make_unique<NoopPostProcessor>();
    if (type == "TemplateProcessing") {
        auto p = std::make_unique<TemplatePostProcessor>();
        const json& specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
        auto special_ids = [&](const std::string& name, const std::string& at) {
            std::vector<int32_t> ids;
            if (specials.is_object() && specials.contains(name)) {
                const json& ids_json = member(specials[name], "ids", at);
                if (!ids_json.is_array()) scr::fail("{}: ids must be an array", at);
                for (const auto& v : ids_json) {
                    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
                        scr::fail("{}: ids must be non-negative 32-bit integers", at);
                    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
                }
            } else {
                const int32_t id = vocab_index.find(name);
                if (id < 0) scr::fail("{}: special token \"{}\" is not defined", at, name);
                ids.push_back(id);
            }
            return ids;
        };
        const json& single = member(j, "single", where);
        const std::string at = where + ".single";
        if (single.is_string()) {
            // "<s> $A </s>" short form.
            std::string s = single.get<std::string>();
            size_t pos = 0;
            while (pos < s.size()) {
                size_t end = s.find(' ', pos);
                if (end == std::string::npos) end = s.size();
                std::string piece = s.substr(pos, end - pos);
                pos = end + 1;
                if (piece.empty()) continue;
                if (auto colon = piece.rfind(':'); colon != std::string::npos && colon > 0) piece.resize(colon);
                if (piece[0] == '$') p->single.push_back({true, {}});
                else p->single.push_back({false, special_ids(piece, at)});
            }
        } else if (single.is_array()) {
            for (size_t i = 0; i < single.size(); ++i) {
                const json& item = single[i];
                const std::string item_at = fmt::format("{}[{}]", at, i);
                if (item.contains("Sequence")) {
                    p->single.push_back({true, {}});
                } else if (item.contains("SpecialToken")) {
                    p->single.push_back({false, special_ids(get_string(item["SpecialToken"], "id", item_at), item_at)});
                } else {
                    scr::fail("{}: expected {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}}", item_at);
                }
            }
        } else {
            scr::fail("{}: expected an array or a string", at);
        }
        return p;
    }
    if (type == "RobertaProcessing" || type == "BertProcessing") {
        auto p = std::make_unique<WrapPostProcessor>();
        auto read = [&](const char* key) {
            const json& v = member(j, key, where);
            if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer() || v[1].get<int64_t>() < 0 ||
                v[1].get<int64_t>() > INT32_MAX)
                scr::fail("{}.{}: expected [token, id]", where, key);
            return static_cast<int32_t>(v[1].get<int64_t>());
        };
        p->cls = read("cls");
        p->sep = read("sep");
        return p;
    }
    if (type == "Sequence") {
        auto p = std::make_unique<SequencePostProcessor>();
        const json& list = get_array(j, "processors", where);
        for (size_t i = 0; i < list.size(); ++i)
            if (auto step = make_post_processor(list[i], fmt::format("{}.processors[{}]", where, i), vocab_index, tokens))
                p->steps.push_back(std::move(step));
        return p;
    }
    scr::fail("{}: post-processor type \"{}\" is not supported (supported: TemplateProcessing, ByteLevel, "
              "RobertaProcessing, BertProcessing, Sequence)",
              where, type);
}

}  // namespace scr::text
