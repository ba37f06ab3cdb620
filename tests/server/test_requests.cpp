// Request parsing and validation: bodies -> engine requests, and every way a body can be wrong ->
// the HTTP status and OpenAI error fields the API reference specifies.
#include <gtest/gtest.h>

#include <algorithm>

#include "server/protocol.hpp"
#include "tests/server/fake_model.hpp"

namespace scr::server {
namespace {

using nlohmann::json;
using testing::ByteText;

class Requests : public ::testing::Test {
protected:
    Requests() {
        ctx.model_name = "m";
        ctx.max_model_len = 400;
        ctx.max_n = 4;
        ctx.tool_format = ToolCallFormat::hermes;
        ctx.end_of_turn_ids = {ByteText::kEos};
        ctx.defaults.temperature = 0.7f;
        ctx.text = &text;
    }

    // The ApiError a body raises (fails the test when none).
    template <typename Fn>
    ApiError error_of(Fn&& fn) {
        try {
            fn();
        } catch (const ApiError& e) {
            return e;
        }
        ADD_FAILURE() << "no ApiError";
        return ApiError(0, "", "");
    }
    ApiError chat_error(const std::string& body) {
        return error_of([&] { parse_chat_request(parse_json_body(body), ctx); });
    }

    ByteText text;
    ServingContext ctx;
};

TEST_F(Requests, ChatRendersTheTemplateAndMapsSamplingFields) {
    const auto job = parse_chat_request(RequestJson::parse(R"({
        "model": "m", "messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}],
        "temperature": 0.2, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 42, "n": 2, "stop": ["END", "STOP"],
        "max_tokens": 10, "logprobs": true, "top_logprobs": 3, "logit_bias": {"65": -100},
        "stream": true, "stream_options": {"include_usage": true}, "user": "u1"})"), ctx);
    ASSERT_EQ(job.prompts.size(), 1u);
    EXPECT_EQ(text.decode(job.prompts[0], false), "<|system|>be brief\n<|user|>hi\nthere\n<|assistant|>");
    const SamplingParams& p = job.params;
    EXPECT_FLOAT_EQ(p.temperature, 0.2f);
    EXPECT_FLOAT_EQ(p.top_p, 0.9f);
    EXPECT_EQ(p.top_k, 5);
    EXPECT_FLOAT_EQ(p.min_p, 0.05f);
    EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
    EXPECT_FLOAT_EQ(p.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(p.frequency_penalty, -0.5f);
    EXPECT_EQ(p.seed, std::optional<uint64_t>(42));
    EXPECT_EQ(p.n, 2);
    EXPECT_EQ(p.stop, (std::vector<std::string>{"END", "STOP"}));
    EXPECT_EQ(p.max_tokens, 10);
    EXPECT_EQ(p.logprobs, 3);
    ASSERT_EQ(p.logit_bias.size(), 1u);
    EXPECT_EQ(p.logit_bias[0].first, 65);
    EXPECT_FLOAT_EQ(p.logit_bias[0].second, -100.0f);
    EXPECT_EQ(p.stop_token_ids, std::vector<int32_t>{ByteText::kEos});
    EXPECT_TRUE(job.stream);
    EXPECT_TRUE(job.include_usage);
    EXPECT_EQ(job.tool_format, ToolCallFormat::none);  // no tools offered
}

TEST_F(Requests, ChatDefaultsComeFromTheModelAndFillTheContext) {
    const auto job = parse_chat_request(RequestJson::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"), ctx);
    EXPECT_FLOAT_EQ(job.params.temperature, 0.7f);  // generation_config default, not 1.0
    const int prompt_len = int(job.prompts[0].size());
    EXPECT_EQ(job.params.max_tokens, ctx.max_model_len - prompt_len);
    EXPECT_EQ(job.params.logprobs, -1);
    EXPECT_FALSE(job.stream);
}

TEST_F(Requests, MaxCompletionTokensWinsOverMaxTokens) {
    const auto job = parse_chat_request(
        RequestJson::parse(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "max_completion_tokens": 7})"),
        ctx);
    EXPECT_EQ(job.params.max_tokens, 7);
}

TEST_F(Requests, ToolsAreRenderedAndParsedWithTheModelsFormat) {
    const auto job = parse_chat_request(RequestJson::parse(R"({
        "messages": [{"role": "user", "content": "weather?"},
                     {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]})"),
                                        ctx);
    EXPECT_EQ(job.tool_format, ToolCallFormat::hermes);
    const std::string prompt = text.decode(job.prompts[0], false);
    EXPECT_NE(prompt.find("<|tools|>[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\""),
              std::string::npos) << prompt;  // the client's key order
    // The assistant's arguments reach the template as an object, not as a JSON string.
    EXPECT_NE(prompt.find("<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}</tool_call>"),
              std::string::npos) << prompt;
    EXPECT_NE(prompt.find("<|tool|>sunny"), std::string::npos);

    const auto none = parse_chat_request(RequestJson::parse(R"({"messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"})"), ctx);
    EXPECT_EQ(none.tool_format, ToolCallFormat::none);
    EXPECT_EQ(text.decode(none.prompts[0], false).find("<|tools|>"), std::string::npos);
}

TEST_F(Requests, ChatTemplateKwargsAndContinueFinalMessage) {
    auto job = parse_chat_request(RequestJson::parse(R"({"messages": [{"role": "user", "content": "q"}],
        "chat_template_kwargs": {"enable_thinking": false}})"), ctx);
    EXPECT_EQ(text.decode(job.prompts[0], false).rfind("<|no_think|>", 0), 0u);
    job = parse_chat_request(RequestJson::parse(R"({"messages": [{"role": "user", "content": "q"},
        {"role": "assistant", "content": "The answer is"}], "continue_final_message": true,
        "add_generation_prompt": false})"), ctx);
    EXPECT_EQ(text.decode(job.prompts[0], false), "<|user|>q\n<|assistant|>The answer is");
}

TEST_F(Requests, MalformedBodies) {
    for (const char* body : {"", "{", "[1, 2]", "\"text\"", "{\"messages\": [}", "nul", "{\"a\":1}}"}) {
        SCOPED_TRACE(body);
        const ApiError e = chat_error(body);
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.type, "invalid_request_error");
        EXPECT_EQ(e.code, "invalid_json");
    }
    const ApiError deep = chat_error(std::string(100000, '[') + std::string(100000, ']'));
    EXPECT_EQ(deep.status, 400);
    EXPECT_NE(std::string(deep.what()).find("nests deeper"), std::string::npos);
    const ApiError utf8 = chat_error("{\"messages\": \"\xff\xfe\"}");
    EXPECT_EQ(utf8.code, "invalid_json");
}

TEST_F(Requests, WrongTypesAndRangesNameTheField) {
    struct Case {
        const char* body;
        const char* param;
        const char* code;
    };
    const Case cases[] = {
        {R"({"messages": "hi"})", "messages", "invalid_type"},
        {R"({"messages": []})", "messages", "invalid_value"},
        {R"({})", "messages", "missing_required_parameter"},
        {R"({"messages": [{"content": "x"}]})", "messages[0].role", "missing_required_parameter"},
        {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role", "invalid_value"},
        {R"({"messages": [{"role": "user"}]})", "messages[0].content", "missing_required_parameter"},
        {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", "invalid_type"},
        {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
         "messages[0].content[0]", "unsupported_parameter"},
        {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", "temperature", "invalid_type"},
        {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 2.5})", "temperature", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", "top_p", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", "n", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "n": 5})", "n", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "n": 1.5})", "n", "invalid_type"},
        {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e300})", "max_tokens", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream", "invalid_type"},
        {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})",
         "stream_options", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})", "stop", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "stop": 7})", "stop", "invalid_type"},
        {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}})", "logit_bias", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"999999": 1}})", "logit_bias", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 101}})", "logit_bias", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", "top_logprobs",
         "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "stop_token_ids": [-1]})", "stop_token_ids", "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "min_tokens": 5})", "min_tokens",
         "invalid_value"},
        {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]})", "tools[0]",
         "invalid_type"},
        {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": 3})", "tool_choice", "invalid_value"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.body);
        const ApiError e = chat_error(c.body);
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.param, c.param);
        EXPECT_EQ(e.code, c.code);
        EXPECT_EQ(e.type, "invalid_request_error");
    }
}

