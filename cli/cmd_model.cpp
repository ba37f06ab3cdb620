// `scr models`, `scr info`, `scr logits` (the specialization itself, with no engine in between) and
// `scr complete` (one sequence through the engine). `logits` and `complete --ids ... --json` are test interfaces that outside
// checks rely on; keep their output exactly.
#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/model/sequence_runner.hpp"
#include "runtime/text/tokenizer.hpp"

namespace scr::cli {
namespace {

// Resident kB of this process from /proc/self/status (RssAnon, RssFile), -1 when unknown.
int64_t status_kb(const char* key) {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int64_t v = -1;
    const size_t n = std::strlen(key);
    while (std::fgets(line, sizeof line, f))
        if (std::strncmp(line, key, n) == 0 && line[n] == ':') v = std::atoll(line + n + 1);
    std::fclose(f);
    return v;
}

std::vector<int32_t> parse_ids(const std::string& text) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t comma = text.find(',', pos);
        if (comma == std::string::npos) comma = text.size();
        std::string item = text.substr(pos, comma - pos);
        while (!item.empty() && item.front() == ' ') item.erase(item.begin());
        while (!item.empty() && item.back() == ' ') item.pop_back();
        int32_t v = 0;
        auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0)
            fail("--ids: \"{}\" is not a non-negative integer token id", item);
        ids.push_back(v);
        pos = comma + 1;
    }
    if (ids.empty()) fail("--ids: no token ids given");
    return ids;
}

void check_vocab(const std::vector<int32_t>& ids, const ModelInfo& info) {
    for (auto id : ids)
        if (id >= info.vocab_size) fail("token id {} is outside the vocabulary of {} ({} ids)", id, info.stem, info.vocab_size);
}

void print_floats(std::string& out, std::span<const float> v) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        out += fmt::format("{:.9g}", v[i]);
    }
    out += ']';
}

struct ModelArgs {
    std::string model;
    std::string quant;
    int threads = 0;
    bool huge_pages = LoadOptions::huge_pages_from_env();
    void add(CLI::App* c, bool required = true) {
        auto* o = c->add_option("model", model, "model folder or Hugging Face id (in the local HF cache)");
        if (required) o->required();
        c->add_option("--quant", quant, "quant preset of the specialization to use (when several are compiled in)");
        c->add_option("--threads", threads, "CPU threads (default: all cores)");
        c->add_flag("--huge-pages,!--no-huge-pages", huge_pages,
                    "copy weights of 64 MiB or more into 2 MiB pages at load, or not (default on; SCR_HUGE_PAGES=0: off)");
    }
    LoadedModel load(bool text = false) const {
        LoadOptions o;
        o.quant = quant;
        o.threads = threads;
        o.load_text = text;
        o.huge_pages = huge_pages;
        return load_model(model, o);
    }
};

