// Response building: engine news -> the JSON bodies and SSE streams of OpenAI's and Anthropic's API
// references (field names, event order, finish reasons, usage sums).
#include <gtest/gtest.h>

#include "server/protocol.hpp"
#include "tests/server/fake_model.hpp"

namespace scr::server {
namespace {

using nlohmann::json;
using testing::ByteText;

struct SseEvent {
    std::string event;  // "" when the stream names none (OpenAI)
    std::string data;
    json parsed() const { return json::parse(data); }
};

std::vector<SseEvent> parse_sse(const std::string& stream) {
    std::vector<SseEvent> events;
    size_t pos = 0;
    while (pos < stream.size()) {
        const size_t end = stream.find("\n\n", pos);
        EXPECT_NE(end, std::string::npos) << "unterminated event in: " << stream.substr(pos);
        if (end == std::string::npos) break;
        SseEvent e;
        std::string_view block(stream.data() + pos, end - pos);
        while (!block.empty()) {
            const size_t nl = block.find('\n');
            const std::string_view line = block.substr(0, nl);
            if (line.starts_with("event: ")) e.event = line.substr(7);
            else if (line.starts_with("data: ")) e.data = line.substr(6);
            else ADD_FAILURE() << "unexpected SSE line: " << line;
            block = nl == std::string_view::npos ? std::string_view() : block.substr(nl + 1);
        }
        events.push_back(std::move(e));
        pos = end + 2;
    }
    return events;
}

ChoiceDelta delta(std::string text, std::vector<int32_t> ids, int prompt_tokens, int output_tokens,
                  FinishReason finish = FinishReason::none, std::string stop_reason = {}) {
    ChoiceDelta d;
    d.text = std::move(text);
    d.token_ids = std::move(ids);
    d.num_prompt_tokens = prompt_tokens;
    d.num_output_tokens = output_tokens;
    d.finish = finish;
    d.stop_reason = std::move(stop_reason);
    d.has_news = true;
    return d;
}

class Responses : public ::testing::Test {
protected:
    Responses() {
        ctx.model_name = "m";
        ctx.max_model_len = 100;
        ctx.text = &text;
    }
    GenerationJob job(ApiKind api, int prompts, int n, bool stream) {
        GenerationJob j;
        j.api = api;
        for (int i = 0; i < prompts; ++i) j.prompts.push_back(std::vector<int32_t>(size_t(3 + i), 5));
        j.echo_prefixes.assign(size_t(prompts), "");
        j.params.n = n;
        j.stream = stream;
        return j;
    }
    ByteText text;
    ServingContext ctx;
};

TEST_F(Responses, ChatNonStreamBody) {
    auto j = job(ApiKind::chat, 1, 2, false);
    j.params.stop = {"END"};
    auto w = make_response_writer(j, ctx, "chatcmpl-1", 1700000000);
    EXPECT_STREQ(w->content_type(), "application/json");
    std::string out;
    w->on_delta(0, delta("Hel", {10, 11}, 3, 2), out);
    w->on_delta(1, delta("Bye", {12}, 3, 1, FinishReason::length), out);
    w->on_delta(0, delta("lo", {13}, 3, 3, FinishReason::stop, "END"), out);
    EXPECT_TRUE(out.empty());  // nothing is written before the end
    w->on_complete(out);
    const json body = json::parse(out);
    EXPECT_EQ(body["id"], "chatcmpl-1");
    EXPECT_EQ(body["object"], "chat.completion");
    EXPECT_EQ(body["created"], 1700000000);
    EXPECT_EQ(body["model"], "m");
    ASSERT_EQ(body["choices"].size(), 2u);
    EXPECT_EQ(body["choices"][0]["index"], 0);
    EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
    EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello");
    EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(body["choices"][0]["stop_reason"], "END");
    EXPECT_EQ(body["choices"][0]["logprobs"], nullptr);
    EXPECT_EQ(body["choices"][1]["message"]["content"], "Bye");
    EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
    // The prompt counts once; completion tokens sum over the samples.
    EXPECT_EQ(body["usage"], json({{"prompt_tokens", 3}, {"completion_tokens", 4}, {"total_tokens", 7},
                                   {"prompt_tokens_details", {{"cached_tokens", 0}}}}));
}

TEST_F(Responses, ChatStreamChunksAndUsage) {
    auto j = job(ApiKind::chat, 1, 1, true);
    j.include_usage = true;
    auto w = make_response_writer(j, ctx, "chatcmpl-2", 5);
    EXPECT_STREQ(w->content_type(), "text/event-stream");
    std::string out;
    w->on_delta(0, delta("a \"quoted\"\n\ttab\x01", {1, 2}, 3, 2), out);
    w->on_delta(0, delta("", {9}, 3, 3, FinishReason::stop), out);
    w->on_complete(out);
    const auto events = parse_sse(out);
    ASSERT_EQ(events.size(), 5u) << out;
    const json first = events[0].parsed();
    EXPECT_EQ(first["object"], "chat.completion.chunk");
    EXPECT_EQ(first["id"], "chatcmpl-2");
    EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
    EXPECT_EQ(first["usage"], nullptr);
    const json content = events[1].parsed();
    EXPECT_EQ(content["choices"][0]["delta"]["content"], "a \"quoted\"\n\ttab\x01");
    EXPECT_EQ(content["choices"][0]["finish_reason"], nullptr);
    EXPECT_TRUE(content.contains("usage") && content["usage"].is_null());
    const json last = events[2].parsed();
    EXPECT_EQ(last["choices"][0]["delta"], json::object());
    EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
    const json usage = events[3].parsed();
    EXPECT_EQ(usage["choices"], json::array());
    EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
    EXPECT_EQ(usage["usage"]["prompt_tokens"], 3);
    EXPECT_EQ(events[4].data, "[DONE]");
}

TEST_F(Responses, ChatStreamWithoutUsageOmitsTheUsageField) {
    auto w = make_response_writer(job(ApiKind::chat, 1, 1, true), ctx, "c", 0);
    std::string out;
    w->on_delta(0, delta("x", {1}, 3, 1, FinishReason::length), out);
    w->on_complete(out);
    const auto events = parse_sse(out);
    ASSERT_EQ(events.size(), 4u);
    for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(events[i].parsed().contains("usage"));
    EXPECT_EQ(events[2].parsed()["choices"][0]["finish_reason"], "length");
}

TEST_F(Responses, ChatToolCalls) {
    auto j = job(ApiKind::chat, 1, 1, false);
    j.tool_format = ToolCallFormat::hermes;
    auto w = make_response_writer(j, ctx, "c", 0);
    std::string out;
    w->on_delta(0, delta("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}</tool_call>", {1}, 3, 9,
                         FinishReason::stop), out);
    w->on_complete(out);
    const json choice = json::parse(out)["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    EXPECT_EQ(choice["message"]["content"], nullptr);
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
    const json call = choice["message"]["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));
    EXPECT_EQ(call["function"]["name"], "f");
    EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"a", {1, 2}}}));

