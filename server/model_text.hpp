// The served model's text side (tokenizer + chat template) behind the protocol's TextFrontend, and
// what the server reads from the model folder: sampling defaults and its tool-call format.
#pragma once

#include <nlohmann/json.hpp>

#include "server/protocol.hpp"

namespace scr::text {
class Tokenizer;
class ChatTemplate;
}  // namespace scr::text

namespace scr::server {

class ModelText final : public TextFrontend {
public:
    // The template may be null (a base model): chat requests then get a 400 naming the problem.
    ModelText(const text::Tokenizer& tokenizer, const text::ChatTemplate* chat_template)
        : tokenizer_(tokenizer), template_(chat_template) {}

    std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
    std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
    std::string render_chat(const nlohmann::ordered_json& context) const override;
    int vocab_size() const override;

private:
    const text::Tokenizer& tokenizer_;
    const text::ChatTemplate* template_;
};

// The format the model's chat template asks tool calls in: <tool_call> tags (Hermes, Qwen) or
// Llama 3's JSON (its template mentions <|python_tag|>); none when the template has no tools.
ToolCallFormat detect_tool_call_format(const text::ChatTemplate* chat_template);

// generation_config.json's temperature, top_p, top_k, min_p, repetition_penalty (as vLLM reads it).
SamplingDefaults sampling_defaults_from(const nlohmann::json& generation_config);

}  // namespace scr::server
