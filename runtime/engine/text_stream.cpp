#include "runtime/engine/text_stream.hpp"

#include <algorithm>

namespace scr::engine {

// vLLM: vllm/v1/engine/detokenizer.py:L69: hold back one byte less than the longest stop string,
// unless stop strings are to be included in the output.
TextStream::TextStream(const std::vector<std::string>* stop, bool include_stop_str)
    : stop_(stop && !stop->empty() ? stop : nullptr), include_stop_str_(include_stop_str) {
    if (stop_ && !include_stop_str_) {
        size_t longest = 0;
        for (const std::string& s : *stop_) longest = std::max(longest, s.size());
        hold_back_ = longest ? longest - 1 : 0;
    }
}

// vLLM: vllm/v1/engine/detokenizer.py:L116 (stop-string evaluation) via
// StopChecker.check_stop_strings: the first stop string (in list order) found in the window the
// new text can complete wins.
int TextStream::append(std::string_view new_text, bool check_stop) {
    const size_t new_len = new_text.size();
    text_.append(new_text);
    if (!stop_ || !check_stop || new_len == 0) return -1;
    for (size_t i = 0; i < stop_->size(); ++i) {
        const std::string& s = (*stop_)[i];
        if (s.empty()) continue;
        // Only positions where a match ends inside the new text: start >= len - new_len - (|s| - 1).
        const size_t reach = new_len + s.size() - 1;
        const size_t from = text_.size() > reach ? text_.size() - reach : 0;
        size_t at = text_.find(s, from);
        if (at == std::string::npos) continue;
        if (include_stop_str_) at += s.size();
        if (at < text_.size()) text_.resize(at);
        return int(i);
    }
    return -1;
}

// vLLM: vllm/v1/engine/detokenizer.py:L136 (get_next_output_text, delta mode).
std::string_view TextStream::next_chunk(bool finished) {
    size_t end = text_.size();
    if (!finished) {
        end = end > hold_back_ ? end - hold_back_ : 0;
        // Never end a chunk inside a UTF-8 sequence: back up over continuation bytes.
        while (end > sent_ && end < text_.size() && (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80)
            --end;
    }
    if (end <= sent_) return {};
    std::string_view chunk(text_.data() + sent_, end - sent_);
    sent_ = end;
    return chunk;
}

}  // namespace scr::engine
