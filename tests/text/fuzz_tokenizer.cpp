// Fuzz entry point for the text layer: hostile tokenizer.json files, arbitrary bytes to encode,
// arbitrary ids to decode (whole and streaming), arbitrary Jinja templates and chat contexts.
// Anything may be rejected with scr::Error; any other exception, crash, sanitizer report or hang
// is a bug. Built as a libFuzzer target with -DSCR_FUZZ=ON (clang); test_fuzz_inputs.cpp feeds
// mutated inputs through the same function in every test run.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/core/error.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/jinja.hpp"
#include "runtime/text/tokenizer.hpp"
#include "runtime/text/tokenizer_impl.hpp"

namespace scr::text::fuzz {

// A small byte-level BPE tokenizer.json (Llama 3 style) with every kind of added token.
std::string byte_level_tokenizer_json() {
    using nlohmann::ordered_json;
    const ByteLevelMap& map = byte_level_map();
    ordered_json vocab = ordered_json::object();
    for (int b = 0; b < 256; ++b) vocab[std::string(map.enc[b], map.enc_len[b])] = b;
    const char* merges[][2] = {{"h", "e"}, {"he", "l"}, {"hel", "l"}, {"hell", "o"}, {"Ġ", "w"}, {"Ġw", "o"},
                               {"Ġwo", "r"}, {"Ġwor", "l"}, {"Ġworl", "d"}, {"Ġ", "Ġ"}, {"1", "2"}, {"Ċ", "Ċ"}};
    ordered_json merge_list = ordered_json::array();
    int next = 256;
    for (auto& m : merges) {
        vocab[std::string(m[0]) + m[1]] = next++;
        merge_list.push_back(std::string(m[0]) + " " + m[1]);
    }
    ordered_json j = {
        {"version", "1.0"},
        {"added_tokens",
         {{{"id", next}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
          {{"id", next + 1}, {"content", "<tool>"}, {"special", false}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}},
          {{"id", next + 2}, {"content", "word"}, {"special", false}, {"single_word", true}, {"normalized", true}},
          {{"id", next + 3}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
        {"normalizer", {{"type", "NFC"}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"post_processor",
         {{"type", "TemplateProcessing"},
          {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {next + 3}}, {"tokens", {"<s>"}}}}}}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab}, {"merges", merge_list}}}};
    return j.dump();
}

// A small SentencePiece-style tokenizer.json (Llama 2 style: byte fallback, ▁, Strip decoder).
std::string sentencepiece_tokenizer_json() {
    using nlohmann::ordered_json;
    ordered_json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
    int next = 3;
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        vocab[name] = next++;
    }
    for (const char* t : {"\u2581", "t", "h", "e", "a", "b", "c", "\u2581t", "\u2581th", "\u2581the", "he"}) vocab[t] = next++;
    ordered_json j = {
        {"added_tokens",
         {{{"id", 0}, {"content", "<unk>"}, {"special", true}}, {{"id", 1}, {"content", "<s>"}, {"special", true}},
          {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers", {{{"type", "Prepend"}, {"prepend", "\u2581"}},
                           {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
        {"pre_tokenizer", nullptr},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                        {{"type", "ByteFallback"}},
                        {{"type", "Fuse"}},
                        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
        {"model",
         {{"type", "BPE"},
          {"unk_token", "<unk>"},
          {"fuse_unk", true},
          {"byte_fallback", true},
          {"vocab", vocab},
          {"merges", {"\u2581 t", "\u2581t h", "\u2581th e", "h e"}}}}};
    return j.dump();
}

namespace {

void exercise_tokenizer(const Tokenizer& tok, std::string_view text, std::string_view id_bytes) {
    const auto ids = tok.encode(text);
    const auto ids_special = tok.encode(text, true);
    (void)ids_special;
    const std::string decoded = tok.decode(ids);
    // Arbitrary ids (in and out of range), whole and streamed.
    std::vector<int32_t> random_ids;
    for (size_t k = 0; k + 1 < id_bytes.size(); k += 2)
        random_ids.push_back(static_cast<int32_t>((static_cast<uint8_t>(id_bytes[k]) << 8 | static_cast<uint8_t>(id_bytes[k + 1])) %
                                                  (tok.vocab_size() + 8)) - 2);
    for (bool skip : {false, true}) {
        const std::string whole = tok.decode(random_ids, skip);
        IncrementalDecoder dec(tok, skip, std::span<const int32_t>(ids).first(ids.size() / 2));
        std::string streamed;
        for (int32_t id : random_ids) streamed += dec.push(id);
        streamed += dec.flush();
        (void)whole;
    }
}

const Tokenizer& builtin(int which) {
    static const auto bl = Tokenizer::from_json_text(byte_level_tokenizer_json());
    static const auto sp = Tokenizer::from_json_text(sentencepiece_tokenizer_json());
    return which == 0 ? *bl : *sp;
}

}  // namespace

// Returns 0; aborts on anything but scr::Error.
int fuzz_one(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const int mode = data[0] % 5;
    const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    try {
        switch (mode) {
            case 0: {  // a whole tokenizer.json
                const auto tok = Tokenizer::from_json_text(rest);
                exercise_tokenizer(*tok, "Hello world 123 <|end|> <s> \xF0\x9F\x98\x80", rest.substr(0, 64));
                break;
            }
            case 1:  // arbitrary text and ids through the byte-level tokenizer
            case 2: {  // ... and the SentencePiece-style one
                const size_t half = rest.size() / 2;
                exercise_tokenizer(builtin(mode - 1), rest.substr(0, half), rest.substr(half));
                break;
            }
            case 3: {  // a Jinja template rendered with a typical chat context
                const nlohmann::ordered_json ctx = {
                    {"messages", {{{"role", "system"}, {"content", "sys"}}, {{"role", "user"}, {"content", "hi"}},
                                  {{"role", "assistant"}, {"content", "<think>x</think>ok"}, {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", {{"a", 1}}}}}}}}}}},
                    {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
                    {"add_generation_prompt", true}};
                const auto chat = ChatTemplate::from_source(std::string(rest), {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
                (void)chat->render(ctx);
                break;
            }
            case 4: {  // an arbitrary context through a template that touches everything
                const auto ctx = nlohmann::ordered_json::parse(rest, nullptr, false);
                if (ctx.is_discarded()) break;
                static const auto chat = ChatTemplate::from_source(
                    "{% for m in messages %}{{ m.role | upper }}{{ m['content'] | trim }}{{ m | tojson }}"
                    "{% if m.content is string and m.content.startswith('<') %}{{ m.content.split('>')[-1][::-1] }}{% endif %}"
                    "{% for k, v in m.items() %}{{ k }}={{ v }}{% endfor %}{% endfor %}{{ tools | tojson(indent=2) }}"
                    "{% if add_generation_prompt %}GEN{% endif %}",
                    {{"bos_token", "<s>"}});
                (void)chat->render(ctx);
                break;
            }
        }
    } catch (const scr::Error&) {
        // Rejected with a message: fine.
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz: unexpected exception (mode %d): %s\n", mode, e.what());
        std::abort();
    }
    return 0;
}

}  // namespace scr::text::fuzz

#ifdef SCR_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return scr::text::fuzz::fuzz_one(data, size); }
#endif