    j.stream = true;
    auto ws = make_response_writer(j, ctx, "c", 0);
    out.clear();
    ws->on_delta(0, delta("Sure. <tool_", {1}, 3, 1), out);
    ws->on_delta(0, delta("call>{\"name\": \"g\", \"arguments\": {}}</tool_call>", {2}, 3, 2, FinishReason::stop), out);
    ws->on_complete(out);
    const auto events = parse_sse(out);
    std::string content;
    json calls = json::array();
    std::string finish;
    for (const auto& e : events) {
        if (e.data == "[DONE]") continue;
        const json c = e.parsed()["choices"][0];
        if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
        if (c["delta"].contains("tool_calls")) calls.push_back(c["delta"]["tool_calls"][0]);
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_EQ(content, "Sure.");
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0]["index"], 0);
    EXPECT_EQ(calls[0]["function"]["name"], "g");
    EXPECT_EQ(calls[0]["function"]["arguments"], "{}");
    EXPECT_EQ(finish, "tool_calls");
}

TEST_F(Responses, ChatLogprobs) {
    auto j = job(ApiKind::chat, 1, 1, false);
    j.params.logprobs = 1;
    auto w = make_response_writer(j, ctx, "c", 0);
    ChoiceDelta d = delta("hi", {'h' + 2, 'i' + 2}, 3, 2, FinishReason::length);
    d.logprobs = {{'h' + 2, -0.25f, {{'h' + 2, -0.25f}}}, {'i' + 2, -1.5f, {{'j' + 2, -0.5f}}}};
    std::string out;
    w->on_delta(0, d, out);
    w->on_complete(out);
    const json lp = json::parse(out)["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(lp.size(), 2u);
    EXPECT_EQ(lp[0]["token"], "h");
    EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.25f);
    EXPECT_EQ(lp[0]["bytes"], json({104}));
    EXPECT_EQ(lp[1]["top_logprobs"][0]["token"], "j");
    EXPECT_FLOAT_EQ(lp[1]["top_logprobs"][0]["logprob"].get<float>(), -0.5f);
}

