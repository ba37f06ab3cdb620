#!/usr/bin/env python3
"""Writes conversations.json: chat-template cases rendered by @huggingface/jinja and by us."""
import json, os

weather_tool = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}
search_tool = {"type": "function", "function": {
    "name": "web_search", "description": "Search the web — returns snippets (UTF-8: 東京, émigré)",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer", "default": 3}},
                   "required": ["query"]}}}

system = {"role": "system", "content": "You are a helpful assistant. Answer concisely.\n"}
u1 = {"role": "user", "content": "Hello! What's the capital of France?"}
a1 = {"role": "assistant", "content": "  The capital of France is Paris.  "}
u2 = {"role": "user", "content": "And of Japan? 日本の首都は？ 🗾"}
a2 = {"role": "assistant", "content": "Tokyo (東京)."}
u3 = {"role": "user", "content": "Thanks — is it raining there?"}

def tool_call(name, args, id_=None):
    tc = {"type": "function", "function": {"name": name, "arguments": args}}
    if id_: tc["id"] = id_
    return tc

plain = [
    {"messages": [u1]},
    {"messages": [system, u1]},
    {"messages": [system, u1, a1, u2]},
    {"messages": [u1, a1, u2, a2, u3]},
    {"messages": [system, u1, a1], "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "  whitespace\n\n around \t "}]},
]

cases = []
def case(name, template, convs):
    cases.append({"name": name, "template": template, "conversations": convs})

date = {"date_string": "26 Jul 2024"}
llama_tools = [
    {"messages": [system, u3], "tools": [weather_tool, search_tool], **date},
    {"messages": [u3], "tools": [weather_tool], "tools_in_user_message": False, **date},
    {"messages": [system, u3, {"role": "assistant", "tool_calls": [tool_call("get_current_weather", {"location": "Tokyo", "unit": "celsius"})]},
                  {"role": "tool", "content": "{\"temperature\": 18, \"rain\": true}"}], "tools": [weather_tool], **date},
    {"messages": [u3, {"role": "assistant", "tool_calls": [tool_call("get_current_weather", {"location": "Tokyo"})]},
                  {"role": "ipython", "content": {"temperature": 18}}], "tools": [weather_tool], **date},
    {"messages": [u3, {"role": "assistant", "tool_calls": [tool_call("a", {}), tool_call("b", {})]}], "tools": [weather_tool], **date},
]
case("llama3_2", "llama3_2", [dict(c, **date) for c in plain] + llama_tools)
case("llama3", "llama3", plain)
case("llama3_1", "llama3_1", plain)

qwen_tools = [
    {"messages": [system, u3], "tools": [weather_tool, search_tool]},
    {"messages": [u3], "tools": [weather_tool]},
    {"messages": [system, u3, {"role": "assistant", "content": "", "tool_calls": [
        tool_call("get_current_weather", {"location": "Tokyo", "unit": "celsius"}),
        tool_call("web_search", {"query": "Tokyo rain"})]},
        {"role": "tool", "content": "{\"temperature\": 18}"}, {"role": "tool", "content": "light rain"},
        {"role": "assistant", "content": "It is 18°C with light rain."}, {"role": "user", "content": "Thanks"}], "tools": [weather_tool, search_tool]},
    {"messages": [u3, {"role": "assistant", "content": "Let me check.", "tool_calls": [tool_call("get_current_weather", "{\"location\": \"Tokyo\"}")]},
                  {"role": "tool", "content": "<tool_response>sunny</tool_response>"}], "tools": [weather_tool]},
]
qwen_thinking = [
    {"messages": [u1], "enable_thinking": False},
    {"messages": [u1], "enable_thinking": True},
    {"messages": [system, u1, {"role": "assistant", "content": "<think>\nThe user asks about France.\n</think>\n\nParis."}, u2]},
    {"messages": [u1, {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy question."}, u2, {"role": "assistant", "content": "Tokyo.", "reasoning_content": "Also easy."}],
     "add_generation_prompt": False},
    {"messages": [u1, {"role": "assistant", "content": "<think>\nstep 1\nstep 2\n</think>\n\nParis."}], "add_generation_prompt": False, "enable_thinking": False},
]
case("qwen3", "qwen3", plain + qwen_tools + qwen_thinking)
case("qwen2_5", "qwen2_5", plain + qwen_tools[:3])

gemma = plain + [
    {"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                  {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is in the image?  "}]}]},
    {"messages": [u1, u2]},  # roles do not alternate: raise_exception
]
case("gemma3", "gemma3", gemma)

mistral = plain[:4] + [
    {"messages": [system, u3], "tools": [weather_tool]},
    {"messages": [u3, {"role": "assistant", "tool_calls": [dict(tool_call("get_current_weather", {"location": "Tokyo"}), id="abc123XYZ")]},
                  {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"temperature\": 18}"},
                  {"role": "assistant", "content": "18°C."}, u1], "tools": [weather_tool]},
    {"messages": [u3, {"role": "assistant", "tool_calls": [dict(tool_call("f", {}), id="short")]}]},  # id length: raise_exception
]
case("mistral_nemo", "mistral_nemo", mistral)
case("llama2_chat", "llama2.jinja", plain[:4] + [{"messages": [u1, u2]}])
case("mistral_instruct", "mistral_instruct.jinja", [c for c in plain if c["messages"][0]["role"] != "system"] + [{"messages": [system, u1]}])
case("features", "features.jinja", plain + [{"messages": [system, u1, a1, u3], "tools": [weather_tool, search_tool]}])

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "conversations.json"), "w", encoding="utf-8") as f:
    json.dump({"cases": cases}, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(len(cases), "cases", sum(len(c["conversations"]) for c in cases), "conversations")