TEST_F(Requests, UnsupportedAndUnknownParameters) {
    const char* base = R"({"messages": [{"role": "user", "content": "x"}], )";
    for (const char* extra : {R"("response_format": {"type": "json_object"})", R"("tool_choice": "required")",
                              R"("functions": [{"name": "f"}])", R"("best_of": 3)", R"("audio": {"voice": "x"})"}) {
        SCOPED_TRACE(extra);
        EXPECT_EQ(chat_error(std::string(base) + extra + "}").code, "unsupported_parameter");
    }
    const ApiError unknown = chat_error(std::string(base) + R"("temprature": 0.5})");
    EXPECT_EQ(unknown.status, 400);
    EXPECT_EQ(unknown.param, "temprature");
    EXPECT_EQ(unknown.code, "unknown_parameter");
    // Response-only fields clients echo back inside messages are accepted.
    EXPECT_NO_THROW(parse_chat_request(RequestJson::parse(R"({"messages": [{"role": "user", "content": "x"},
        {"role": "assistant", "content": "y", "refusal": null, "annotations": []}, {"role": "user", "content": "z"}]})"),
                                       ctx));
    EXPECT_NO_THROW(parse_chat_request(RequestJson::parse(std::string(base) + R"("response_format": {"type": "text"}})"), ctx));
}

