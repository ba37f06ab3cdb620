// Streaming detokenization, transcribed from vLLM (commit 001999d):
//   vllm/v1/engine/detokenizer.py:47-88  IncrementalDetokenizer.from_new_request seeds the window
//     from the prompt; :90-123 update() pushes ids one by one;
//   vllm/transformers_utils/detokenizer_utils.py:53-75  convert_prompt_ids_to_tokens: the window
//     starts 5 tokens before the end of the prompt (read_offset = end of prompt);
//   vllm/transformers_utils/detokenizer_utils.py:163-190  detokenize_incrementally: decode the
//     window [prefix_offset, read_offset) and [prefix_offset, end); emit the difference unless
//     the new text ends in U+FFFD (an unfinished UTF-8 sequence), then slide the window.
// Decoding a window rather than single tokens keeps decoder context (leading-space stripping,
// byte fallback) identical to a full decode.
#include <algorithm>

#include "runtime/text/tokenizer.hpp"
#include "runtime/text/tokenizer_impl.hpp"
#include "runtime/text/utf8.hpp"

namespace scr::text {

namespace {
constexpr size_t kInitialOffset = 5;  // vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET
constexpr size_t kCompactAt = 256;    // drop consumed ids once this many precede the window

bool ends_with_replacement(const std::string& s) {
    return s.size() >= 3 && std::string_view(s).substr(s.size() - 3) == utf8::kReplacement;
}

// Whether a token's first byte continues a UTF-8 sequence begun by an earlier token (byte-fallback
// <0x80>..<0xBF> tokens, or byte-level tokens whose first mapped byte is 10xxxxxx).
bool starts_mid_character(const TokenizerData& d, int32_t id) {
    const std::string_view t = d.tokens.get(id);
    if (t.empty()) return false;
    unsigned first;
    if (t.size() == 6 && t.substr(0, 3) == "<0x" && t[5] == '>') {
        first = static_cast<unsigned>(std::stoul(std::string(t.substr(3, 2)), nullptr, 16));
    } else if (d.decoder_is_plain_byte_level) {
        size_t i = 0;
        const char32_t c = utf8::next(t, i);
        first = (c < 512 && byte_level_map().dec[c] >= 0) ? static_cast<unsigned>(byte_level_map().dec[c]) : 0;
    } else {
        first = static_cast<unsigned char>(t[0]);
    }
    return (first & 0xC0) == 0x80;
}
}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tok, bool skip_special_tokens,
                                       std::span<const int32_t> prompt_ids)
    : tok_(tok), skip_special_(skip_special_tokens) {
    // Keep the prompt's last kInitialOffset + 2 tokens as context (skipped specials removed, as
    // convert_ids_to_tokens(skip_special_tokens=True) does).
    const size_t keep = std::min(prompt_ids.size(), kInitialOffset + 2);
    for (size_t k = prompt_ids.size() - keep; k < prompt_ids.size(); ++k) {
        const int32_t id = prompt_ids[k];
        if (skip_special_ && tok_.is_special(id)) continue;
        ids_.push_back(id);
    }
    read_offset_ = ids_.size();
    prefix_offset_ = read_offset_ > kInitialOffset ? read_offset_ - kInitialOffset : 0;
    // Unlike vLLM, never start the window inside a character: byte fallback turns a cut sequence
    // into one U+FFFD per byte, which would not be a prefix of the longer window's text.
    while (prefix_offset_ > 0 && starts_mid_character(tok_.data(), ids_[prefix_offset_])) --prefix_offset_;
}

void IncrementalDecoder::compact() {
    if (prefix_offset_ < kCompactAt) return;
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_));
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
}

std::string IncrementalDecoder::push(int32_t id) {
    ids_.push_back(id);
    const std::span<const int32_t> all(ids_);
    prefix_text_.clear();
    new_text_.clear();
    tok_.decode_append(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_, prefix_text_);
    tok_.decode_append(all.subspan(prefix_offset_), skip_special_, new_text_);
    if (new_text_.size() <= prefix_text_.size() || ends_with_replacement(new_text_)) return {};
    std::string out;
    if (new_text_.compare(0, prefix_text_.size(), prefix_text_) == 0) {
        out.assign(new_text_, prefix_text_.size());
    } else {
        // A decoder whose output for the window is not a prefix of the longer one (none of the
        // supported ones); emit from the first difference, on a character boundary.
        size_t k = 0;
        while (k < prefix_text_.size() && new_text_[k] == prefix_text_[k]) ++k;
        while (k > 0 && (static_cast<unsigned char>(new_text_[k]) & 0xC0) == 0x80) --k;
        out.assign(new_text_, k);
    }
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    compact();
    return out;
}

std::string IncrementalDecoder::flush() {
    if (read_offset_ >= ids_.size()) return {};
    const std::span<const int32_t> all(ids_);
    prefix_text_.clear();
    new_text_.clear();
    tok_.decode_append(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_, prefix_text_);
    tok_.decode_append(all.subspan(prefix_offset_), skip_special_, new_text_);
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    if (new_text_.size() <= prefix_text_.size()) return {};
    return new_text_.substr(prefix_text_.size());
}

}  // namespace scr::text