TEST_F(Responses, CompletionsEchoNAndLegacyLogprobs) {
    auto j = job(ApiKind::completion, 2, 2, false);
    j.echo_prefixes = {"P0:", "P1:"};
    j.params.logprobs = 0;
    auto w = make_response_writer(j, ctx, "cmpl-1", 0);
    std::string out;
    for (int i = 0; i < 4; ++i) {
        ChoiceDelta d = delta("ab", {'a' + 2, 'b' + 2}, 3 + i / 2, 2, FinishReason::length);
        d.logprobs = {{'a' + 2, -1.0f, {}}, {'b' + 2, -2.0f, {}}};
        w->on_delta(i, d, out);
    }
    w->on_complete(out);
    const json body = json::parse(out);
    EXPECT_EQ(body["object"], "text_completion");
    ASSERT_EQ(body["choices"].size(), 4u);
    EXPECT_EQ(body["choices"][0]["text"], "P0:ab");
    EXPECT_EQ(body["choices"][1]["text"], "P0:ab");
    EXPECT_EQ(body["choices"][2]["text"], "P1:ab");
    EXPECT_EQ(body["choices"][3]["index"], 3);
    const json lp = body["choices"][2]["logprobs"];
    EXPECT_EQ(lp["tokens"], json({"a", "b"}));
    EXPECT_EQ(lp["token_logprobs"], json({-1.0, -2.0}));
    EXPECT_EQ(lp["text_offset"], json({3, 4}));  // after the echoed prompt
    // Prompt tokens: 3 + 4 (two prompts, each once); completion: 4 samples x 2.
    EXPECT_EQ(body["usage"]["prompt_tokens"], 7);
    EXPECT_EQ(body["usage"]["completion_tokens"], 8);
}

