// scr tokenize / detokenize / render: the text layer from the command line.
//   scr tokenize PATH "text" [--json] [--add-special]   -> {"ids": [...]} (no BOS/EOS unless --add-special)
//   scr detokenize PATH 1,2,3 [--skip-special]          -> the text, nothing appended
//   scr render PATH conv.json                            -> the rendered prompt, nothing appended
// PATH is a model directory or any directory holding tokenizer.json (+ tokenizer_config.json).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/tokenizer.hpp"

namespace {

struct TokenizeArgs {
    std::string path, text;
    bool json = false, add_special = false;
};
struct DetokenizeArgs {
    std::string path, ids;
    bool skip_special = false;
};
struct RenderArgs {
    std::string path, conversation;
};

void write_stdout(std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
}

std::vector<int32_t> parse_ids(const std::string& list) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    while (pos <= list.size()) {
        size_t end = list.find_first_of(", ", pos);
        if (end == std::string::npos) end = list.size();
        const std::string item = list.substr(pos, end - pos);
        pos = end + 1;
        if (item.empty()) continue;
        try {
            size_t used = 0;
            const long long v = std::stoll(item, &used);
            if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
            ids.push_back(static_cast<int32_t>(v));
        } catch (const std::exception&) {
            scr::fail("detokenize: '{}' is not a token id (expected comma-separated non-negative integers)", item);
        }
    }
    return ids;
}

void setup(CLI::App& root) {
    auto tok_args = std::make_shared<TokenizeArgs>();
    auto* tok = root.add_subcommand("tokenize", "Encode text with a model's tokenizer.json");
    tok->add_option("path", tok_args->path, "Model directory (holding tokenizer.json)")->required();
    tok->add_option("text", tok_args->text, "Text to encode")->required();
    tok->add_flag("--json", tok_args->json, "Print {\"ids\": [...]}");
    tok->add_flag("--add-special", tok_args->add_special, "Add what the post-processor adds (BOS/EOS)");
    tok->callback([tok_args] {
        const auto t = scr::text::Tokenizer::load(tok_args->path);
        const auto ids = t->encode(tok_args->text, tok_args->add_special);
        if (tok_args->json) {
            write_stdout(nlohmann::json{{"ids", ids}}.dump() + "\n");
        } else {
            write_stdout(fmt::format("{}\n", fmt::join(ids, " ")));
        }
    });

    auto de_args = std::make_shared<DetokenizeArgs>();
    auto* de = root.add_subcommand("detokenize", "Decode comma-separated token ids");
    de->add_option("path", de_args->path, "Model directory (holding tokenizer.json)")->required();
    de->add_option("ids", de_args->ids, "Token ids, e.g. 1,2,3")->required();
    de->add_flag("--skip-special", de_args->skip_special, "Leave out special tokens");
    de->callback([de_args] {
        const auto t = scr::text::Tokenizer::load(de_args->path);
        write_stdout(t->decode(parse_ids(de_args->ids), de_args->skip_special));
    });

    auto r_args = std::make_shared<RenderArgs>();
    auto* r = root.add_subcommand("render", "Render a conversation with the model's chat template");
    r->add_option("path", r_args->path, "Model directory (tokenizer_config.json or chat_template.jinja)")->required();
    r->add_option("conversation", r_args->conversation,
                  "JSON file: {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true, ...}")
        ->required();
    r->callback([r_args] {
        std::ifstream f(r_args->conversation, std::ios::binary);
        if (!f) scr::fail("render: cannot open {}", r_args->conversation);
        std::stringstream ss;
        ss << f.rdbuf();
        nlohmann::ordered_json conv;
        try {
            conv = nlohmann::ordered_json::parse(ss.str());
        } catch (const nlohmann::json::parse_error& e) {
            scr::fail("render: {}: malformed JSON: {}", r_args->conversation, e.what());
        }
        if (!conv.is_object() || !conv.contains("messages") || !conv["messages"].is_array())
            scr::fail("render: {}: expected an object with a \"messages\" array", r_args->conversation);
        if (!conv.contains("add_generation_prompt")) conv["add_generation_prompt"] = true;
        const auto chat = scr::text::ChatTemplate::load(r_args->path);
        write_stdout(chat->render(conv));
    });
}

static scr::cli::CommandRegistrar reg(&setup);

}  // namespace
