// The text side of one output stream: stop strings matched on the detokenized text, and the
// hold-back that keeps a partial match of a stop string out of streamed chunks until it resolves.
// vLLM: vllm/v1/engine/detokenizer.py:L59 (BaseIncrementalDetokenizer): L71 (stop_buffer_length),
// L116 (stop-string check), L136 (get_next_output_text).
//
// Lengths here are UTF-8 bytes (vLLM counts Python characters); a chunk never ends inside a
// character.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace scr::engine {

class TextStream {
public:
    TextStream() = default;
    TextStream(const std::vector<std::string>* stop, bool include_stop_str);

    // Appends newly decoded text. If a stop string now occurs (searching only where the new text
    // could complete one), truncates the text at it (or after it, with include_stop_str) and
    // returns its index in the stop list; -1 otherwise. vLLM: StopChecker.check_stop_strings.
    int append(std::string_view new_text, bool check_stop = true);
    // Appends text that stop strings are not matched against (a stop token's own text, flush).
    void append_unchecked(std::string_view new_text) { text_.append(new_text); }

    // The text not yet handed out, less the hold-back unless finished; marks it handed out.
    std::string_view next_chunk(bool finished);
    const std::string& text() const { return text_; }
    size_t hold_back() const { return hold_back_; }

private:
    const std::vector<std::string>* stop_ = nullptr;
    bool include_stop_str_ = false;
    size_t hold_back_ = 0;
    std::string text_;
    size_t sent_ = 0;
};

}  // namespace scr::engine
