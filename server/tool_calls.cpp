#include "server/tool_calls.hpp"

#include <nlohmann/json.hpp>

#include <optional>

#include "runtime/core/error.hpp"
#include "server/json_scan.hpp"

namespace scr::server {

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr int kMaxCallDepth = 64;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// Length of the longest suffix of `text` that is a proper prefix of `tag` (a tag still arriving).
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
    for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
        if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
    return 0;
}

// {"name": "f", "arguments"|"parameters": {...}} -> a call; anything else -> nullopt.
std::optional<ParsedToolCall> call_from_json(std::string_view text) {
    text = trim(text);
    if (text.empty() || text.front() != '{' || json_nesting_depth(text) > kMaxCallDepth) return std::nullopt;
    const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::nullopt;
    const auto name = j.find("name");
    if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
    auto args = j.find("arguments");
    if (args == j.end()) args = j.find("parameters");
    ParsedToolCall call{name->get<std::string>(), "{}"};
    if (args != j.end()) {
        if (args->is_string()) call.arguments = args->get<std::string>();  // already JSON text
        else if (args->is_object()) call.arguments = args->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        else return std::nullopt;
    }
    return call;
}

// Llama 3: the reply is `{...}` or `{...}; {...}` (optionally after <|python_tag|>). All or nothing.
std::optional<std::vector<ParsedToolCall>> calls_from_json_reply(std::string_view text) {
    text = trim(text);
    if (text.starts_with(kPythonTag)) text = trim(text.substr(kPythonTag.size()));
    std::vector<ParsedToolCall> calls;
    while (!text.empty()) {
        const size_t extent = json_value_extent(text);
        if (extent == 0) return std::nullopt;
        auto call = call_from_json(text.substr(0, extent));
        if (!call) return std::nullopt;
        calls.push_back(std::move(*call));
        text = trim(text.substr(extent));
        if (!text.empty() && text.front() == ';') text = trim(text.substr(1));
    }
    if (calls.empty()) return std::nullopt;
    return calls;
}

}  // namespace

ToolCallFormat parse_tool_call_format(std::string_view name) {
    if (name == "none") return ToolCallFormat::none;
    if (name == "llama3_json") return ToolCallFormat::llama3_json;
    if (name == "hermes") return ToolCallFormat::hermes;
    fail("unknown tool call format '{}': expected none, llama3_json or hermes", name);
}

const char* tool_call_format_name(ToolCallFormat f) {
    switch (f) {
        case ToolCallFormat::llama3_json: return "llama3_json";
        case ToolCallFormat::hermes: return "hermes";
        case ToolCallFormat::none: break;
    }
    return "none";
}

void ToolCallParser::emit_content(std::string_view text, std::string& content) {
    // Whitespace next to tool calls is layout, not content: trailing whitespace waits until
    // non-space text follows (then it is shown) or a call or the end comes (then it is dropped).
    size_t end = text.size();
    while (end > 0 && is_space(text[end - 1])) --end;
    if (end > 0) {
        content += held_space_;
        held_space_.clear();
        content.append(text.substr(0, end));
    }
    held_space_.append(text.substr(end));
}

void ToolCallParser::feed(std::string_view text, std::string& content, std::vector<ParsedToolCall>& calls) {
    switch (format_) {
        case ToolCallFormat::none:
            content.append(text);
            return;
        case ToolCallFormat::hermes:
            pending_.append(text);
            feed_hermes(content, calls);
            return;
        case ToolCallFormat::llama3_json:
            break;
    }
    if (mode_ == Mode::content) {
        content.append(text);
        return;
    }
    pending_.append(text);
    if (mode_ == Mode::json_reply) return;
    // Undecided: a reply that opens with '{' or <|python_tag|> is a call; anything else is prose.
    const std::string_view head = trim(pending_);
    if (head.empty()) return;
    if (head.front() == '{' || head.starts_with(kPythonTag)) {
        mode_ = Mode::json_reply;
    } else if (kPythonTag.starts_with(head)) {
        return;  // maybe the tag, still arriving
    } else {
        mode_ = Mode::content;
        content += pending_;
        pending_.clear();
    }
}

void ToolCallParser::feed_hermes(std::string& content, std::vector<ParsedToolCall>& calls) {
    for (;;) {
        if (mode_ != Mode::in_call) {
            const size_t open = pending_.find(kHermesOpen);
            if (open == std::string::npos) {
                const size_t keep = partial_tag_suffix(pending_, kHermesOpen);
                emit_content(std::string_view(pending_).substr(0, pending_.size() - keep), content);
                pending_.erase(0, pending_.size() - keep);
                return;
            }
            emit_content(std::string_view(pending_).substr(0, open), content);
            held_space_.clear();
            pending_.erase(0, open + kHermesOpen.size());
            mode_ = Mode::in_call;
        }
        const size_t close = pending_.find(kHermesClose);
        if (close == std::string::npos) return;
        const std::string_view body = std::string_view(pending_).substr(0, close);
        if (auto call = call_from_json(body)) {
            calls.push_back(std::move(*call));
            ++num_calls_;
        } else {
            emit_content(std::string(kHermesOpen) + std::string(body) + std::string(kHermesClose), content);
        }
        pending_.erase(0, close + kHermesClose.size());
        mode_ = Mode::content;
    }
}

void ToolCallParser::finish(std::string& content, std::vector<ParsedToolCall>& calls) {
    if (format_ == ToolCallFormat::llama3_json) {
        if (mode_ == Mode::json_reply) {
            if (auto parsed = calls_from_json_reply(pending_)) {
                num_calls_ += int(parsed->size());
                for (auto& c : *parsed) calls.push_back(std::move(c));
            } else {
                content += pending_;
            }
        } else {
            content += pending_;
        }
    } else if (format_ == ToolCallFormat::hermes) {
        if (mode_ == Mode::in_call) {
            // Output ended inside a call (no closing tag): keep it if the JSON is complete.
            if (auto call = call_from_json(pending_)) {
                calls.push_back(std::move(*call));
                ++num_calls_;
            } else {
                emit_content(std::string(kHermesOpen) + pending_, content);
            }
        } else {
            emit_content(pending_, content);
        }
        if (num_calls_ == 0) content += held_space_;
    }
    pending_.clear();
    held_space_.clear();
    mode_ = Mode::content;
}

ToolCallParse parse_tool_calls(ToolCallFormat format, std::string_view text) {
    ToolCallParse result;
    ToolCallParser parser(format);
    parser.feed(text, result.content, result.calls);
    parser.finish(result.content, result.calls);
    return result;
}

}  // namespace scr::server
