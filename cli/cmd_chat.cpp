// `scr chat [MODEL] [-q QUESTION]`: one answer streamed to stdout with -q, otherwise a multi-turn
// REPL that keeps the conversation through the model's chat template. Ctrl-C stops the answer
// being generated (the REPL goes on); EOF or /exit quits. Runs the full engine (scheduler, prefix
// cache, sampler, incremental detokenizer), so earlier turns are served from the prefix cache.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/tokenizer.hpp"

namespace scr::cli {
namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

struct ChatArgs {
    std::string model;
    std::string question;
    std::string system_prompt;
    int max_tokens = -1;         // -1: generation_config.json max_new_tokens, else 512
    float temperature = -1;      // -1: generation_config.json (greedy when do_sample is false)
    float top_p = -1;
    int top_k = -1;
    uint64_t seed = 0;
    bool has_seed = false;
    int threads = 0;
    std::string quant;
    bool stats = false;
};

// Sampling defaults come from generation_config.json, as vLLM's do; flags override them.
SamplingParams sampling_params(const ChatArgs& a, const nlohmann::json& gen) {
    SamplingParams p;
    const bool do_sample = gen.value("do_sample", true);
    p.temperature = a.temperature >= 0 ? a.temperature
                    : !do_sample       ? 0.0f
                                       : gen.value("temperature", 1.0f);
    p.top_p = a.top_p > 0 ? a.top_p : gen.value("top_p", 1.0f);
    p.top_k = a.top_k >= 0 ? a.top_k : gen.value("top_k", 0);
    p.max_tokens = a.max_tokens > 0 ? a.max_tokens : gen.value("max_new_tokens", 512);
    if (a.has_seed) p.seed = a.seed;
    p.skip_special_tokens = true;
    return p;
}

class Chat {
public:
    explicit Chat(const ChatArgs& args) : args_(args) {
        LoadOptions o;
        o.quant = args.quant;
        o.threads = args.threads;
        o.load_text = true;
        lm_ = load_model(args.model, o);
        if (!lm_.tokenizer)
            fail("model {} has no tokenizer.json; chat needs one", lm_.dir.string());
        if (!lm_.chat_template)
            fmt::print(stderr, "note: {} has no chat template; using a plain \"User:/Assistant:\" transcript\n",
                       lm_.dir.string());
        EngineConfig cfg;
        cfg.max_num_seqs = 4;
        engine_ = std::make_unique<Engine>(*lm_.model, lm_.tokenizer.get(), cfg);
        params_ = sampling_params(args, lm_.generation_config);
        if (!args.system_prompt.empty())
            messages_.push_back({{"role", "system"}, {"content", args.system_prompt}});
    }

    // Streams one answer to stdout; returns false if Ctrl-C stopped it.
    bool answer(const std::string& question) {
        messages_.push_back({{"role", "user"}, {"content", question}});
        Request req;
        req.id = fmt::format("chat-{}", turn_++);
        req.prompt_ids = lm_.tokenizer->encode(render(), /*add_special_tokens=*/false);
        req.params = params_;
        if (int(req.prompt_ids.size()) >= engine_->config().max_model_len) {
            messages_.pop_back();
            fail("the conversation is {} tokens, and the model's context is {}: /reset to start over",
                 req.prompt_ids.size(), engine_->config().max_model_len);
        }
        std::string reply;
        RequestOutput last;
        const auto t0 = std::chrono::steady_clock::now();
        double first_token_s = 0;
        engine_->add_request(std::move(req), [&](const RequestOutput& o) {
            if (first_token_s == 0 && !o.new_token_ids.empty())
                first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::string_view text = o.new_text;
            if (reply.empty()) {  // the answer starts at its first visible character
                const size_t start = text.find_first_not_of(" \t\n");
                text = start == std::string_view::npos ? std::string_view{} : text.substr(start);
            }
            if (!text.empty()) {
                std::fwrite(text.data(), 1, text.size(), stdout);
                std::fflush(stdout);
                reply += text;
            }
            if (o.finished()) last = o;
        });
        g_interrupted = false;
        bool interrupted = false;
        while (engine_->has_unfinished()) {
            if (g_interrupted.exchange(false)) {
                engine_->abort_all();
                interrupted = true;
                break;
            }
            engine_->step();
        }
        std::fputc('\n', stdout);
        std::fflush(stdout);
        if (last.finish_reason == FinishReason::error) fail("generation failed: {}", last.error);
        messages_.push_back({{"role", "assistant"}, {"content", reply}});
        if (args_.stats) {
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            fmt::print(stderr, "[{} prompt tokens ({} from the prefix cache), {} generated in {:.2f} s: "
                               "first token {:.3f} s, {:.1f} tokens/s; {}]\n",
                       last.num_prompt_tokens, last.num_cached_tokens, last.num_output_tokens, s, first_token_s,
                       last.num_output_tokens / std::max(1e-9, s - first_token_s + 1e-9),
                       interrupted ? "interrupted" : finish_reason_name(last.finish_reason));
        }
        return !interrupted;
    }

