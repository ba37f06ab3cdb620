// Response side of the protocol: engine news per choice -> OpenAI chat/completions bodies and SSE
// chunks, Anthropic messages and their event stream. The shapes follow OpenAI's and Anthropic's API
// references (and vLLM's `stop_reason` extension).
#include <fmt/format.h>

#include <random>
#include <thread>

#include "server/protocol.hpp"

namespace scr::server {

using nlohmann::json;

void ChoiceDelta::merge(const RequestOutput& out) {
    text += out.new_text;
    token_ids.insert(token_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    logprobs.insert(logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    if (out.finished()) {
        finish = out.finish_reason;
        stop_reason = out.stop_reason;
        error = out.error;
    }
    num_prompt_tokens = out.num_prompt_tokens;
    num_output_tokens = out.num_output_tokens;
    num_cached_tokens = out.num_cached_tokens;
    has_news = true;
}

void ChoiceDelta::clear() {
    text.clear();
    token_ids.clear();
    logprobs.clear();
    finish = FinishReason::none;
    stop_reason.clear();
    error.clear();
    has_news = false;
}

std::string random_id(std::string_view prefix) {
    thread_local std::mt19937_64 rng(std::random_device{}() ^
                                     std::hash<std::thread::id>{}(std::this_thread::get_id()));
    return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

const char* openai_finish_reason(FinishReason r) {
    switch (r) {
        case FinishReason::stop: return "stop";
        case FinishReason::length: return "length";
        case FinishReason::abort: return "abort";
        case FinishReason::error: return "error";
        case FinishReason::none: break;
    }
    return nullptr;
}

namespace {

bool finished_normally(FinishReason r) { return r == FinishReason::stop || r == FinishReason::length; }

// Appends `text` as a JSON string literal. Text from the engine is valid UTF-8 (its contract), so
// only quotes, backslashes and control characters need escapes.
void append_json_string(std::string& out, std::string_view text) {
    out += '"';
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
                else out += ch;
        }
    }
    out += '"';
}

void append_sse(std::string& out, const json& data) {
    out += "data: ";
    out += to_wire(data);
    out += "\n\n";
}

json token_bytes(const std::string& piece) {
    json bytes = json::array();
    for (unsigned char c : piece) bytes.push_back(int(c));
    return bytes;
}

// State shared by the three writers: ids, usage counting, per-choice tool-call parsing.
class WriterBase : public ResponseWriter {
public:
    WriterBase(const GenerationJob& job, const ServingContext& ctx, std::string id, int64_t created)
        : ctx_(ctx), id_(std::move(id)), model_(ctx.model_name), created_(created), n_(job.params.n),
          stream_(job.stream), include_usage_(job.include_usage), continuous_usage_(job.continuous_usage),
          want_logprobs_(job.params.logprobs >= 0), stops_(job.params.stop) {
        for (const auto& p : job.prompts) prompt_tokens_.push_back(int(p.size()));
        cached_tokens_.assign(job.prompts.size(), 0);
        for (int i = 0; i < job.num_choices(); ++i) choices_.emplace_back(job.tool_format);
    }

    const char* content_type() const override { return stream_ ? "text/event-stream" : "application/json"; }

protected:
    struct Choice {
        explicit Choice(ToolCallFormat f) : tools(f) {}
        ToolCallParser tools;
        std::string content;                 // non-stream: the whole reply
        std::vector<ParsedToolCall> calls;   // non-stream: every call; stream: calls so far are counted
        int num_calls = 0;
        json logprobs = json::array();       // non-stream: accumulated entries
        int output_tokens = 0;
        FinishReason finish = FinishReason::none;
        std::string stop_reason;
        bool started = false;
    };

    // Bookkeeping common to every delta; returns the choice.
    Choice& account(int index, const ChoiceDelta& d) {
        Choice& c = choices_.at(size_t(index));
        const size_t prompt = size_t(index / n_);
        if (d.num_prompt_tokens > 0) prompt_tokens_[prompt] = d.num_prompt_tokens;
        cached_tokens_[prompt] = std::max(cached_tokens_[prompt], d.num_cached_tokens);
        c.output_tokens = std::max(c.output_tokens, d.num_output_tokens);
        if (finished_normally(d.finish)) {
            c.finish = d.finish;
            c.stop_reason = d.stop_reason;
        }
        return c;
    }

    // The delta's choice (account()), its text split by the choice's tool-call parser into what the
    // client sees (content_) and the calls it completed (calls_); a non-streamed reply keeps both
    // for its one body (the calls moved there).
    Choice& split_delta(int index, const ChoiceDelta& d) {
        Choice& c = account(index, d);
        content_.clear();
        calls_.clear();
        c.tools.feed(d.text, content_, calls_);
        if (finished_normally(d.finish)) c.tools.finish(content_, calls_);
        if (!stream_) {
            c.content += content_;
            for (auto& call : calls_) c.calls.push_back(std::move(call));
        }
        return c;
    }

    std::string piece(int32_t id) const { return ctx_.text->decode(std::span<const int32_t>(&id, 1), false); }

    int total_prompt_tokens() const {
        int sum = 0;
        for (int p : prompt_tokens_) sum += p;
        return sum;
    }
    int total_output_tokens() const {
        int sum = 0;
        for (const auto& c : choices_) sum += c.output_tokens;
        return sum;
    }
    int total_cached_tokens() const {
        int sum = 0;
        for (int p : cached_tokens_) sum += p;
        return sum;
    }

    json openai_usage() const {
        const int prompt = total_prompt_tokens(), completion = total_output_tokens();
        return {{"prompt_tokens", prompt},
                {"completion_tokens", completion},
                {"total_tokens", prompt + completion},
                {"prompt_tokens_details", {{"cached_tokens", total_cached_tokens()}}}};
    }

    // The client's stop string that ended the choice (vLLM's `stop_reason`), else null.
    json stop_reason_json(const Choice& c) const {
        if (c.finish == FinishReason::stop && std::find(stops_.begin(), stops_.end(), c.stop_reason) != stops_.end())
            return c.stop_reason;
        return nullptr;
    }

    void openai_stream_failure(const ApiError& e, std::string& out) const {
        append_sse(out, openai_error_body(e));
        out += "data: [DONE]\n\n";
    }

    const ServingContext& ctx_;
    std::string id_, model_;
    int64_t created_;
    int n_;
    bool stream_, include_usage_, continuous_usage_, want_logprobs_;
    std::vector<std::string> stops_;
    std::vector<int> prompt_tokens_, cached_tokens_;
    std::vector<Choice> choices_;
    std::string content_;                // split_delta's scratch, reused across deltas
    std::vector<ParsedToolCall> calls_;  // split_delta's scratch
};

// ---- POST /v1/chat/completions --------------------------------------------------------------------

class ChatWriter final : public WriterBase {
public:
    using WriterBase::WriterBase;

    void on_delta(int index, const ChoiceDelta& d, std::string& out) override {
        Choice& c = split_delta(index, d);
        json logprobs = want_logprobs_ ? logprob_entries(d) : json();
        if (!stream_) {
            if (want_logprobs_) c.logprobs.insert(c.logprobs.end(), logprobs.begin(), logprobs.end());
            return;
        }
        if (!c.started) {
            c.started = true;
            append_chunk(out, index, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr, nullptr);
        }
        if (!content_.empty() || (want_logprobs_ && !logprobs.empty())) {
            if (!want_logprobs_ && !continuous_usage_) append_content_chunk(out, index, content_);
            else append_chunk(out, index, {{"content", content_}},
                              want_logprobs_ ? json{{"content", std::move(logprobs)}} : json(), nullptr, nullptr);
        }
        for (const auto& call : calls_) {
            json delta = {{"tool_calls", json::array({{{"index", c.num_calls++},
                                                       {"id", random_id("call_")},
                                                       {"type", "function"},
                                                       {"function", {{"name", call.name},
                                                                     {"arguments", call.arguments}}}}})}};
            append_chunk(out, index, delta, nullptr, nullptr, nullptr);
        }
        if (finished_normally(d.finish))
            append_chunk(out, index, json::object(), nullptr, finish_reason(c), stop_reason_json(c));
    }

    void on_complete(std::string& out) override {
        if (stream_) {
            if (include_usage_) {
                json chunk = chunk_header();
                chunk["choices"] = json::array();
                chunk["usage"] = openai_usage();
                append_sse(out, chunk);
            }
            out += "data: [DONE]\n\n";
            return;
        }
        json choices = json::array();
        for (size_t i = 0; i < choices_.size(); ++i) {
            const Choice& c = choices_[i];
            json message = {{"role", "assistant"}, {"content", c.content}, {"refusal", nullptr}};
            if (!c.calls.empty()) {
                json calls = json::array();
                for (const auto& call : c.calls)
                    calls.push_back({{"id", random_id("call_")},
                                     {"type", "function"},
                                     {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
                message["tool_calls"] = std::move(calls);
                if (c.content.empty()) message["content"] = nullptr;
            }
            choices.push_back({{"index", i},
                               {"message", std::move(message)},
                               {"logprobs", want_logprobs_ ? json{{"content", c.logprobs}} : json()},
                               {"finish_reason", finish_reason(c)},
                               {"stop_reason", stop_reason_json(c)}});
        }
        out += to_wire({{"id", id_},
                        {"object", "chat.completion"},
                        {"created", created_},
                        {"model", model_},
                        {"choices", std::move(choices)},
                        {"usage", openai_usage()}});
    }

    void on_failure(const ApiError& e, std::string& out) override {
        if (stream_) openai_stream_failure(e, out);
        else out += to_wire(openai_error_body(e));
    }

private:
    const char* finish_reason(const Choice& c) const {
        if (c.finish == FinishReason::stop && (c.num_calls > 0 || !c.calls.empty())) return "tool_calls";
        return openai_finish_reason(c.finish);
    }

    json chunk_header() const {
        return {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", model_}};
    }

    void append_chunk(std::string& out, int index, json delta, json logprobs, const char* finish, json stop_reason) {
        json choice = {{"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)},
                       {"finish_reason", finish ? json(finish) : json()}};
        if (finish) choice["stop_reason"] = std::move(stop_reason);
        json chunk = chunk_header();
        chunk["choices"] = json::array({std::move(choice)});
        if (continuous_usage_) chunk["usage"] = openai_usage();
        else if (include_usage_) chunk["usage"] = nullptr;
        append_sse(out, chunk);
    }

    // The hot path (one per engine step per stream): a text delta, written without building a DOM.
    void append_content_chunk(std::string& out, int index, std::string_view text) {
        if (chunk_prefix_.empty()) {
            chunk_prefix_ = "data: {\"id\":";
            append_json_string(chunk_prefix_, id_);
            chunk_prefix_ += fmt::format(",\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":", created_);
            append_json_string(chunk_prefix_, model_);
            chunk_prefix_ += ",\"choices\":[{\"index\":";
        }
        out += chunk_prefix_;
        fmt::format_to(std::back_inserter(out), "{}", index);
        out += ",\"delta\":{\"content\":";
        append_json_string(out, text);
        out += "},\"logprobs\":null,\"finish_reason\":null}]";
        if (include_usage_) out += ",\"usage\":null";
        out += "}\n\n";
    }

    json logprob_entries(const ChoiceDelta& d) const {
        json entries = json::array();
        for (const auto& lp : d.logprobs) {
            json top = json::array();
            for (const auto& [id, logprob] : lp.top) {
                const std::string p = piece(id);
                top.push_back({{"token", p}, {"logprob", logprob}, {"bytes", token_bytes(p)}});
            }
            const std::string p = piece(lp.token_id);
            entries.push_back({{"token", p}, {"logprob", lp.logprob}, {"bytes", token_bytes(p)},
                               {"top_logprobs", std::move(top)}});
        }
        return entries;
    }

    std::string chunk_prefix_;
};

// ---- POST /v1/completions -------------------------------------------------------------------------

class CompletionWriter final : public WriterBase {
public:
    CompletionWriter(const GenerationJob& job, const ServingContext& ctx, std::string id, int64_t created)
        : WriterBase(job, ctx, std::move(id), created), echo_prefixes_(job.echo_prefixes) {
        text_offsets_.assign(choices_.size(), 0);
        for (size_t i = 0; i < choices_.size(); ++i) {
            choices_[i].content = echo_prefix(int(i));
            text_offsets_[i] = int(choices_[i].content.size());
        }
    }

    void on_delta(int index, const ChoiceDelta& d, std::string& out) override {
        Choice& c = account(index, d);
        json logprobs = want_logprobs_ ? logprob_block(index, d) : json();
        if (!stream_) {
            c.content += d.text;
            if (want_logprobs_) merge_logprobs(c.logprobs, logprobs);
            return;
        }
        std::string text;
        if (!c.started) {
            c.started = true;
            text = echo_prefix(index);
        }
        text += d.text;
        const bool finishing = finished_normally(d.finish);
        if (text.empty() && !finishing && !(want_logprobs_ && !d.logprobs.empty())) return;
        json choice = {{"index", index}, {"text", std::move(text)}, {"logprobs", std::move(logprobs)},
                       {"finish_reason", finishing ? json(openai_finish_reason(c.finish)) : json()}};
        if (finishing) choice["stop_reason"] = stop_reason_json(c);
        json chunk = header();
        chunk["choices"] = json::array({std::move(choice)});
        if (continuous_usage_) chunk["usage"] = openai_usage();
        else if (include_usage_) chunk["usage"] = nullptr;
        append_sse(out, chunk);
    }

    void on_complete(std::string& out) override {
        if (stream_) {
            if (include_usage_) {
                json chunk = header();
                chunk["choices"] = json::array();
                chunk["usage"] = openai_usage();
                append_sse(out, chunk);
            }
            out += "data: [DONE]\n\n";
            return;
        }
        json choices = json::array();
        for (size_t i = 0; i < choices_.size(); ++i) {
            const Choice& c = choices_[i];
            choices.push_back({{"index", i},
                               {"text", c.content},
                               {"logprobs", want_logprobs_ ? c.logprobs : json()},
                               {"finish_reason", openai_finish_reason(c.finish)},
                               {"stop_reason", stop_reason_json(c)}});
        }
        json body = header();
        body["choices"] = std::move(choices);
        body["usage"] = openai_usage();
        out += to_wire(body);
    }

    void on_failure(const ApiError& e, std::string& out) override {
        if (stream_) openai_stream_failure(e, out);
        else out += to_wire(openai_error_body(e));
    }

private:
    std::string echo_prefix(int index) const {
        const size_t prompt = size_t(index / n_);
        return prompt < echo_prefixes_.size() ? echo_prefixes_[prompt] : std::string();
    }

    json header() const {
        return {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_}};
    }

    // The legacy completions logprobs block for the tokens of one delta.
    json logprob_block(int index, const ChoiceDelta& d) {
        json block = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                      {"text_offset", json::array()}};
        for (const auto& lp : d.logprobs) {
            const std::string p = piece(lp.token_id);
            json top = json::object();
            for (const auto& [id, logprob] : lp.top) top[piece(id)] = logprob;
            block["tokens"].push_back(p);
            block["token_logprobs"].push_back(lp.logprob);
            block["top_logprobs"].push_back(std::move(top));
            block["text_offset"].push_back(text_offsets_[size_t(index)]);
            text_offsets_[size_t(index)] += int(p.size());
        }
        return block;
    }

    static void merge_logprobs(json& into, const json& block) {
        if (into.empty()) {
            into = block;
            return;
        }
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
            for (const auto& v : block[key]) into[key].push_back(v);
    }

    std::vector<std::string> echo_prefixes_;
    std::vector<int> text_offsets_;
};

// ---- POST /v1/messages (Anthropic) ----------------------------------------------------------------

class MessagesWriter final : public WriterBase {
public:
    using WriterBase::WriterBase;

    void on_delta(int index, const ChoiceDelta& d, std::string& out) override {
        Choice& c = split_delta(index, d);
        if (!stream_) return;
        if (!c.started) {
            c.started = true;
            json message = message_shell();
            message["content"] = json::array();
            message["usage"] = {{"input_tokens", total_prompt_tokens()}, {"output_tokens", 0},
                                {"cache_read_input_tokens", total_cached_tokens()}};
            event(out, "message_start", {{"type", "message_start"}, {"message", std::move(message)}});
            event(out, "ping", {{"type", "ping"}});
        }
        if (!content_.empty()) {
            if (!text_block_open_) {
                text_block_open_ = true;
                event(out, "content_block_start", {{"type", "content_block_start"}, {"index", next_block_},
                                                   {"content_block", {{"type", "text"}, {"text", ""}}}});
            }
            event(out, "content_block_delta", {{"type", "content_block_delta"}, {"index", next_block_},
                                               {"delta", {{"type", "text_delta"}, {"text", content_}}}});
        }
        for (const auto& call : calls_) {
            close_text_block(out);
            ++c.num_calls;
            json block = {{"type", "tool_use"}, {"id", random_id("toolu_")}, {"name", call.name},
                          {"input", json::object()}};
            event(out, "content_block_start", {{"type", "content_block_start"}, {"index", next_block_},
                                               {"content_block", std::move(block)}});
            event(out, "content_block_delta", {{"type", "content_block_delta"}, {"index", next_block_},
                                               {"delta", {{"type", "input_json_delta"},
                                                          {"partial_json", call.arguments}}}});
            event(out, "content_block_stop", {{"type", "content_block_stop"}, {"index", next_block_}});
            ++next_block_;
        }
        if (finished_normally(d.finish)) {
            if (next_block_ == 0 && !text_block_open_) {  // an empty reply still has one (empty) text block
                event(out, "content_block_start", {{"type", "content_block_start"}, {"index", 0},
                                                   {"content_block", {{"type", "text"}, {"text", ""}}}});
                text_block_open_ = true;
            }
            close_text_block(out);
            event(out, "message_delta", {{"type", "message_delta"},
                                         {"delta", {{"stop_reason", stop_reason(c)}, {"stop_sequence", stop_sequence(c)}}},
                                         {"usage", {{"output_tokens", c.output_tokens}}}});
        }
    }

    void on_complete(std::string& out) override {
        if (stream_) {
            event(out, "message_stop", {{"type", "message_stop"}});
            return;
        }
        const Choice& c = choices_.at(0);
        json content = json::array();
        if (!c.content.empty() || c.calls.empty()) content.push_back({{"type", "text"}, {"text", c.content}});
        for (const auto& call : c.calls) {
            json input = json::parse(call.arguments, nullptr, false);
            if (!input.is_object()) input = json::object();
            content.push_back({{"type", "tool_use"}, {"id", random_id("toolu_")}, {"name", call.name},
                               {"input", std::move(input)}});
        }
        json message = message_shell();
        message["content"] = std::move(content);
        message["stop_reason"] = stop_reason(c);
        message["stop_sequence"] = stop_sequence(c);
        message["usage"] = {{"input_tokens", total_prompt_tokens()}, {"output_tokens", c.output_tokens},
                            {"cache_read_input_tokens", total_cached_tokens()}};
        out += to_wire(message);
    }

    void on_failure(const ApiError& e, std::string& out) override {
        if (stream_) event(out, "error", anthropic_error_body(e));
        else out += to_wire(anthropic_error_body(e));
    }

private:
    json message_shell() const {
        return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_},
                {"stop_reason", nullptr}, {"stop_sequence", nullptr}};
    }

    const char* stop_reason(const Choice& c) const {
        if (c.finish == FinishReason::length) return "max_tokens";
        if (c.num_calls > 0 || !c.calls.empty()) return "tool_use";
        if (!stop_sequence(c).is_null()) return "stop_sequence";
        return "end_turn";
    }
    json stop_sequence(const Choice& c) const { return stop_reason_json(c); }

    void close_text_block(std::string& out) {
        if (!text_block_open_) return;
        event(out, "content_block_stop", {{"type", "content_block_stop"}, {"index", next_block_}});
        text_block_open_ = false;
        ++next_block_;
    }

    static void event(std::string& out, const char* name, const json& data) {
        out += "event: ";
        out += name;
        out += "\ndata: ";
        out += to_wire(data);
        out += "\n\n";
    }

    bool text_block_open_ = false;
    int next_block_ = 0;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_response_writer(const GenerationJob& job, const ServingContext& ctx,
                                                     std::string response_id, int64_t created_unix) {
    switch (job.api) {
        case ApiKind::chat: return std::make_unique<ChatWriter>(job, ctx, std::move(response_id), created_unix);
        case ApiKind::completion:
            return std::make_unique<CompletionWriter>(job, ctx, std::move(response_id), created_unix);
        case ApiKind::messages: return std::make_unique<MessagesWriter>(job, ctx, std::move(response_id), created_unix);
    }
    return nullptr;
}

}  // namespace scr::server
