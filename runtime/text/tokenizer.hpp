// Hugging Face `tokenizer.json` tokenizers (BPE: byte-level GPT/Llama 3/Qwen style and SentencePiece
// style with byte fallback), written to give the same ids and text as the Python `tokenizers`
// library. See docs/TEXT.md for what is supported and where the references differ.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace scr::text {

struct TokenizerData;  // the loaded pipeline (tokenizer_impl.hpp)

class Tokenizer {
public:
    // Accepts a directory holding tokenizer.json (+ optional tokenizer_config.json,
    // generation_config.json) or the path of a tokenizer.json. Throws scr::Error naming the file and
    // the JSON path of anything malformed or unsupported.
    static std::unique_ptr<Tokenizer> load(const std::filesystem::path& dir_or_tokenizer_json);
    // Same, from in-memory texts (config texts may be empty). `origin` names the source in errors.
    static std::unique_ptr<Tokenizer> from_json_text(std::string_view tokenizer_json,
                                                     std::string_view tokenizer_config_json = {},
                                                     std::string_view generation_config_json = {},
                                                     std::string_view origin = "tokenizer.json");

    ~Tokenizer();
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    // Invalid UTF-8 in `text` is read as U+FFFD (as Python's errors="replace" would).
    std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
    // Ids outside the vocabulary are skipped (as `tokenizers` does). Always valid UTF-8.
    std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
    // Appends the decoding to `out` (no allocation once `out` has capacity, on the common paths).
    void decode_append(std::span<const int32_t> ids, bool skip_special_tokens, std::string& out) const;

    int vocab_size() const;  // highest id + 1, added tokens included
    std::optional<int32_t> token_to_id(std::string_view token) const;
    std::string_view id_to_token(int32_t id) const;  // "" for an unknown id
    bool is_special(int32_t id) const;
    std::optional<int32_t> bos_id() const;
    std::optional<int32_t> eos_id() const;
    // Every id that ends a turn: eos, generation_config.json's eos_token_id(s) and the end-of-turn
    // markers of known chat formats present in the vocabulary (<|eot_id|>, <|im_end|>, ...).
    std::vector<int32_t> eos_ids() const;
    // Special token strings from tokenizer_config.json (bos_token, eos_token, unk_token, pad_token),
    // for chat templates.
    std::optional<std::string> special_token_string(std::string_view name) const;

    const TokenizerData& data() const { return *data_; }

private:
    explicit Tokenizer(std::unique_ptr<TokenizerData> data);
    std::unique_ptr<TokenizerData> data_;
};

// Streaming detokenization: push ids one at a time; each push returns the newly completed text
// (always valid UTF-8); the concatenation of all pushes and flush() equals decode(all pushed ids).
// The algorithm is vLLM's (prefix/read offsets, hold back text ending in U+FFFD), see the .cpp.
class IncrementalDecoder {
public:
    IncrementalDecoder(const Tokenizer& tok, bool skip_special_tokens,
                       std::span<const int32_t> prompt_ids = {});
    std::string push(int32_t id);
    std::string flush();

private:
    void compact();

    const Tokenizer& tok_;
    bool skip_special_;
    std::vector<int32_t> ids_;  // a window of prompt tail + generated ids
    size_t prefix_offset_ = 0;
    size_t read_offset_ = 0;
    std::string prefix_text_;   // scratch: decode(ids[prefix_offset, read_offset))
    std::string new_text_;      // scratch: decode(ids[prefix_offset, end))
};

}  // namespace scr::text