TEST_F(Responses, CompletionsStream) {
    auto j = job(ApiKind::completion, 1, 1, true);
    j.echo_prefixes = {"Q:"};
    j.include_usage = true;
    auto w = make_response_writer(j, ctx, "cmpl-2", 0);
    std::string out;
    w->on_delta(0, delta("x", {1}, 3, 1), out);
    w->on_delta(0, delta("y", {2}, 3, 2, FinishReason::stop), out);
    w->on_complete(out);
    const auto events = parse_sse(out);
    ASSERT_EQ(events.size(), 4u) << out;
    EXPECT_EQ(events[0].parsed()["choices"][0]["text"], "Q:x");
    EXPECT_EQ(events[1].parsed()["choices"][0]["text"], "y");
    EXPECT_EQ(events[1].parsed()["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(events[2].parsed()["usage"]["total_tokens"], 5);
    EXPECT_EQ(events[3].data, "[DONE]");
}

TEST_F(Responses, FailureMidStream) {
    auto w = make_response_writer(job(ApiKind::chat, 1, 1, true), ctx, "c", 0);
    std::string out;
    w->on_delta(0, delta("x", {1}, 3, 1), out);
    w->on_failure(ApiError(503, "server_error", "shutting down"), out);
    const auto events = parse_sse(out);
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events[events.size() - 2].parsed()["error"]["message"], "shutting down");
    EXPECT_EQ(events.back().data, "[DONE]");
}

TEST_F(Responses, AnthropicMessageBody) {
    auto j = job(ApiKind::messages, 1, 1, false);
    j.params.stop = {"Human:"};
    auto w = make_response_writer(j, ctx, "msg_1", 0);
    std::string out;
    w->on_delta(0, delta("Hello", {1}, 3, 4, FinishReason::stop, "Human:"), out);
    w->on_complete(out);
    const json m = json::parse(out);
    EXPECT_EQ(m["id"], "msg_1");
    EXPECT_EQ(m["type"], "message");
    EXPECT_EQ(m["role"], "assistant");
    EXPECT_EQ(m["content"], json::array({{{"type", "text"}, {"text", "Hello"}}}));
    EXPECT_EQ(m["stop_reason"], "stop_sequence");
    EXPECT_EQ(m["stop_sequence"], "Human:");
    EXPECT_EQ(m["usage"]["input_tokens"], 3);
    EXPECT_EQ(m["usage"]["output_tokens"], 4);

    auto w2 = make_response_writer(job(ApiKind::messages, 1, 1, false), ctx, "msg_2", 0);
    out.clear();
    w2->on_delta(0, delta("x", {1}, 3, 7, FinishReason::length), out);
    w2->on_complete(out);
    EXPECT_EQ(json::parse(out)["stop_reason"], "max_tokens");
}

TEST_F(Responses, AnthropicStreamWithToolUse) {
    auto j = job(ApiKind::messages, 1, 1, true);
    j.tool_format = ToolCallFormat::hermes;
    auto w = make_response_writer(j, ctx, "msg_3", 0);
    std::string out;
    w->on_delta(0, delta("Checking.", {1}, 3, 1), out);
    w->on_delta(0, delta("<tool_call>{\"name\": \"f\", \"arguments\": {\"k\": 1}}</tool_call>", {2}, 3, 6,
                         FinishReason::stop), out);
    w->on_complete(out);
    const auto events = parse_sse(out);
    std::vector<std::string> names;
    for (const auto& e : events) {
        names.push_back(e.event);
        EXPECT_EQ(e.parsed()["type"], e.event);  // Anthropic repeats the event name as `type`
    }
    const std::vector<std::string> expected = {"message_start", "ping", "content_block_start", "content_block_delta",
                                               "content_block_stop", "content_block_start", "content_block_delta",
                                               "content_block_stop", "message_delta", "message_stop"};
    EXPECT_EQ(names, expected);
    EXPECT_EQ(events[0].parsed()["message"]["usage"]["input_tokens"], 3);
    EXPECT_EQ(events[3].parsed()["delta"], json({{"type", "text_delta"}, {"text", "Checking."}}));
    const json tool_start = events[5].parsed();
    EXPECT_EQ(tool_start["index"], 1);
    EXPECT_EQ(tool_start["content_block"]["type"], "tool_use");
    EXPECT_EQ(tool_start["content_block"]["name"], "f");
    EXPECT_EQ(json::parse(events[6].parsed()["delta"]["partial_json"].get<std::string>()), json({{"k", 1}}));
    const json message_delta = events[8].parsed();
    EXPECT_EQ(message_delta["delta"]["stop_reason"], "tool_use");
    EXPECT_EQ(message_delta["usage"]["output_tokens"], 6);
}

TEST_F(Responses, ChoiceDeltaMergeAppendsAndClearKeepsNothing) {
    ChoiceDelta d;
    RequestOutput a;
    a.new_text = "ab";
    a.new_token_ids = {1, 2};
    a.num_output_tokens = 2;
    RequestOutput b;
    b.new_text = "c";
    b.new_token_ids = {3};
    b.num_output_tokens = 3;
    b.finish_reason = FinishReason::stop;
    b.stop_reason = "x";
    d.merge(a);
    d.merge(b);
    EXPECT_EQ(d.text, "abc");
    EXPECT_EQ(d.token_ids, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(d.num_output_tokens, 3);
    EXPECT_EQ(d.finish, FinishReason::stop);
    EXPECT_EQ(d.stop_reason, "x");
    d.clear();
    EXPECT_FALSE(d.has_news);
    EXPECT_TRUE(d.text.empty() && d.token_ids.empty());
    EXPECT_EQ(d.finish, FinishReason::none);
}

}  // namespace
}  // namespace scr::server
