// Chat templates: the model's Jinja template (tokenizer_config.json "chat_template", or
// chat_template.jinja) rendered with our Jinja engine the way transformers' apply_chat_template
// does it.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>

namespace scr::text {

namespace jinja {
class Template;
}

class ChatTemplate {
public:
    // tokenizer_config.json "chat_template" (a string, or a list of {name, template}: "default" is
    // used) or chat_template.jinja next to it. Special tokens (bos_token, eos_token, ...) come from
    // tokenizer_config.json. Throws scr::Error if there is no template or it does not parse.
    static std::unique_ptr<ChatTemplate> load(const std::filesystem::path& model_dir);
    static std::unique_ptr<ChatTemplate> from_source(std::string source, nlohmann::json special_tokens);

    ~ChatTemplate();

    // context: {"messages": [...], "tools": [...], "add_generation_prompt": true, ...}. Special
    // tokens are added unless the context sets them. Throws scr::Error naming an unsupported
    // feature, a template error with its line, or raise_exception's message.
    std::string render(const nlohmann::json& context) const;
    // Same, keeping the key order of the input objects (tojson output depends on it;
    // nlohmann::json sorts keys).
    std::string render(const nlohmann::ordered_json& context) const;

    const std::string& source() const { return source_; }

private:
    ChatTemplate(std::string source, nlohmann::ordered_json special_tokens, std::string name);
    template <typename Json>
    std::string render_impl(const Json& context) const;

    std::string source_;
    nlohmann::ordered_json special_tokens_;
    std::unique_ptr<jinja::Template> template_;
};

}  // namespace scr::text