TEST_F(Requests, UnknownModelIs404) {
    const ApiError e = chat_error(R"({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})");
    EXPECT_EQ(e.status, 404);
    EXPECT_EQ(e.param, "model");
    EXPECT_EQ(e.code, "model_not_found");
}

TEST_F(Requests, ContextLimits) {
    const std::string long_text(500, 'a');  // 500 byte tokens > max_model_len 400
    const ApiError over = chat_error(R"({"messages": [{"role": "user", "content": ")" + long_text + "\"}]}");
    EXPECT_EQ(over.status, 400);
    EXPECT_EQ(over.code, "context_length_exceeded");
    EXPECT_NE(std::string(over.what()).find("maximum context length is 400 tokens"), std::string::npos);

    const ApiError max_tokens = chat_error(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 399})");
    EXPECT_EQ(max_tokens.status, 400);
    EXPECT_EQ(max_tokens.param, "max_tokens");
    EXPECT_EQ(max_tokens.code, "context_length_exceeded");
}

// vLLM's truncate_prompt_tokens keeps a prompt's last k tokens; max_tokens' default follows the
// truncated length; 0, k past the context and (with no room left) -1 are refused.
TEST_F(Requests, TruncatePromptTokensKeepsTheLastTokens) {
    auto job = parse_completion_request(RequestJson::parse(R"({"prompt": [5, 6, 7, 8, 9], "truncate_prompt_tokens": 3})"), ctx);
    ASSERT_EQ(job.prompts.size(), 1u);
    EXPECT_EQ(job.prompts[0], (std::vector<int32_t>{7, 8, 9}));
    job = parse_completion_request(RequestJson::parse(R"({"prompt": [5, 6], "truncate_prompt_tokens": 3})"), ctx);
    EXPECT_EQ(job.prompts[0], (std::vector<int32_t>{5, 6}));  // shorter prompts are kept whole

    const std::string long_text(500, 'a');  // 500 byte tokens + the template's > max_model_len 400
    job = parse_chat_request(RequestJson::parse(R"({"messages": [{"role": "user", "content": ")" + long_text +
                                                R"("}], "truncate_prompt_tokens": 300})"),
                             ctx);
    ASSERT_EQ(job.prompts[0].size(), 300u);
    EXPECT_EQ(job.params.max_tokens, 100);  // the rest of the context after the truncated prompt
    const std::vector<int32_t> full = text.encode("<|user|>" + long_text + "\n<|assistant|>", true);
    EXPECT_TRUE(std::equal(job.prompts[0].begin(), job.prompts[0].end(), full.end() - 300));

    for (const char* bad : {"0", "401", "-2", "1.5", "\"3\""}) {
        const ApiError e = chat_error(std::string(R"({"messages": [{"role": "user", "content": "x"}], "truncate_prompt_tokens": )") +
                                      bad + "}");
        EXPECT_EQ(e.status, 400) << bad;
        EXPECT_EQ(e.param, "truncate_prompt_tokens") << bad;
    }
    // -1 truncates to the whole context: a longer prompt then leaves no room to generate.
    const ApiError full_context = chat_error(R"({"messages": [{"role": "user", "content": ")" + long_text +
                                             R"("}], "truncate_prompt_tokens": -1})");
    EXPECT_EQ(full_context.code, "context_length_exceeded");
}

