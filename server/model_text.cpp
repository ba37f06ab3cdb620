#include "server/model_text.hpp"

#include "runtime/core/error.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/tokenizer.hpp"

namespace scr::server {

std::vector<int32_t> ModelText::encode(std::string_view text, bool add_special_tokens) const {
    return tokenizer_.encode(text, add_special_tokens);
}

std::string ModelText::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
    return tokenizer_.decode(ids, skip_special_tokens);
}

std::string ModelText::render_chat(const nlohmann::ordered_json& context) const {
    if (!template_)
        fail("this model has no chat template (tokenizer_config.json has no chat_template); use /v1/completions");
    return template_->render(context);
}

int ModelText::vocab_size() const { return tokenizer_.vocab_size(); }

ToolCallFormat detect_tool_call_format(const text::ChatTemplate* chat_template) {
    if (!chat_template) return ToolCallFormat::none;
    const std::string& source = chat_template->source();
    if (source.find("<tool_call>") != std::string::npos) return ToolCallFormat::hermes;
    if (source.find("<|python_tag|>") != std::string::npos || source.find("ipython") != std::string::npos)
        return ToolCallFormat::llama3_json;
    return ToolCallFormat::none;
}

SamplingDefaults sampling_defaults_from(const nlohmann::json& g) {
    SamplingDefaults d;
    auto number = [&](const char* key, auto& into) {
        if (g.contains(key) && g[key].is_number()) into = g[key].get<std::remove_reference_t<decltype(into)>>();
    };
    number("temperature", d.temperature);
    number("top_p", d.top_p);
    number("top_k", d.top_k);
    number("min_p", d.min_p);
    number("repetition_penalty", d.repetition_penalty);
    return d;
}

}  // namespace scr::server
