// The HTTP API's protocol layer, free of sockets and of any model: request bodies in, engine requests
// out; engine outputs in, response bytes (JSON bodies or SSE events) out. OpenAI chat completions and
// completions, Anthropic messages, tokenize/detokenize. The HTTP glue (http_server.cpp) only moves
// bytes between this layer, the engine and the sockets, so everything here is unit-tested without
// either (tests/server/).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/engine.hpp"
#include "server/api_error.hpp"
#include "server/tool_calls.hpp"

namespace scr::server {

// What the protocol needs from the model's text side (its tokenizer and chat template).
class TextFrontend {
public:
    virtual ~TextFrontend() = default;
    virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
    virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;
    // context: {"messages": [...], "tools": [...], "add_generation_prompt": bool, template kwargs...},
    // keys in the client's order (templates' tojson shows it). Throws scr::Error when the template
    // rejects the conversation.
    virtual std::string render_chat(const nlohmann::ordered_json& context) const = 0;
    virtual int vocab_size() const = 0;
};

// Sampling defaults a request does not override (vLLM reads them from generation_config.json).
struct SamplingDefaults {
    float temperature = 1.0f;
    float top_p = 1.0f;
    int top_k = 0;
    float min_p = 0.0f;
    float repetition_penalty = 1.0f;
};

// Everything about the served model that request handling needs.
struct ServingContext {
    std::string model_name;          // the `model` clients must send
    int max_model_len = 0;           // prompt + output tokens
    int max_n = 64;                  // most samples per request (each holds a sequence slot)
    int max_logprobs = 20;
    ToolCallFormat tool_format = ToolCallFormat::none;  // how this model writes tool calls
    SamplingDefaults defaults;
    std::vector<int32_t> end_of_turn_ids;  // always stop on these (eos, <|eot_id|>, <|im_end|> ...)
    const TextFrontend* text = nullptr;
};

enum class ApiKind { chat, completion, messages };

// A parsed, validated generation request: one engine request per prompt, each with `params.n` samples.
// Choice i belongs to prompt i / n, sample i % n.
struct GenerationJob {
    ApiKind api = ApiKind::chat;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> echo_prefixes;  // completions with echo: each prompt's text, else empty
    SamplingParams params;
    int priority = 0;
    bool stream = false;
    bool include_usage = false;        // stream_options.include_usage
    bool continuous_usage = false;     // stream_options.continuous_usage_stats (vLLM)
    ToolCallFormat tool_format = ToolCallFormat::none;  // none unless the request offers tools
    // vLLM's `truncate_prompt_tokens`: keep each prompt's last k tokens (-1: the context length).
    std::optional<int64_t> truncate_prompt_tokens;
    int num_choices() const { return int(prompts.size()) * params.n; }
};

// Request bodies keep the client's key order (ordered_json): tool schemas reach the chat template as sent.
using RequestJson = nlohmann::ordered_json;

// Body -> JSON object; ApiError 400 for empty, malformed, non-object or too deeply nested bodies.
RequestJson parse_json_body(std::string_view body);

GenerationJob parse_chat_request(const RequestJson& body, const ServingContext& ctx);
GenerationJob parse_completion_request(const RequestJson& body, const ServingContext& ctx);
GenerationJob parse_messages_request(const RequestJson& body, const ServingContext& ctx);
// Anthropic's /v1/messages/count_tokens: {"input_tokens": N}.
nlohmann::json count_message_tokens(const RequestJson& body, const ServingContext& ctx);

// vLLM's /tokenize ({"prompt"} or {"messages"}) and /detokenize ({"tokens"}).
nlohmann::json tokenize_response(const RequestJson& body, const ServingContext& ctx);
nlohmann::json detokenize_response(const RequestJson& body, const ServingContext& ctx);
nlohmann::json models_response(const ServingContext& ctx, int64_t created);

// 401 unless `headers_key` (from "Authorization: Bearer K" or "x-api-key: K") equals the
// configured key; no key configured: everything passes.
void check_api_key(const std::string& configured, std::string_view authorization,
                   std::string_view x_api_key);

// Engine news for one choice since the last look: deltas appended, counters latest.
struct ChoiceDelta {
    std::string text;
    std::vector<int32_t> token_ids;
    std::vector<TokenLogprob> logprobs;
    FinishReason finish = FinishReason::none;
    std::string stop_reason;
    std::string error;
    int num_prompt_tokens = 0;
    int num_output_tokens = 0;
    int num_cached_tokens = 0;
    bool has_news = false;

    // Appends one engine output (the engine thread calls this under the request's lock).
    void merge(const RequestOutput& out);
    // Empties the delta, keeping its buffers' capacity.
    void clear();
};

// Turns engine news into the bytes of one response. Streaming: each call appends SSE events.
// Non-streaming: output accumulates and on_complete appends the JSON body.
class ResponseWriter {
public:
    virtual ~ResponseWriter() = default;
    virtual const char* content_type() const = 0;
    // News for choice `index`; the choice's last call carries its finish_reason (stop or length).
    virtual void on_delta(int index, const ChoiceDelta& delta, std::string& out) = 0;
    // All choices finished: stream -> usage chunk and terminator; non-stream -> the response body.
    virtual void on_complete(std::string& out) = 0;
    // Generation failed after the response began: an SSE error event (stream) or the error body.
    virtual void on_failure(const ApiError& error, std::string& out) = 0;
};

std::unique_ptr<ResponseWriter> make_response_writer(const GenerationJob& job, const ServingContext& ctx,
                                                     std::string response_id, int64_t created_unix);

// "chatcmpl-<24 hex>", "cmpl-...", "msg_...", "call_..."; unique per process in practice.
std::string random_id(std::string_view prefix);

// OpenAI finish_reason for an engine finish ("stop", "length"; "abort"/"error" for failures).
const char* openai_finish_reason(FinishReason r);

}  // namespace scr::server