TEST_F(Requests, TemplateErrorsAre400) {
    const ApiError e = chat_error(R"({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]})");
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "chat_template_error");
    EXPECT_NE(std::string(e.what()).find("System message must come first"), std::string::npos);
}

TEST_F(Requests, CompletionPromptShapes) {
    auto job = parse_completion_request(RequestJson::parse(R"({"prompt": "ab", "echo": true})"), ctx);
    ASSERT_EQ(job.prompts.size(), 1u);
    EXPECT_EQ(job.prompts[0], (std::vector<int32_t>{ByteText::kBos, 'a' + 2, 'b' + 2}));  // add_special_tokens
    EXPECT_EQ(job.params.max_tokens, 16);  // OpenAI's completions default
    EXPECT_EQ(job.echo_prefixes[0], "ab");

    job = parse_completion_request(RequestJson::parse(R"({"prompt": ["x", [7, 8, 9]], "n": 2, "add_special_tokens": false})"), ctx);
    ASSERT_EQ(job.prompts.size(), 2u);
    EXPECT_EQ(job.prompts[0], std::vector<int32_t>{'x' + 2});
    EXPECT_EQ(job.prompts[1], (std::vector<int32_t>{7, 8, 9}));
    EXPECT_EQ(job.num_choices(), 4);

    job = parse_completion_request(RequestJson::parse(R"({"prompt": [5, 6], "max_tokens": 3, "logprobs": 2})"), ctx);
    EXPECT_EQ(job.prompts[0], (std::vector<int32_t>{5, 6}));
    EXPECT_EQ(job.params.logprobs, 2);

    auto err = [&](const char* body) {
        return error_of([&] { parse_completion_request(RequestJson::parse(body), ctx); });
    };
    EXPECT_EQ(err(R"({})").param, "prompt");
    EXPECT_EQ(err(R"({"prompt": []})").param, "prompt");
    EXPECT_EQ(err(R"({"prompt": [1, "a"]})").param, "prompt");
    EXPECT_EQ(err(R"({"prompt": [100000]})").param, "prompt");
    EXPECT_EQ(err(R"({"prompt": {"a": 1}})").code, "invalid_type");
    EXPECT_EQ(err(R"({"prompt": "x", "suffix": "y"})").code, "unsupported_parameter");
    EXPECT_EQ(err(R"({"prompt": "x", "echo": true, "logprobs": 1})").code, "unsupported_parameter");
    EXPECT_EQ(err(R"({"prompt": ["a", "b", "c"], "n": 2})").param, "n");  // 6 choices > max_n 4
    EXPECT_EQ(err(R"({"prompt": "", "add_special_tokens": false})").param, "prompt");  // empty prompt
}

