#include "runtime/text/chat_template.hpp"

#include <fstream>
#include <sstream>

#include "runtime/core/error.hpp"
#include "runtime/text/jinja.hpp"

namespace scr::text {

using nlohmann::ordered_json;

namespace {

std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) scr::fail("cannot open {}", p.string());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The special-token variables transformers passes to templates (its special_tokens_map).
ordered_json special_tokens_from_config(const ordered_json& config) {
    ordered_json out = ordered_json::object();
    for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
        if (!config.contains(name)) continue;
        const auto& v = config[name];
        if (v.is_string()) out[name] = v;
        else if (v.is_object() && v.contains("content") && v["content"].is_string()) out[name] = v["content"];
    }
    if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array())
        out["additional_special_tokens"] = config["additional_special_tokens"];
    return out;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, ordered_json special_tokens, std::string name)
    : source_(std::move(source)),
      special_tokens_(std::move(special_tokens)),
      template_(std::make_unique<jinja::Template>(source_, std::move(name))) {}

ChatTemplate::~ChatTemplate() = default;

std::unique_ptr<ChatTemplate> ChatTemplate::load(const std::filesystem::path& model_dir) {
    const auto config_path = model_dir / "tokenizer_config.json";
    ordered_json config = ordered_json::object();
    if (std::filesystem::exists(config_path)) {
        try {
            config = ordered_json::parse(read_file(config_path));
        } catch (const nlohmann::json::parse_error& e) {
            scr::fail("{}: malformed JSON: {}", config_path.string(), e.what());
        }
        if (!config.is_object()) scr::fail("{}: expected an object", config_path.string());
    }
    std::string source, name;
    if (config.contains("chat_template") && !config["chat_template"].is_null()) {
        const auto& ct = config["chat_template"];
        name = config_path.string() + ": chat_template";
        if (ct.is_string()) {
            source = ct.get<std::string>();
        } else if (ct.is_array()) {
            for (const auto& entry : ct) {
                if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
                    !entry["template"].is_string())
                    scr::fail("{}: chat_template list entries must be {{\"name\", \"template\"}}", config_path.string());
                if (entry["name"] == "default") source = entry["template"].get<std::string>();
            }
            if (source.empty()) scr::fail("{}: chat_template list has no \"default\" entry", config_path.string());
        } else {
            scr::fail("{}: chat_template must be a string or a list", config_path.string());
        }
    } else if (std::filesystem::exists(model_dir / "chat_template.jinja")) {
        source = read_file(model_dir / "chat_template.jinja");
        name = (model_dir / "chat_template.jinja").string();
    } else {
        scr::fail("{}: no chat template (neither tokenizer_config.json \"chat_template\" nor chat_template.jinja)",
                  model_dir.string());
    }
    return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(source), special_tokens_from_config(config), name));
}

std::unique_ptr<ChatTemplate> ChatTemplate::from_source(std::string source, nlohmann::json special_tokens) {
    ordered_json specials = ordered_json::object();
    if (special_tokens.is_object())
        for (auto it = special_tokens.begin(); it != special_tokens.end(); ++it) specials[it.key()] = it.value();
    return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(source), std::move(specials), "chat_template"));
}

template <typename Json>
std::string ChatTemplate::render_impl(const Json& context) const {
    if (!context.is_object()) scr::fail("chat template context must be a JSON object");
    jinja::Value ctx = jinja::Value::from_json(context);
    for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it)
        if (!ctx.object().find(it.key())) ctx.object_mut().set(it.key(), jinja::Value::from_json(it.value()));
    return template_->render(ctx);
}

std::string ChatTemplate::render(const nlohmann::json& context) const { return render_impl(context); }
std::string ChatTemplate::render(const ordered_json& context) const { return render_impl(context); }

}  // namespace scr::text