void setup(CLI::App& app) {
    app.add_subcommand("models", "list the specializations compiled into this binary")->callback([] {
        fmt::print("{}", describe_compiled_models());
    });

    {
        auto* c = app.add_subcommand("info", "print the compiled plan for a model: constants, ops, weight/KV/scratch bytes");
        auto args = std::make_shared<ModelArgs>();
        args->add(c, false);
        c->callback([args] {
            auto lm = args->load();
            const ModelInfo& m = *lm.entry->info;
            fmt::print("{}", m.plan_text);
            fmt::print("loaded from {}: {} bytes mapped with no copy, {} bytes converted at load, {} bytes copied to huge pages, {:.3f} s\n",
                       lm.dir.string(), lm.weights->mapped_bytes(), lm.weights->converted_bytes(),
                       lm.weights->huge_page_bytes(), lm.load_seconds);
            // Measured against the plan: one decode step, then what the process holds.
            {
                SequenceRunner run(*lm.model, 1);
                int32_t id = int32_t(std::max<int64_t>(m.bos_token_id, 0));
                run.feed(std::span<const int32_t>(&id, 1));
            }
            fmt::print("measured after one decode step: anonymous resident {:.1f} MiB (planned scratch {:.1f} MiB + "
                       "converted weights {:.1f} MiB + runtime), file-backed resident {:.1f} MiB (mapped weights)\n",
                       status_kb("RssAnon") / 1024.0, m.scratch_bytes / 1048576.0,
                       lm.weights->converted_bytes() / 1048576.0, status_kb("RssFile") / 1024.0);
        });
    }

    {
        auto* c = app.add_subcommand("logits", "print {\"logits\": [...]} for the last position of --ids (all positions with --all)");
        auto args = std::make_shared<ModelArgs>();
        auto ids = std::make_shared<std::string>();
        auto all = std::make_shared<bool>(false);
        args->add(c);
        c->add_option("--ids", *ids, "comma-separated token ids")->required();
        c->add_flag("--all", *all, "one list of logits per position");
        c->callback([args, ids, all] {
            auto lm = args->load();
            auto tokens = parse_ids(*ids);
            check_vocab(tokens, *lm.entry->info);
            SequenceRunner run(*lm.model, int(tokens.size()));
            auto logits = run.feed(tokens, *all);
            const size_t vocab = size_t(lm.entry->info->vocab_size);
            std::string out = "{\"logits\": ";
            if (*all) {
                out += '[';
                for (size_t t = 0; t < tokens.size(); ++t) {
                    if (t) out += ", ";
                    print_floats(out, std::span<const float>(logits).subspan(t * vocab, vocab));
                }
                out += ']';
            } else {
                print_floats(out, logits);
            }
            out += "}\n";
            std::fwrite(out.data(), 1, out.size(), stdout);
        });
    }

    {
        // Through the engine (scheduler, sampler, detokenizer) with one sequence: what `scr chat`
        // and `scr serve` run, minus the chat template. --ids is the test interface: exactly
        // --max-tokens new ids, EOS ignored. --prompt tokenizes text and stops at EOS.
        auto* c = app.add_subcommand("complete", "continue --ids or --prompt by up to --max-tokens tokens (greedy unless --temperature > 0)");
        auto args = std::make_shared<ModelArgs>();
        auto ids = std::make_shared<std::string>();
        auto prompt = std::make_shared<std::string>();
        auto params = std::make_shared<SamplingParams>();
        params->temperature = 0.0f;
        auto seed = std::make_shared<uint64_t>(0);
        auto json = std::make_shared<bool>(false);
        auto ignore_eos = std::make_shared<bool>(false);
        args->add(c, /*required=*/false);  // no MODEL: the embedded default model
        auto* ids_opt = c->add_option("--ids", *ids, "comma-separated prompt token ids (generates exactly --max-tokens ids)");
        auto* prompt_opt = c->add_option("--prompt", *prompt, "prompt text, tokenized with the model's tokenizer (BOS added as the tokenizer's post-processor does)");
        ids_opt->excludes(prompt_opt);
        prompt_opt->excludes(ids_opt);
        c->add_option("--max-tokens", params->max_tokens, "new tokens at most")->check(CLI::Range(1, 1 << 20));
        c->add_option("--temperature", params->temperature, "sampling temperature (0: greedy)")->check(CLI::Range(0.0, 100.0));
        c->add_option("--top-p", params->top_p, "nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
        c->add_option("--top-k", params->top_k, "sample among the k most likely tokens (0: off)")->check(CLI::Range(0, 1 << 30));
        c->add_option("--seed", *seed, "sampling seed");
        c->add_flag("--ignore-eos", *ignore_eos, "with --prompt: keep generating past the end-of-sequence token");
        c->add_flag("--json", *json, "print {\"ids\": [...]} (and \"text\" with --prompt)");
        c->callback([=] {
            if (ids->empty() && prompt->empty()) fail("complete: give --ids or --prompt");
            const bool text_mode = !prompt->empty();
            auto lm = args->load(text_mode);
            const ModelInfo& info = *lm.entry->info;
            std::vector<int32_t> tokens;
            if (text_mode) {
                if (!lm.tokenizer) fail("model {} has no tokenizer.json; --prompt needs one (or give --ids)", lm.dir.string());
                tokens = lm.tokenizer->encode(*prompt, /*add_special_tokens=*/true);
            } else {
                tokens = parse_ids(*ids);
            }
            check_vocab(tokens, info);
            const int64_t total = int64_t(tokens.size()) + params->max_tokens;
            if (total > info.max_position_embeddings)
                fail("prompt of {} tokens + {} new tokens is longer than the context of {} ({} tokens)", tokens.size(),
                     params->max_tokens, info.stem, info.max_position_embeddings);
            EngineConfig cfg;
            cfg.max_num_seqs = 1;
            Engine engine(*lm.model, lm.tokenizer.get(), cfg);
            Request req;
            req.id = "complete";
            req.prompt_ids = std::move(tokens);
            req.params = *params;
            req.params.seed = *seed;
            req.params.ignore_eos = !text_mode || *ignore_eos;
            std::vector<int32_t> out;
            std::string text, error;
            const bool stream = text_mode && !*json;
            engine.add_request(std::move(req), [&](const RequestOutput& o) {
                out.insert(out.end(), o.new_token_ids.begin(), o.new_token_ids.end());
                text += o.new_text;
                if (stream && !o.new_text.empty()) {
                    std::fwrite(o.new_text.data(), 1, o.new_text.size(), stdout);
                    std::fflush(stdout);
                }
                if (o.finish_reason == FinishReason::error) error = o.error;
            });
            while (engine.has_unfinished()) engine.step();
            if (!error.empty()) fail("complete: {}", error);
            if (*json) {
                if (text_mode)
                    fmt::print("{{\"ids\": [{}], \"text\": {}}}\n", fmt::join(out, ", "), nlohmann::json(text).dump());
                else
                    fmt::print("{{\"ids\": [{}]}}\n", fmt::join(out, ", "));
            } else if (stream) {
                std::fputc('\n', stdout);
            } else {
                fmt::print("{}\n", fmt::join(out, ","));
            }
        });
    }
}

CommandRegistrar reg(&setup);

}  // namespace
}  // namespace scr::cli