TEST_F(Requests, AnthropicMessages) {
    const auto job = parse_messages_request(RequestJson::parse(R"({
        "model": "m", "max_tokens": 20, "system": [{"type": "text", "text": "sys"}],
        "messages": [{"role": "user", "content": "weather?"},
                     {"role": "assistant", "content": [{"type": "text", "text": "checking"},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "cold"}]}],
        "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
        "stop_sequences": ["Human:"], "temperature": 0.5, "top_k": 4, "stream": true})"), ctx);
    EXPECT_EQ(job.api, ApiKind::messages);
    EXPECT_EQ(job.params.max_tokens, 20);
    EXPECT_EQ(job.params.stop, std::vector<std::string>{"Human:"});
    EXPECT_EQ(job.params.top_k, 4);
    EXPECT_TRUE(job.stream);
    EXPECT_EQ(job.tool_format, ToolCallFormat::hermes);
    const std::string prompt = text.decode(job.prompts[0], false);
    EXPECT_EQ(prompt.rfind("<|tools|>[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\","
                           "\"parameters\":{\"type\":\"object\"}}}]\n<|system|>sys\n", 0), 0u)
        << prompt;
    EXPECT_NE(prompt.find("<|assistant|>checking<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}"),
              std::string::npos) << prompt;
    EXPECT_NE(prompt.find("<|tool|>cold\n"), std::string::npos);

    auto err = [&](const char* body) {
        return error_of([&] { parse_messages_request(RequestJson::parse(body), ctx); });
    };
    EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}]})").param, "max_tokens");
    EXPECT_EQ(err(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})").param, "messages[0].role");
    EXPECT_EQ(err(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5})").param,
              "temperature");
    EXPECT_EQ(err(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]})").code,
              "unsupported_parameter");
    EXPECT_EQ(err(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}})")
                  .code, "unsupported_parameter");
}

TEST_F(Requests, TokenizeAndDetokenize) {
    auto t = tokenize_response(RequestJson::parse(R"({"prompt": "hi", "add_special_tokens": false, "return_token_strs": true})"), ctx);
    EXPECT_EQ(t["tokens"], json({'h' + 2, 'i' + 2}));
    EXPECT_EQ(t["count"], 2);
    EXPECT_EQ(t["max_model_len"], 400);
    EXPECT_EQ(t["token_strs"], json({"h", "i"}));
    auto chat = tokenize_response(RequestJson::parse(R"({"messages": [{"role": "user", "content": "x"}]})"), ctx);
    EXPECT_EQ(chat["count"], std::string("<|user|>x\n<|assistant|>").size());
    EXPECT_EQ(detokenize_response(RequestJson::parse(R"({"tokens": [106, 107]})"), ctx)["prompt"], "hi");
    EXPECT_EQ(error_of([&] { detokenize_response(RequestJson::parse(R"({"tokens": [1, "a"]})"), ctx); }).param, "tokens");
    EXPECT_EQ(error_of([&] { tokenize_response(RequestJson::parse(R"({})"), ctx); }).param, "prompt");
}

TEST_F(Requests, ApiKey) {
    EXPECT_NO_THROW(check_api_key("", "", ""));
    EXPECT_NO_THROW(check_api_key("sk-1", "Bearer sk-1", ""));
    EXPECT_NO_THROW(check_api_key("sk-1", "", "sk-1"));  // Anthropic's header
    const ApiError missing = error_of([] { check_api_key("sk-1", "", ""); });
    EXPECT_EQ(missing.status, 401);
    EXPECT_EQ(missing.code, "invalid_api_key");
    EXPECT_EQ(error_of([] { check_api_key("sk-1", "Bearer sk-2", ""); }).status, 401);
    EXPECT_EQ(error_of([] { check_api_key("sk-1", "Bearer sk-1x", ""); }).status, 401);
    EXPECT_EQ(error_of([] { check_api_key("sk-1", "Basic sk-1", ""); }).status, 401);
}

TEST_F(Requests, ErrorBodies) {
    const ApiError e = ApiError::invalid("n", "bad n");
    EXPECT_EQ(openai_error_body(e),
              json({{"error", {{"message", "bad n"}, {"type", "invalid_request_error"}, {"param", "n"},
                               {"code", "invalid_value"}}}}));
    EXPECT_EQ(openai_error_body(ApiError(500, "server_error", "x"))["error"]["param"], nullptr);
    EXPECT_EQ(anthropic_error_body(ApiError(401, "invalid_request_error", "k")),
              json({{"type", "error"}, {"error", {{"type", "authentication_error"}, {"message", "k"}}}}));
    EXPECT_EQ(anthropic_error_body(ApiError(404, "x", "m"))["error"]["type"], "not_found_error");
}

}  // namespace
}  // namespace scr::server