    void reset() {
        messages_.erase(std::remove_if(messages_.begin(), messages_.end(),
                                       [](const nlohmann::json& m) { return m["role"] != "system"; }),
                        messages_.end());
    }

private:
    std::string render() const {
        if (lm_.chat_template) {
            nlohmann::json ctx = {{"messages", messages_}, {"add_generation_prompt", true}};
            return lm_.chat_template->render(ctx);
        }
        std::string s;
        for (const auto& m : messages_) {
            const std::string role = m["role"];
            s += (role == "user" ? "User: " : role == "system" ? "" : "Assistant: ") +
                 m["content"].get<std::string>() + "\n";
        }
        return s + "Assistant:";
    }

    ChatArgs args_;
    LoadedModel lm_;
    std::unique_ptr<Engine> engine_;
    SamplingParams params_;
    std::vector<nlohmann::json> messages_;
    int turn_ = 0;
};

// Reads a line; false at EOF. Ctrl-C at the prompt gives a fresh prompt, not an exit.
bool read_line(std::string& line) {
    line.clear();
    for (;;) {
        int c = std::fgetc(stdin);
        if (c == EOF) {
            if (std::ferror(stdin) && errno == EINTR) {
                std::clearerr(stdin);
                g_interrupted = false;
                fmt::print(stderr, "\n> ");
                line.clear();
                continue;
            }
            return !line.empty();
        }
        if (c == '\n') return true;
        line += char(c);
    }
}

void setup(CLI::App& app) {
    auto* c = app.add_subcommand("chat", "chat with a model: one answer with -q, otherwise an interactive conversation");
    auto a = std::make_shared<ChatArgs>();
    c->add_option("model", a->model, "model folder or Hugging Face id (default: the embedded model)");
    c->add_option("-q,--question", a->question, "ask one question, print the streamed answer and exit");
    c->add_option("--system-prompt", a->system_prompt, "system message at the start of the conversation");
    c->add_option("--max-tokens", a->max_tokens, "most tokens per answer (default: generation_config.json, else 512)")
        ->check(CLI::Range(1, 1 << 20));
    c->add_option("--temperature", a->temperature, "sampling temperature, 0 = greedy (default: generation_config.json)")
        ->check(CLI::Range(0.0, 100.0));
    c->add_option("--top-p", a->top_p, "nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
    c->add_option("--top-k", a->top_k, "keep the k most likely tokens (0: off)")->check(CLI::Range(0, 1 << 30));
    auto* seed = c->add_option("--seed", a->seed, "sampling seed (reproducible answers)");
    c->add_option("--threads", a->threads, "CPU threads (default: all cores)");
    c->add_option("--quant", a->quant, "quant preset of the specialization to use");
    c->add_flag("--stats", a->stats, "after each answer, print token counts and speed on stderr");
    c->callback([a, seed] {
        a->has_seed = seed->count() > 0;
        Chat chat(*a);
        struct sigaction sa {};
        sa.sa_handler = on_sigint;  // no SA_RESTART: a blocked read returns EINTR
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, nullptr);
        if (!a->question.empty()) {
            exit_code() = chat.answer(a->question) ? 0 : 130;
            return;
        }
        const bool tty = isatty(STDIN_FILENO);
        if (tty) fmt::print(stderr, "Type a message; /reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops an answer.\n");
        std::string line;
        for (;;) {
            if (tty) fmt::print(stderr, "> ");
            if (!read_line(line)) break;
            if (line == "/exit" || line == "/quit") break;
            if (line == "/reset") { chat.reset(); continue; }
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            try {
                chat.answer(line);
            } catch (const Error& e) {  // keep the conversation going
                std::fflush(stdout);
                fmt::print(stderr, "error: {}\n", e.what());
            }
        }
        if (tty) fmt::print(stderr, "\n");
    });
}

CommandRegistrar reg(&setup);

}  // namespace
}  // namespace scr::cli
