// The `scr tokenize / detokenize / render` subcommands, driven through CLI11 exactly as main.cpp
// does, with stdout captured.
#include <gtest/gtest.h>

#include <cstdio>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/text/chat_template.hpp"
#include "tests/text/test_support.hpp"

namespace scr::cli {
// main.cpp's definitions (the test links cmd_text.cpp without main.cpp).
std::vector<CommandSetup>& command_setups() {
    static std::vector<CommandSetup> setups;
    return setups;
}
int& exit_code() {
    static int code = 0;
    return code;
}
}  // namespace scr::cli

namespace scr::text::test {
namespace {

std::string run_cli(std::vector<std::string> args) {
    CLI::App app{"scr"};
    app.require_subcommand(1);
    for (auto setup : scr::cli::command_setups()) setup(app);
    args.insert(args.begin(), "scr");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    std::fflush(stdout);
    ::testing::internal::CaptureStdout();
    try {
        app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (...) {
        ::testing::internal::GetCapturedStdout();
        throw;
    }
    std::fflush(stdout);
    return ::testing::internal::GetCapturedStdout();
}

TEST(TextCli, TokenizeJsonMatchesReferenceIds) {
    SCR_REQUIRE_ORACLES();
    const auto texts = read_json(corpus_dir() / "texts.json");
    const auto refs = read_json(refs_dir() / "tokenize_llama3_2.json");
    for (size_t i : {size_t{1}, size_t{14}, size_t{80}}) {
        const auto out = nlohmann::json::parse(run_cli({"tokenize", model_dir("llama3_2").string(), texts[i], "--json"}));
        EXPECT_EQ(out["ids"], nlohmann::json(refs[i]["ids"])) << "text #" << i;
        const auto with = nlohmann::json::parse(run_cli({"tokenize", model_dir("llama3_2").string(), texts[i], "--json", "--add-special"}));
        EXPECT_EQ(with["ids"], nlohmann::json(refs[i]["ids_special"])) << "text #" << i;
    }
}

TEST(TextCli, DetokenizePrintsExactText) {
    SCR_REQUIRE_ORACLES();
    const auto refs = read_json(refs_dir() / "tokenize_qwen3.json");
    const auto& r = refs[14];
    std::string list;
    for (const auto& id : r["ids"]) list += (list.empty() ? "" : ",") + std::to_string(id.get<int>());
    EXPECT_EQ(run_cli({"detokenize", model_dir("qwen3").string(), list}), r["decoded"].get<std::string>());
    EXPECT_THROW(run_cli({"detokenize", model_dir("qwen3").string(), "1,x,3"}), scr::Error);
}

TEST(TextCli, RenderPrintsPromptWithNothingAppended) {
    SCR_REQUIRE_ORACLES();
    const auto conv_path = std::filesystem::temp_directory_path() / "scr_text_cli_conv.json";
    {
        std::ofstream(conv_path) << R"({"messages": [{"role": "user", "content": "Hi"}], "enable_thinking": false})";
    }
    const std::string out = run_cli({"render", model_dir("qwen3").string(), conv_path.string()});
    EXPECT_EQ(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    std::filesystem::remove(conv_path);
}

}  // namespace
}  // namespace scr::text::test
