// Request side of the protocol: JSON bodies -> validated GenerationJobs (prompt ids + SamplingParams).
// Field names, ranges and error wording follow OpenAI's API (and vLLM's extensions) so clients see
// the errors they already handle.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "runtime/core/error.hpp"
#include "server/json_scan.hpp"
#include "server/protocol.hpp"
#include "server/request_fields.hpp"

namespace scr::server {

using json = nlohmann::ordered_json;

namespace {

constexpr int kMaxBodyDepth = 64;       // nesting a real request never comes near
constexpr size_t kMaxPrompts = 64;      // prompts in one /v1/completions batch
constexpr size_t kMaxStopStrings = 16;
constexpr int kMaxPriority = 1 << 20;

// obj[key] when it is a string, else "" (json::value() would throw on a wrong type).
std::string string_member(const json& obj, const char* key) {
    const auto it = obj.find(key);
    return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

void check_model(RequestFields& f, const ServingContext& ctx, bool required) {
    const auto model = f.string("model");
    if (!model) {
        if (required) throw ApiError::invalid("model", "`model` is required", "missing_required_parameter");
        return;
    }
    if (*model != ctx.model_name)
        throw ApiError(404, "invalid_request_error",
                       fmt::format("The model `{}` does not exist. This server serves `{}`.", *model, ctx.model_name),
                       "model", "model_not_found");
}

std::vector<std::string> parse_stop(RequestFields& f, std::string_view key) {
    const json* v = f.get(key);
    std::vector<std::string> stops;
    if (!v) return stops;
    const std::string name = f.name(key);
    auto add = [&](const json& s) {
        if (!s.is_string())
            throw ApiError::invalid(name, fmt::format("`{}` must be a string or an array of strings", name), "invalid_type");
        if (s.get_ref<const std::string&>().empty())
            throw ApiError::invalid(name, fmt::format("`{}` must not contain empty strings", name));
        stops.push_back(s.get<std::string>());
    };
    if (v->is_array()) {
        if (v->size() > kMaxStopStrings)
            throw ApiError::invalid(name, fmt::format("`{}` holds {} strings; at most {} are allowed", name, v->size(),
                                                      kMaxStopStrings));
        for (const auto& s : *v) add(s);
    } else {
        add(*v);
    }
    return stops;
}

int32_t checked_token_id(const json& v, const std::string& name, const ServingContext& ctx) {
    const int vocab = ctx.text->vocab_size();
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
        throw ApiError::invalid(name, fmt::format("`{}` must hold token ids in [0, {}), got {}", name, vocab, v.dump()));
    return int32_t(v.get<int64_t>());
}

// The sampling fields OpenAI's chat and completions APIs share, plus vLLM's extensions.
void parse_openai_sampling(RequestFields& f, const ServingContext& ctx, SamplingParams& p, int& priority) {
    const SamplingDefaults& d = ctx.defaults;
    p.temperature = float(f.number("temperature", 0.0, 2.0).value_or(d.temperature));
    p.top_p = float(f.number("top_p", 0.0, 1.0).value_or(d.top_p));
    if (p.top_p <= 0.0f) throw ApiError::invalid("top_p", "`top_p` must be in (0, 1], got 0");
    p.top_k = int(f.integer("top_k", -1, std::numeric_limits<int32_t>::max()).value_or(d.top_k));
    if (p.top_k < 0) p.top_k = 0;
    p.min_p = float(f.number("min_p", 0.0, 1.0).value_or(d.min_p));
    p.repetition_penalty = float(f.number("repetition_penalty", 0.0, 100.0).value_or(d.repetition_penalty));
    if (p.repetition_penalty <= 0.0f)
        throw ApiError::invalid("repetition_penalty", "`repetition_penalty` must be greater than 0");
    p.presence_penalty = float(f.number("presence_penalty", -2.0, 2.0).value_or(0.0));
    p.frequency_penalty = float(f.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
    if (auto seed = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
        p.seed = uint64_t(*seed);
    p.n = int(f.integer("n", 1, ctx.max_n).value_or(1));
    p.stop = parse_stop(f, "stop");
    if (const json* ids = f.array("stop_token_ids"))
        for (const auto& id : *ids) p.stop_token_ids.push_back(checked_token_id(id, "stop_token_ids", ctx));
    if (const json* bias = f.object("logit_bias")) {
        for (const auto& [key, value] : bias->items()) {
            int64_t id = -1;
            try {
                size_t used = 0;
                id = std::stoll(key, &used);
                if (used != key.size()) id = -1;
            } catch (const std::exception&) {
            }
            if (id < 0 || id >= ctx.text->vocab_size())
                throw ApiError::invalid("logit_bias", fmt::format("`logit_bias` key '{}' is not a token id in [0, {})",
                                                                  key, ctx.text->vocab_size()));
            if (!value.is_number() || value.get<double>() < -100.0 || value.get<double>() > 100.0)
                throw ApiError::invalid("logit_bias", fmt::format("`logit_bias` values must be numbers in [-100, 100], "
                                                                  "got {} for token {}", value.dump(), key));
            p.logit_bias.emplace_back(int32_t(id), value.get<float>());
        }
    }
    p.min_tokens = int(f.integer("min_tokens", 0, std::numeric_limits<int32_t>::max()).value_or(0));
    p.ignore_eos = f.boolean("ignore_eos").value_or(false);
    p.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
    p.include_stop_str_in_output = f.boolean("include_stop_str_in_output").value_or(false);
    priority = int(f.integer("priority", -kMaxPriority, kMaxPriority).value_or(0));
    f.ignore({"user", "metadata", "store", "service_tier", "spaces_between_special_tokens"});
    f.reject("best_of", "sampling several candidates to keep the best is not implemented; use `n`");
    f.reject("prompt_logprobs", "the engine returns logprobs of generated tokens only");
    f.reject("guided_json", "guided decoding is not implemented");
    f.reject("guided_regex", "guided decoding is not implemented");
    f.reject("guided_choice", "guided decoding is not implemented");
    f.reject("guided_grammar", "guided decoding is not implemented");
}

// vLLM's `truncate_prompt_tokens`: -1 (the model's context length) or a positive count of tokens to keep.
std::optional<int64_t> parse_truncation(RequestFields& f, const ServingContext& ctx) {
    auto k = f.integer("truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max());
    if (!k) return std::nullopt;
    if (*k == 0)
        throw ApiError::invalid("truncate_prompt_tokens", "`truncate_prompt_tokens` must be -1 (the model's context "
                                                          "length) or a positive number of tokens to keep");
    if (*k > ctx.max_model_len)
        throw ApiError::invalid("truncate_prompt_tokens",
                                fmt::format("`truncate_prompt_tokens` ({}) is greater than this model's maximum "
                                            "context length ({} tokens)", *k, ctx.max_model_len));
    return *k == -1 ? ctx.max_model_len : *k;
}

void parse_stream_options(RequestFields& f, GenerationJob& job) {
    job.stream = f.boolean("stream").value_or(false);
    if (const json* opts = f.object("stream_options")) {
        if (!job.stream)
            throw ApiError::invalid("stream_options", "`stream_options` is only allowed when `stream` is true");
        RequestFields o(*opts, "stream_options.");
        job.include_usage = o.boolean("include_usage").value_or(false);
        job.continuous_usage = o.boolean("continuous_usage_stats").value_or(false);
        o.reject_unknown();
    }
}

// What /v1/chat/completions and /v1/completions read alike: the model, sampling, streaming and
// prompt truncation.
GenerationJob parse_openai_common(RequestFields& f, ApiKind api, const ServingContext& ctx) {
    GenerationJob job;
    job.api = api;
    check_model(f, ctx, false);
    parse_openai_sampling(f, ctx, job.params, job.priority);
    parse_stream_options(f, job);
    job.truncate_prompt_tokens = parse_truncation(f, ctx);
    return job;
}

// Every prompt fits with room to generate; max_tokens defaults to `default_max` (0: all the room).
void fit_to_context(GenerationJob& job, std::optional<int64_t> requested, const char* param, int default_max,
                    const ServingContext& ctx) {
    // A prompt longer than `truncate_prompt_tokens` keeps its last tokens, as vLLM's tokenizer does
    // with truncation_side "left" (vLLM: vllm/entrypoints/openai/serving_engine.py:L61, and
    // `_validate_prompt_and_tokenize`'s prompt_ids[-truncate_prompt_tokens:], commit 0030b9f).
    if (job.truncate_prompt_tokens)
        for (auto& prompt : job.prompts)
            if (int64_t(prompt.size()) > *job.truncate_prompt_tokens)
                prompt.erase(prompt.begin(), prompt.end() - *job.truncate_prompt_tokens);
    size_t longest = 0;
    for (const auto& prompt : job.prompts) {
        if (prompt.empty()) throw ApiError::invalid("prompt", "The prompt is empty: it encodes to zero tokens");
        longest = std::max(longest, prompt.size());
    }
    const int64_t max_len = ctx.max_model_len;
    if (int64_t(longest) >= max_len)
        throw ApiError::invalid(job.api == ApiKind::completion ? "prompt" : "messages",
                                fmt::format("This model's maximum context length is {} tokens. However, your request "
                                            "has {} input tokens. Please reduce the length of the input.",
                                            max_len, longest),
                                "context_length_exceeded");
    const int64_t room = max_len - int64_t(longest);
    if (requested) {
        if (*requested > room)
            throw ApiError::invalid(param,
                                    fmt::format("'{}' is too large: {}. This model's maximum context length is {} "
                                                "tokens and your request has {} input tokens ({} > {} - {}).",
                                                param, *requested, max_len, longest, *requested, max_len, longest),
                                    "context_length_exceeded");
        job.params.max_tokens = int(*requested);
    } else {
        job.params.max_tokens = int(default_max > 0 ? std::min<int64_t>(default_max, room) : room);
    }
    if (job.params.min_tokens > job.params.max_tokens)
        throw ApiError::invalid("min_tokens", fmt::format("`min_tokens` ({}) must not exceed the maximum number of "
                                                          "new tokens ({})", job.params.min_tokens,
                                                          job.params.max_tokens));
    if (!job.params.ignore_eos)
        for (int32_t id : ctx.end_of_turn_ids)
            if (std::find(job.params.stop_token_ids.begin(), job.params.stop_token_ids.end(), id) ==
                job.params.stop_token_ids.end())
                job.params.stop_token_ids.push_back(id);
}

// OpenAI message content (a string, text parts, or null) -> the string a chat template renders.
std::optional<std::string> content_text(const json* content, const std::string& path) {
    if (!content) return std::nullopt;
    if (content->is_string()) return content->get<std::string>();
    if (!content->is_array())
        throw ApiError::invalid(path, fmt::format("`{}` must be a string or an array of content parts", path),
                                "invalid_type");
    std::string text;
    for (size_t i = 0; i < content->size(); ++i) {
        const json& part = (*content)[i];
        const std::string part_path = fmt::format("{}[{}]", path, i);
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            throw ApiError::invalid(part_path, fmt::format("`{}` must be an object with a string `type`", part_path),
                                    "invalid_type");
        const std::string& type = part["type"].get_ref<const std::string&>();
        if (type != "text")
            throw ApiError::unsupported(part_path, fmt::format("content parts of type `{}` are not supported: this "
                                                               "server serves text-only models", type));
        if (!part.contains("text") || !part["text"].is_string())
            throw ApiError::invalid(part_path, fmt::format("`{}.text` must be a string", part_path), "invalid_type");
        if (!text.empty()) text += '\n';
        text += part["text"].get<std::string>();
    }
    return text;
}

// Tool-call arguments travel as JSON text; chat templates expect the object (vLLM does the same).
json template_arguments(const json& arguments) {
    if (arguments.is_string()) {
        const std::string& s = arguments.get_ref<const std::string&>();
        if (json_nesting_depth(s) <= kMaxBodyDepth) {
            json parsed = json::parse(s, nullptr, /*allow_exceptions=*/false);
            if (parsed.is_object()) return parsed;
        }
    }
    return arguments;
}

json openai_messages_for_template(const json* messages) {
    if (!messages) throw ApiError::invalid("messages", "`messages` is required", "missing_required_parameter");
    if (!messages->is_array())
        throw ApiError::invalid("messages", "`messages` must be an array of message objects", "invalid_type");
    if (messages->empty()) throw ApiError::invalid("messages", "`messages` must contain at least one message");
    json out = json::array();
    for (size_t i = 0; i < messages->size(); ++i) {
        const json& m = (*messages)[i];
        const std::string path = fmt::format("messages[{}]", i);
        if (!m.is_object()) throw ApiError::invalid(path, fmt::format("`{}` must be an object", path), "invalid_type");
        // Message objects are echoed back by clients with response-only fields (refusal, annotations,
        // audio, reasoning_content ...): unknown keys are ignored here, not refused.
        RequestFields f(m, path + ".");
        const auto role = f.string("role");
        if (!role) throw ApiError::invalid(path + ".role", fmt::format("`{}.role` is required", path),
                                           "missing_required_parameter");
        json msg = json::object();
        if (*role == "system" || *role == "developer") msg["role"] = "system";
        else if (*role == "user" || *role == "assistant" || *role == "tool") msg["role"] = *role;
        else
            throw ApiError::invalid(path + ".role", fmt::format("`{}.role` must be one of system, developer, user, "
                                                                "assistant, tool; got '{}'", path, *role));
        auto text = content_text(f.get("content"), path + ".content");
        const json* tool_calls = *role == "assistant" ? f.array("tool_calls") : nullptr;
        if (!text && !tool_calls)
            throw ApiError::invalid(path + ".content", fmt::format("`{}.content` is required", path),
                                    "missing_required_parameter");
        msg["content"] = text.value_or("");
        if (auto name = f.string("name")) msg["name"] = *name;
        if (*role == "tool")
            if (auto id = f.string("tool_call_id")) msg["tool_call_id"] = *id;
        if (tool_calls) {
            json calls = json::array();
            for (size_t k = 0; k < tool_calls->size(); ++k) {
                const json& call = (*tool_calls)[k];
                const std::string cpath = fmt::format("{}.tool_calls[{}]", path, k);
                const json* fn = call.is_object() && call.contains("function") ? &call["function"] : nullptr;
                if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
                    throw ApiError::invalid(cpath, fmt::format("`{}` must be an object with `function.name`", cpath),
                                            "invalid_type");
                json entry = {{"type", "function"},
                              {"function", {{"name", (*fn)["name"]},
                                            {"arguments", template_arguments(fn->value("arguments", json("{}")))}}}};
                if (call.contains("id") && call["id"].is_string()) entry["id"] = call["id"];
                calls.push_back(std::move(entry));
            }
            msg["tool_calls"] = std::move(calls);
        }
        out.push_back(std::move(msg));
    }
    return out;
}

json openai_tools_for_template(const json& tools) {
    for (size_t i = 0; i < tools.size(); ++i) {
        const json& t = tools[i];
        const std::string path = fmt::format("tools[{}]", i);
        if (!t.is_object() || string_member(t, "type") != "function" || !t.contains("function") ||
            !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string())
            throw ApiError::invalid(path, fmt::format("`{}` must be {{\"type\": \"function\", \"function\": "
                                                      "{{\"name\": ..., \"parameters\": {{...}}}}}}", path),
                                    "invalid_type");
        if (t["function"].contains("parameters") && !t["function"]["parameters"].is_object())
            throw ApiError::invalid(path, fmt::format("`{}.function.parameters` must be a JSON Schema object", path),
                                    "invalid_type");
    }
    return tools;
}

std::string render(const ServingContext& ctx, const json& context) {
    // Templates raise on conversations they do not accept (roles out of order, ...): the client's to fix.
    try {
        return ctx.text->render_chat(context);
    } catch (const std::exception& e) {
        throw ApiError::invalid("messages", fmt::format("The chat template rejected the conversation: {}", e.what()),
                                "chat_template_error");
    }
}

// vLLM's continue_final_message: the reply continues the last (assistant) message, so the rendering
// is cut right after that message's text (dropping the template's end-of-turn).
std::string cut_after_final_message(const std::string& rendered, const json& messages) {
    const std::string& last = messages.back()["content"].get_ref<const std::string&>();
    const size_t at = last.empty() ? std::string::npos : rendered.rfind(last);
    if (at == std::string::npos)
        throw ApiError::invalid("continue_final_message", "The final message's text does not appear in the "
                                                          "rendered prompt, so it cannot be continued");
    return rendered.substr(0, at + last.size());
}

// Fields of the chat template context shared by chat completions and /tokenize.
struct ChatPrompt {
    std::string text;
    bool add_special_tokens = false;
};

ChatPrompt render_openai_chat(RequestFields& f, const ServingContext& ctx, bool tools_rendered, json tools) {
    json messages = openai_messages_for_template(f.get("messages"));
    json context = json::object();
    if (const json* kwargs = f.object("chat_template_kwargs")) context = *kwargs;
    const bool continue_final = f.boolean("continue_final_message").value_or(false);
    const bool add_generation_prompt = f.boolean("add_generation_prompt").value_or(!continue_final);
    if (continue_final && (add_generation_prompt || messages.back()["role"] != "assistant"))
        throw ApiError::invalid("continue_final_message", "`continue_final_message` needs a final assistant message "
                                                          "and `add_generation_prompt` false");
    context["add_generation_prompt"] = add_generation_prompt;
    if (tools_rendered) context["tools"] = std::move(tools);
    context["messages"] = messages;
    ChatPrompt prompt;
    prompt.text = render(ctx, context);
    if (continue_final) prompt.text = cut_after_final_message(prompt.text, messages);
    prompt.add_special_tokens = f.boolean("add_special_tokens").value_or(false);
    return prompt;
}

}  // namespace

json parse_json_body(std::string_view body) {
    if (body.empty())
        throw ApiError(400, "invalid_request_error", "The request body is empty; expected a JSON object", "",
                       "invalid_json");
    if (json_nesting_depth(body) > kMaxBodyDepth)
        throw ApiError(400, "invalid_request_error",
                       fmt::format("The request body nests deeper than {} levels", kMaxBodyDepth), "", "invalid_json");
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
        // Parse again only to get the parser's message (it names the byte and what was expected).
        std::string why = "malformed JSON";
        try {
            [[maybe_unused]] const json ignored = json::parse(body);
        } catch (const json::exception& e) {  // parse_error, or out_of_range for numbers like 1e999
            why = e.what();
        }
        throw ApiError(400, "invalid_request_error", fmt::format("The request body is not valid JSON: {}", why), "",
                       "invalid_json");
    }
    if (!j.is_object())
        throw ApiError(400, "invalid_request_error", "The request body must be a JSON object", "", "invalid_json");
    return j;
}

GenerationJob parse_chat_request(const json& body, const ServingContext& ctx) {
    RequestFields f(body);
    GenerationJob job = parse_openai_common(f, ApiKind::chat, ctx);

    const bool want_logprobs = f.boolean("logprobs").value_or(false);
    const auto top_logprobs = f.integer("top_logprobs", 0, ctx.max_logprobs);
    if (top_logprobs && !want_logprobs)
        throw ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs` set to true");
    job.params.logprobs = want_logprobs ? int(top_logprobs.value_or(0)) : -1;

    // Tools: rendered through the chat template unless tool_choice is "none"; calls parsed back.
    json tools = json::array();
    if (const json* t = f.array("tools")) tools = openai_tools_for_template(*t);
    std::string tool_choice = tools.empty() ? "none" : "auto";
    if (const json* choice = f.get("tool_choice")) {
        if (choice->is_string() && (*choice == "none" || *choice == "auto")) {
            tool_choice = choice->get<std::string>();
        } else if ((choice->is_string() && *choice == "required") || choice->is_object()) {
            throw ApiError::unsupported("tool_choice", "`tool_choice` \"required\" or a named function needs guided "
                                                       "decoding, which this server does not implement; use \"auto\"");
        } else {
            throw ApiError::invalid("tool_choice", "`tool_choice` must be \"none\", \"auto\", \"required\" or "
                                                   "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
    }
    const bool use_tools = !tools.empty() && tool_choice == "auto";
    job.tool_format = use_tools ? ctx.tool_format : ToolCallFormat::none;
    f.ignore({"parallel_tool_calls", "reasoning_effort"});

    const auto max_tokens = f.integer("max_tokens", 1, std::numeric_limits<int32_t>::max());
    const auto max_completion_tokens = f.integer("max_completion_tokens", 1, std::numeric_limits<int32_t>::max());
    if (const json* format = f.object("response_format")) {
        if (string_member(*format, "type") != "text")
            throw ApiError::unsupported("response_format", "structured output (json_object, json_schema) needs "
                                                           "guided decoding, which this server does not implement");
    }
    f.reject("functions", "use `tools` instead of the deprecated `functions`");
    f.reject("function_call", "use `tool_choice` instead of the deprecated `function_call`");
    f.reject("audio", "this server produces text only");
    f.reject("modalities", "this server produces text only");
    f.reject("prediction", "predicted outputs are not implemented");
    f.reject("web_search_options", "this server has no web search");
    f.reject("echo", "echo is supported on /v1/completions only");

    ChatPrompt prompt = render_openai_chat(f, ctx, use_tools, std::move(tools));
    f.reject_unknown();

    job.prompts.push_back(ctx.text->encode(prompt.text, prompt.add_special_tokens));
    fit_to_context(job, max_completion_tokens ? max_completion_tokens : max_tokens,
                   max_completion_tokens ? "max_completion_tokens" : "max_tokens", 0, ctx);
    return job;
}

GenerationJob parse_completion_request(const json& body, const ServingContext& ctx) {
    RequestFields f(body);
    GenerationJob job = parse_openai_common(f, ApiKind::completion, ctx);
    if (auto logprobs = f.integer("logprobs", 0, ctx.max_logprobs)) job.params.logprobs = int(*logprobs);
    const bool echo = f.boolean("echo").value_or(false);
    if (echo && job.params.logprobs >= 0)
        throw ApiError::unsupported("echo", "`echo` with `logprobs` needs prompt logprobs, which the engine does not "
                                            "compute");
    if (const json* suffix = f.get("suffix"); suffix && !(suffix->is_string() && suffix->get_ref<const std::string&>().empty()))
        throw ApiError::unsupported("suffix", "`suffix` (fill-in-the-middle) is not supported by this server");
    const auto max_tokens = f.integer("max_tokens", 1, std::numeric_limits<int32_t>::max());
    const bool add_special = f.boolean("add_special_tokens").value_or(true);

    const json* prompt = f.get("prompt");
    if (!prompt) throw ApiError::invalid("prompt", "`prompt` is required", "missing_required_parameter");
    const char* shape_error = "`prompt` must be a string, an array of strings, an array of token ids, or an array "
                              "of arrays of token ids";
    auto add_token_prompt = [&](const json& ids) {
        std::vector<int32_t> tokens;
        tokens.reserve(ids.size());
        for (const auto& id : ids) tokens.push_back(checked_token_id(id, "prompt", ctx));
        job.echo_prefixes.push_back(echo ? ctx.text->decode(tokens, false) : std::string());
        job.prompts.push_back(std::move(tokens));
    };
    auto add_text_prompt = [&](const std::string& text) {
        job.prompts.push_back(ctx.text->encode(text, add_special));
        job.echo_prefixes.push_back(echo ? text : std::string());
    };
    if (prompt->is_string()) {
        add_text_prompt(prompt->get<std::string>());
    } else if (prompt->is_array() && !prompt->empty()) {
        const json& first = prompt->front();
        if (first.is_number()) {
            add_token_prompt(*prompt);
        } else {
            if (prompt->size() > kMaxPrompts)
                throw ApiError::invalid("prompt", fmt::format("`prompt` holds {} prompts; at most {} are allowed",
                                                              prompt->size(), kMaxPrompts));
            for (const auto& p : *prompt) {
                if (p.is_string()) add_text_prompt(p.get<std::string>());
                else if (p.is_array() && !p.empty() && p.front().is_number()) add_token_prompt(p);
                else throw ApiError::invalid("prompt", shape_error, "invalid_type");
            }
        }
    } else {
        throw ApiError::invalid("prompt", shape_error, "invalid_type");
    }
    if (int64_t(job.prompts.size()) * job.params.n > ctx.max_n)
        throw ApiError::invalid("n", fmt::format("{} prompts x n = {} exceeds the {} choices one request may ask for",
                                                 job.prompts.size(), job.prompts.size() * job.params.n, ctx.max_n));
    f.reject_unknown();
    fit_to_context(job, max_tokens, "max_tokens", 16, ctx);  // 16: OpenAI's default for completions
    return job;
}

// ---- Anthropic /v1/messages ---------------------------------------------------------------------

namespace {

std::string anthropic_text(const json& content, const std::string& path) {
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array())
        throw ApiError::invalid(path, fmt::format("`{}` must be a string or an array of content blocks", path),
                                "invalid_type");
    std::string text;
    for (size_t i = 0; i < content.size(); ++i) {
        const json& block = content[i];
        if (!block.is_object() || string_member(block, "type") != "text" || !block.contains("text") ||
            !block["text"].is_string())
            throw ApiError::invalid(fmt::format("{}[{}]", path, i),
                                    fmt::format("`{}[{}]` must be a text block {{\"type\": \"text\", \"text\": ...}}",
                                                path, i), "invalid_type");
        if (!text.empty()) text += '\n';
        text += block["text"].get<std::string>();
    }
    return text;
}

struct AnthropicConversation {
    json messages = json::array();
    json tools = json::array();
    bool use_tools = false;
};

AnthropicConversation parse_anthropic_conversation(RequestFields& f) {
    AnthropicConversation conv;
    if (const json* system = f.get("system"))
        conv.messages.push_back({{"role", "system"}, {"content", anthropic_text(*system, "system")}});

    const json* messages = f.array("messages");
    if (!messages) throw ApiError::invalid("messages", "`messages` is required", "missing_required_parameter");
    if (messages->empty()) throw ApiError::invalid("messages", "`messages` must contain at least one message");
    for (size_t i = 0; i < messages->size(); ++i) {
        const json& m = (*messages)[i];
        const std::string path = fmt::format("messages[{}]", i);
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content"))
            throw ApiError::invalid(path, fmt::format("`{}` must be an object with `role` and `content`", path),
                                    "invalid_type");
        const std::string& role = m["role"].get_ref<const std::string&>();
        if (role != "user" && role != "assistant")
            throw ApiError::invalid(path + ".role", fmt::format("`{}.role` must be \"user\" or \"assistant\", got '{}'",
                                                                path, role));
        const json& content = m["content"];
        if (content.is_string()) {
            conv.messages.push_back({{"role", role}, {"content", content}});
            continue;
        }
        if (!content.is_array())
            throw ApiError::invalid(path + ".content", fmt::format("`{}.content` must be a string or an array of "
                                                                   "content blocks", path), "invalid_type");
        std::string text;
        json tool_calls = json::array();
        for (size_t k = 0; k < content.size(); ++k) {
            const json& block = content[k];
            const std::string bpath = fmt::format("{}.content[{}]", path, k);
            if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
                throw ApiError::invalid(bpath, fmt::format("`{}` must be an object with a string `type`", bpath),
                                        "invalid_type");
            const std::string& type = block["type"].get_ref<const std::string&>();
            if (type == "text") {
                if (!block.contains("text") || !block["text"].is_string())
                    throw ApiError::invalid(bpath, fmt::format("`{}.text` must be a string", bpath), "invalid_type");
                if (!text.empty()) text += '\n';
                text += block["text"].get<std::string>();
            } else if (type == "tool_use" && role == "assistant") {
                if (!block.contains("name") || !block["name"].is_string())
                    throw ApiError::invalid(bpath, fmt::format("`{}.name` must be a string", bpath), "invalid_type");
                json call = {{"type", "function"},
                             {"function", {{"name", block["name"]}, {"arguments", block.value("input", json::object())}}}};
                if (block.contains("id") && block["id"].is_string()) call["id"] = block["id"];
                tool_calls.push_back(std::move(call));
            } else if (type == "tool_result" && role == "user") {
                json result = {{"role", "tool"},
                               {"content", block.contains("content") ? anthropic_text(block["content"], bpath + ".content")
                                                                     : std::string()}};
                if (block.contains("tool_use_id") && block["tool_use_id"].is_string())
                    result["tool_call_id"] = block["tool_use_id"];
                conv.messages.push_back(std::move(result));
            } else if (type == "thinking" || type == "redacted_thinking") {
                // Earlier turns' reasoning: not part of what this model is shown.
            } else {
                throw ApiError::unsupported(bpath, fmt::format("content blocks of type `{}` are not supported here",
                                                              type));
            }
        }
        if (!text.empty() || !tool_calls.empty()) {
            json msg = {{"role", role}, {"content", text}};
            if (!tool_calls.empty()) msg["tool_calls"] = std::move(tool_calls);
            conv.messages.push_back(std::move(msg));
        }
    }

    if (const json* tools = f.array("tools")) {
        for (size_t i = 0; i < tools->size(); ++i) {
            const json& t = (*tools)[i];
            const std::string path = fmt::format("tools[{}]", i);
            if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
                throw ApiError::invalid(path, fmt::format("`{}` must be an object with `name` and `input_schema`", path),
                                        "invalid_type");
            if (t.contains("type") && t["type"] != "custom")
                throw ApiError::unsupported(path, fmt::format("server tools (`{}`) are not supported; only custom "
                                                              "tools with an input_schema", t["type"].dump()));
            json fn = {{"name", t["name"]}};
            if (t.contains("description")) fn["description"] = t["description"];
            fn["parameters"] = t.value("input_schema", json::object());
            conv.tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
        }
    }
    std::string choice = "auto";
    if (const json* tc = f.object("tool_choice")) {
        choice = string_member(*tc, "type");
        if (choice == "any" || choice == "tool")
            throw ApiError::unsupported("tool_choice", "`tool_choice` \"any\" or a named tool needs guided decoding, "
                                                       "which this server does not implement; use \"auto\"");
        if (choice != "auto" && choice != "none")
            throw ApiError::invalid("tool_choice", "`tool_choice.type` must be auto, any, tool or none");
    }
    conv.use_tools = !conv.tools.empty() && choice == "auto";
    return conv;
}

std::string render_anthropic(RequestFields& f, const ServingContext& ctx, AnthropicConversation& conv) {
    json context = {{"add_generation_prompt", true}, {"messages", conv.messages}};
    if (conv.use_tools) context["tools"] = conv.tools;
    return render(ctx, context);
}

}  // namespace

GenerationJob parse_messages_request(const json& body, const ServingContext& ctx) {
    RequestFields f(body);
    GenerationJob job;
    job.api = ApiKind::messages;
    check_model(f, ctx, false);
    const auto max_tokens = f.integer("max_tokens", 1, std::numeric_limits<int32_t>::max());
    if (!max_tokens) throw ApiError::invalid("max_tokens", "`max_tokens` is required", "missing_required_parameter");
    SamplingParams& p = job.params;
    p.temperature = float(f.number("temperature", 0.0, 1.0).value_or(ctx.defaults.temperature));
    p.top_p = float(f.number("top_p", 0.0, 1.0).value_or(ctx.defaults.top_p));
    if (p.top_p <= 0.0f) throw ApiError::invalid("top_p", "`top_p` must be in (0, 1], got 0");
    p.top_k = int(f.integer("top_k", 0, std::numeric_limits<int32_t>::max()).value_or(ctx.defaults.top_k));
    p.min_p = ctx.defaults.min_p;
    p.repetition_penalty = ctx.defaults.repetition_penalty;
    p.stop = parse_stop(f, "stop_sequences");
    job.stream = f.boolean("stream").value_or(false);
    job.include_usage = true;
    // Extended thinking is a Claude feature; the served model thinks (or not) as its template says.
    f.ignore({"metadata", "thinking", "service_tier"});
    f.reject("container", "code execution containers are not supported");
    f.reject("mcp_servers", "MCP connectors are not supported");

    AnthropicConversation conv = parse_anthropic_conversation(f);
    job.tool_format = conv.use_tools ? ctx.tool_format : ToolCallFormat::none;
    const std::string prompt = render_anthropic(f, ctx, conv);
    f.reject_unknown();
    job.prompts.push_back(ctx.text->encode(prompt, false));
    fit_to_context(job, max_tokens, "max_tokens", 0, ctx);
    return job;
}

nlohmann::json count_message_tokens(const json& body, const ServingContext& ctx) {
    RequestFields f(body);
    check_model(f, ctx, false);
    f.ignore({"tool_choice", "thinking", "metadata"});
    AnthropicConversation conv = parse_anthropic_conversation(f);
    const std::string prompt = render_anthropic(f, ctx, conv);
    f.reject_unknown();
    return {{"input_tokens", ctx.text->encode(prompt, false).size()}};
}

// ---- vLLM's /tokenize, /detokenize; /v1/models ----------------------------------------------------

nlohmann::json tokenize_response(const json& body, const ServingContext& ctx) {
    RequestFields f(body);
    check_model(f, ctx, false);
    std::vector<int32_t> ids;
    if (f.get("messages")) {
        json tools = json::array();
        if (const json* t = f.array("tools")) tools = openai_tools_for_template(*t);
        const bool has_tools = !tools.empty();
        ChatPrompt prompt = render_openai_chat(f, ctx, has_tools, std::move(tools));
        ids = ctx.text->encode(prompt.text, prompt.add_special_tokens);
    } else {
        const auto prompt = f.string("prompt");
        if (!prompt) throw ApiError::invalid("prompt", "`prompt` (a string) or `messages` is required",
                                             "missing_required_parameter");
        ids = ctx.text->encode(*prompt, f.boolean("add_special_tokens").value_or(true));
    }
    const bool token_strs = f.boolean("return_token_strs").value_or(false);
    f.reject_unknown();
    json out = {{"count", ids.size()}, {"max_model_len", ctx.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
    if (token_strs) {
        json strs = json::array();
        for (int32_t id : ids) strs.push_back(ctx.text->decode(std::span<const int32_t>(&id, 1), false));
        out["token_strs"] = std::move(strs);
    }
    return out;
}

nlohmann::json detokenize_response(const json& body, const ServingContext& ctx) {
    RequestFields f(body);
    check_model(f, ctx, false);
    const json* tokens = f.array("tokens");
    if (!tokens) throw ApiError::invalid("tokens", "`tokens` (an array of token ids) is required",
                                         "missing_required_parameter");
    std::vector<int32_t> ids;
    for (const auto& id : *tokens) ids.push_back(checked_token_id(id, "tokens", ctx));
    f.reject_unknown();
    return {{"prompt", ctx.text->decode(ids, false)}};
}

nlohmann::json models_response(const ServingContext& ctx, int64_t created) {
    return {{"object", "list"},
            {"data", json::array({{{"id", ctx.model_name},
                                   {"object", "model"},
                                   {"created", created},
                                   {"owned_by", "scratchy"},
                                   {"root", ctx.model_name},
                                   {"parent", nullptr},
                                   {"max_model_len", ctx.max_model_len}}})}};
}

void check_api_key(const std::string& configured, std::string_view authorization, std::string_view x_api_key) {
    if (configured.empty()) return;
    constexpr std::string_view bearer = "Bearer ";
    std::string_view given = x_api_key;
    if (authorization.starts_with(bearer)) given = authorization.substr(bearer.size());
    if (given.empty())
        throw ApiError(401, "invalid_request_error", "Missing API key: send it as `Authorization: Bearer <key>`", "",
                       "invalid_api_key");
    // Compare in time independent of where the first difference is.
    unsigned diff = given.size() != configured.size();
    for (size_t i = 0; i < given.size(); ++i) diff |= unsigned(given[i] ^ configured[i % configured.size()]);
    if (diff) throw ApiError(401, "invalid_request_error", "Incorrect API key provided", "", "invalid_api_key");
}

}  // namespace scr::server
