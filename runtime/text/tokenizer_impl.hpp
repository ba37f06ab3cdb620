// Internals of the tokenizer pipeline, mirroring the stages of Hugging Face `tokenizers`:
// added-token extraction -> normalizer -> pre-tokenizer -> model (BPE) -> post-processor, and
// decoders on the way back. Only tokenizer*.cpp, the tests and the benchmark include this.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace scr::text {

// ---- Tables ---------------------------------------------------------------------------------

// Token strings by id, stored in one arena; ids may be sparse.
class TokenTable {
public:
    void reserve(size_t n_tokens, size_t n_bytes) {
        spans_.reserve(n_tokens);
        arena_.reserve(n_bytes);
    }
    void set(int32_t id, std::string_view token);
    std::string_view get(int32_t id) const {
        if (id < 0 || static_cast<size_t>(id) >= spans_.size()) return {};
        const auto& sp = spans_[static_cast<size_t>(id)];
        if (sp.second == kAbsent) return {};
        return std::string_view(arena_).substr(sp.first, sp.second);
    }
    // Where get(id) lives in the arena; only for ids that are present.
    std::pair<uint32_t, uint32_t> span(int32_t id) const { return spans_[static_cast<size_t>(id)]; }
    const char* arena() const { return arena_.data(); }
    bool has(int32_t id) const {
        return id >= 0 && static_cast<size_t>(id) < spans_.size() &&
               spans_[static_cast<size_t>(id)].second != kAbsent;
    }
    size_t id_limit() const { return spans_.size(); }

private:
    static constexpr uint32_t kAbsent = 0xFFFFFFFFu;
    std::string arena_;
    std::vector<std::pair<uint32_t, uint32_t>> spans_;
};

// Open-addressing map token string -> id over a TokenTable (keys are not copied).
class TokenIndex {
public:
    void build(const TokenTable& table, const std::vector<int32_t>& ids);
    int32_t find(std::string_view token) const { return find(token, hash(token)); }  // -1 when absent
    // Split form for batched lookups: hash, prefetch the slot, find later (hides cache misses
    // while loading 100k+ merges).
    static size_t hash(std::string_view token) { return std::hash<std::string_view>{}(token); }
    void prefetch(size_t h) const { __builtin_prefetch(&slots_[h & mask_]); }
    int32_t find(std::string_view token, size_t h) const;
    // Inserts or overwrites; returns false if the table was full (never: sized 2x).
    void insert(std::string_view token, int32_t id);

private:
    // A slot keeps 32 bits of the hash so most probes never touch the token text.
    // The token's place in the table's arena is in the slot too: a probe costs one cache miss.
    struct Slot {
        uint32_t tag;
        int32_t id;  // -1 = empty
        uint32_t offset, length;
    };
    const TokenTable* table_ = nullptr;
    std::vector<Slot> slots_;
    size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id), open addressing.
class PairMap {
public:
    struct Entry {
        uint64_t key;
        uint32_t rank;
        int32_t merged;
    };
    void reserve(size_t n);
    void insert(int32_t left, int32_t right, uint32_t rank, int32_t merged);
    void prefetch(int32_t left, int32_t right) const { __builtin_prefetch(&slots_[hash(make_key(left, right)) & mask_]); }
    const Entry* find(int32_t left, int32_t right) const {
        if (slots_.empty()) return nullptr;
        const uint64_t key = make_key(left, right);
        size_t i = hash(key) & mask_;
        while (true) {
            const Entry& e = slots_[i];
            if (e.key == key) return &e;
            if (e.key == kEmpty) return nullptr;
            i = (i + 1) & mask_;
        }
    }
    size_t size() const { return size_; }

private:
    static constexpr uint64_t kEmpty = ~0ull;
    static uint64_t make_key(int32_t l, int32_t r) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
    }
    // Fibonacci hashing: the top bits of the product are the well-mixed ones.
    size_t hash(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_); }
    std::vector<Entry> slots_;
    size_t mask_ = 0;
    unsigned shift_ = 63;
    size_t size_ = 0;
};

// ---- Regex (PCRE2, UTF + UCP so \p{L}, \s, \w are Unicode-aware like Oniguruma's) ----------

class Regex {
public:
    explicit Regex(const std::string& pattern, std::string_view where);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;
    // All non-overlapping matches as (start, end) byte offsets.
    void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

private:
    pcre2_code* code_ = nullptr;
};

// A Split/Replace pattern: {"String": "..."} or {"Regex": "..."}.
struct Pattern {
    std::string literal;
    std::unique_ptr<Regex> regex;
    void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
};
Pattern parse_pattern(const nlohmann::json& j, std::string_view where);

// ---- Pipeline stages ------------------------------------------------------------------------

