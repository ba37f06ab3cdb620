// Tool calls written by a model, parsed back into OpenAI `tool_calls` as the text streams in.
//
// Formats (what the models' chat templates ask for):
//   llama3_json: the whole reply is one or more JSON objects {"name": ..., "parameters"|"arguments": {...}}
//                separated by ';' (Llama 3.1/3.2/3.3), optionally after <|python_tag|>.
//   hermes:      <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number, after optional
//                text (Hermes, Qwen 2.5, Qwen 3).
// The parser is incremental: feed() returns the text that is safe to show as content now (partial
// tags are held back) and each tool call as soon as it is complete. Text that only looked like a
// call and does not parse is given back as content, so nothing the model wrote is lost.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace scr::server {

enum class ToolCallFormat { none, llama3_json, hermes };

// "none" | "llama3_json" | "hermes"; throws scr::Error naming the accepted values.
ToolCallFormat parse_tool_call_format(std::string_view name);
const char* tool_call_format_name(ToolCallFormat f);

struct ParsedToolCall {
    std::string name;
    std::string arguments;  // JSON text of the arguments object
};

class ToolCallParser {
public:
    explicit ToolCallParser(ToolCallFormat format) : format_(format) {}

    // Appends what can be shown as content now to `content` and completed calls to `calls`.
    void feed(std::string_view text, std::string& content, std::vector<ParsedToolCall>& calls);
    // End of the output: flushes held-back text; a final unterminated call is parsed if it can be.
    void finish(std::string& content, std::vector<ParsedToolCall>& calls);

    int num_calls() const { return num_calls_; }

private:
    void feed_hermes(std::string& content, std::vector<ParsedToolCall>& calls);
    void emit_content(std::string_view text, std::string& content);

    ToolCallFormat format_;
    enum class Mode { undecided, content, json_reply, in_call } mode_ = Mode::undecided;
    std::string pending_;      // text not yet classified (held back)
    std::string held_space_;   // trailing whitespace, shown only if more content follows
    int num_calls_ = 0;
};

// Whole-text convenience (non-streaming responses and tests).
struct ToolCallParse {
    std::string content;
    std::vector<ParsedToolCall> calls;
};
ToolCallParse parse_tool_calls(ToolCallFormat format, std::string_view text);

}  // namespace scr::server
