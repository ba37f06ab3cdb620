// Tool-call parsing: the expected calls are written from the formats the chat templates ask for
// (Llama 3.1 JSON tool calling; Hermes/Qwen <tool_call> tags), not from our own output.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/core/error.hpp"
#include "server/json_scan.hpp"
#include "server/tool_calls.hpp"

namespace scr::server {
namespace {

using nlohmann::json;

// Feeds `text` in pieces of `step` bytes, as a stream would arrive.
ToolCallParse parse_in_steps(ToolCallFormat f, std::string_view text, size_t step) {
    ToolCallParse r;
    ToolCallParser p(f);
    for (size_t i = 0; i < text.size(); i += step) p.feed(text.substr(i, step), r.content, r.calls);
    p.finish(r.content, r.calls);
    return r;
}

TEST(ToolCalls, HermesSingleCallWithLeadingText) {
    const std::string text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                             "{\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
    for (size_t step : {size_t(1), size_t(3), size_t(7), text.size()}) {
        SCOPED_TRACE(step);
        auto r = parse_in_steps(ToolCallFormat::hermes, text, step);
        EXPECT_EQ(r.content, "Let me check.");
        ASSERT_EQ(r.calls.size(), 1u);
        EXPECT_EQ(r.calls[0].name, "get_weather");
        EXPECT_EQ(json::parse(r.calls[0].arguments), json({{"city", "Paris"}, {"unit", "c"}}));
    }
}

TEST(ToolCalls, HermesSeveralCallsAndNoContent) {
    const std::string text = "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call>\n"
                             "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>\n";
    for (size_t step : {size_t(1), size_t(5), text.size()}) {
        auto r = parse_in_steps(ToolCallFormat::hermes, text, step);
        EXPECT_EQ(r.content, "");
        ASSERT_EQ(r.calls.size(), 2u);
        EXPECT_EQ(r.calls[0].name, "a");
        EXPECT_EQ(json::parse(r.calls[0].arguments), json({{"x", 1}}));
        EXPECT_EQ(r.calls[1].name, "b");
        EXPECT_EQ(json::parse(r.calls[1].arguments), json::object());
    }
}

TEST(ToolCalls, HermesPlainTextPassesThroughUnchanged) {
    const std::string text = "No tools needed: 2 < 3 and <tool is not a tag.\n\n";
    for (size_t step : {size_t(1), size_t(4), text.size()}) {
        auto r = parse_in_steps(ToolCallFormat::hermes, text, step);
        EXPECT_EQ(r.content, text);
        EXPECT_TRUE(r.calls.empty());
    }
}

TEST(ToolCalls, HermesHoldsBackAPartialTagUntilItResolves) {
    ToolCallParser p(ToolCallFormat::hermes);
    std::string content;
    std::vector<ParsedToolCall> calls;
    p.feed("Hi <tool_", content, calls);
    EXPECT_EQ(content, "Hi");  // "<tool_" may open a call; the space waits for what follows
    p.feed("box>", content, calls);
    EXPECT_EQ(content, "Hi <tool_box>");
}

TEST(ToolCalls, HermesBrokenCallIsGivenBackAsContent) {
    const std::string text = "<tool_call>{\"name\": oops}</tool_call>";
    auto r = parse_in_steps(ToolCallFormat::hermes, text, 2);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCalls, HermesUnterminatedCallAtEndIsKeptWhenItsJsonIsComplete) {
    auto r = parse_tool_calls(ToolCallFormat::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"}\"}}");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(json::parse(r.calls[0].arguments), json({{"q", "}"}}));
    auto cut = parse_tool_calls(ToolCallFormat::hermes, "<tool_call>{\"name\": \"f\", \"argu");
    EXPECT_TRUE(cut.calls.empty());
    EXPECT_EQ(cut.content, "<tool_call>{\"name\": \"f\", \"argu");
}

TEST(ToolCalls, Llama3JsonReply) {
    const std::string text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco\"}}";
    for (size_t step : {size_t(1), size_t(6), text.size()}) {
        auto r = parse_in_steps(ToolCallFormat::llama3_json, text, step);
        EXPECT_EQ(r.content, "");
        ASSERT_EQ(r.calls.size(), 1u);
        EXPECT_EQ(r.calls[0].name, "get_weather");
        EXPECT_EQ(json::parse(r.calls[0].arguments), json({{"city", "San Francisco"}}));
    }
}

TEST(ToolCalls, Llama3PythonTagAndSemicolonSeparatedCalls) {
    auto r = parse_tool_calls(ToolCallFormat::llama3_json,
                              "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": 1}}; "
                              "{\"name\": \"b\", \"arguments\": {\"s\": \"x;y\"}}");
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_EQ(r.calls[0].name, "a");
    EXPECT_EQ(r.calls[1].name, "b");
    EXPECT_EQ(json::parse(r.calls[1].arguments), json({{"s", "x;y"}}));
}

TEST(ToolCalls, Llama3ProseStreamsAsContentImmediately) {
    ToolCallParser p(ToolCallFormat::llama3_json);
    std::string content;
    std::vector<ParsedToolCall> calls;
    p.feed("  The", content, calls);
    EXPECT_EQ(content, "  The");
    p.feed(" answer {is} 4", content, calls);
    p.finish(content, calls);
    EXPECT_EQ(content, "  The answer {is} 4");
    EXPECT_TRUE(calls.empty());
}

TEST(ToolCalls, Llama3JsonThatIsNotACallBecomesContent) {
    const std::string text = "{\"answer\": 42}";
    auto r = parse_tool_calls(ToolCallFormat::llama3_json, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCalls, NoneFormatIsIdentity) {
    auto r = parse_tool_calls(ToolCallFormat::none, "<tool_call>{\"name\": \"f\"}</tool_call>");
    EXPECT_EQ(r.content, "<tool_call>{\"name\": \"f\"}</tool_call>");
    EXPECT_TRUE(r.calls.empty());
}

TEST(ToolCalls, DeeplyNestedArgumentsAreRefusedNotRecursedInto) {
    std::string nested = "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(10000, '[') +
                         std::string(10000, ']') + "}</tool_call>";
    auto r = parse_tool_calls(ToolCallFormat::hermes, nested);
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, nested);
}

TEST(ToolCalls, FormatNames) {
    EXPECT_EQ(parse_tool_call_format("hermes"), ToolCallFormat::hermes);
    EXPECT_EQ(parse_tool_call_format("llama3_json"), ToolCallFormat::llama3_json);
    EXPECT_THROW(parse_tool_call_format("mistral"), scr::Error);
}

TEST(JsonScan, ExtentAndDepth) {
    EXPECT_EQ(json_value_extent("{\"a\": \"}\\\"\"} tail"), 12u);
    EXPECT_EQ(json_value_extent("{\"a\": [1, 2"), 0u);
    EXPECT_EQ(json_value_extent("x{}"), 0u);
    EXPECT_EQ(json_nesting_depth("[{\"[[[\": [1]}]"), 3);
    EXPECT_EQ(json_nesting_depth("\"no brackets\""), 0);
}

}  // namespace
}  // namespace scr::server