// A piece of the input on its way to the model. `at_origin`: starts at offset 0 of the input
// (Metaspace's prepend_scheme "first" looks at it).
struct Piece {
    std::string text;
    bool at_origin = false;
};

struct Normalizer {
    virtual ~Normalizer() = default;
    virtual void normalize(std::string& s) const = 0;
};

struct PreTokenizer {
    virtual ~PreTokenizer() = default;
    // Replaces `pieces` by their splits.
    virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

struct Decoder {
    virtual ~Decoder() = default;
    virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

struct PostProcessor {
    virtual ~PostProcessor() = default;
    virtual void process(std::vector<int32_t>& ids) const = 0;
    // The ids it puts before / after the sequence (for bos_id discovery).
    virtual std::vector<int32_t> prefix_ids() const { return {}; }
};

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where);
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const std::string& where,
                                                   const class TokenIndex& vocab_index,
                                                   const TokenTable& tokens);

// GPT-2's reversible byte <-> printable code point map used by ByteLevel.
struct ByteLevelMap {
    char enc[256][3];      // UTF-8 of the code point for each byte (NUL-terminated, 1-2 bytes)
    uint8_t enc_len[256];
    int16_t dec[512];      // code point -> byte, -1 if not in the map (all code points are < 512)
    ByteLevelMap();

    // Appends the bytes a ByteLevel token stands for; a token with a code point outside the map
    // keeps its raw bytes (as tokenizers does).
    void append_decoded(std::string& bytes, std::string_view token) const;
};
const ByteLevelMap& byte_level_map();

// ---- The BPE model ---------------------------------------------------------------------------

struct BpeModel {
    PairMap merges;
    std::optional<int32_t> unk_id;
    bool fuse_unk = false;
    bool byte_fallback = false;
    bool ignore_merges = false;
    std::string continuing_subword_prefix;
    std::string end_of_word_suffix;
    int32_t byte_token_ids[256];  // <0xXX> tokens for byte fallback, -1 if absent

    // Appends the ids of one pre-token.
    void tokenize(std::string_view word, std::vector<int32_t>& out) const;

    const TokenIndex* vocab = nullptr;

    // Word cache (like tokenizers' BPE cache): words up to kCacheMaxWordBytes, at most
    // kCacheCapacity entries; shared between threads.
    static constexpr size_t kCacheCapacity = 50000;
    static constexpr size_t kCacheMaxWordBytes = 256;
    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    mutable std::shared_mutex cache_mutex;
    mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

private:
    void merge_word(std::string_view word, std::vector<int32_t>& out) const;
};

// ---- Added tokens -----------------------------------------------------------------------------

struct AddedToken {
    int32_t id = -1;
    std::string content;
    bool special = false;
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
    bool normalized = false;
};

// Leftmost-longest matching of a set of strings (what tokenizers does with aho-corasick).
class AddedTokenMatcher {
public:
    void add(std::string_view pattern, int32_t token_index);
    bool empty() const { return nodes_.size() <= 1; }
    // First match at or after `from`: (start, end, token_index); start == npos when none.
    struct Match {
        size_t start, end;
        int32_t token;
    };
    Match find(std::string_view s, size_t from) const;

private:
    struct Node {
        std::vector<std::pair<uint8_t, uint32_t>> children;
        int32_t token = -1;
    };
    std::vector<Node> nodes_{1};
    bool first_byte_[256] = {};
};

// ---- Everything loaded --------------------------------------------------------------------

struct TokenizerData {
    TokenTable tokens;   // model vocab + added tokens
    TokenIndex index;    // string -> id over the same
    BpeModel bpe;
    std::vector<AddedToken> added;
    std::vector<int32_t> added_index_by_id;  // id -> index into `added`, -1 if not added
    AddedTokenMatcher raw_matcher;           // tokens with normalized=false
    AddedTokenMatcher normalized_matcher;    // tokens with normalized=true (matched after normalizing)
    std::unique_ptr<Normalizer> normalizer;
    std::unique_ptr<PreTokenizer> pre_tokenizer;
    std::unique_ptr<Decoder> decoder;
    std::unique_ptr<PostProcessor> post_processor;
    bool decoder_is_plain_byte_level = false;  // fast decode path
    int vocab_size = 0;
    std::optional<int32_t> bos, eos;
    std::vector<int32_t> end_of_turn;
    nlohmann::json special_strings = nlohmann::json::object();  // bos_token, eos_token, ...

    bool is_special(int32_t id) const {
        if (id < 0 || static_cast<size_t>(id) >= added_index_by_id.size()) return false;
        const int32_t k = added_index_by_id[static_cast<size_t>(id)];
        return k >= 0 && added[static_cast<size_t>(k)].special;
    }
};

}  // namespace scr::text
