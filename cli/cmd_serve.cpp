// `scr serve [MODEL]`: the OpenAI- and Anthropic-compatible HTTP server (server/, docs/SERVER.md).
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdio>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/text/chat_template.hpp"
#include "runtime/text/tokenizer.hpp"
#include "server/http_server.hpp"
#include "server/model_text.hpp"

namespace scr::cli {
namespace {

// "1073741824", "4GiB", "512MiB", "1.5GB", "800M" -> bytes (K/M/G: powers of 1000; KiB/MiB/GiB: 1024).
int64_t parse_byte_size(const std::string& text) {
    size_t used = 0;
    double value = 0;
    try {
        value = std::stod(text, &used);
    } catch (const std::exception&) {
        fail("--kv-cache-memory '{}': expected bytes or a size like 4GiB, 512MiB, 2GB", text);
    }
    std::string unit = text.substr(used);
    for (auto& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
    double scale = 0;
    if (unit.empty() || unit == "b") scale = 1;
    else if (unit == "k" || unit == "kb") scale = 1e3;
    else if (unit == "m" || unit == "mb") scale = 1e6;
    else if (unit == "g" || unit == "gb") scale = 1e9;
    else if (unit == "kib") scale = 1024.0;
    else if (unit == "mib") scale = 1024.0 * 1024;
    else if (unit == "gib") scale = 1024.0 * 1024 * 1024;
    if (scale == 0 || !(value > 0) || !std::isfinite(value * scale) || value * scale > 9e18)
        fail("--kv-cache-memory '{}': expected a positive number of bytes or a size like 4GiB, 512MiB, 2GB", text);
    return int64_t(value * scale);
}

struct ServeArgs {
    std::string model;
    std::string quant;
    int threads = 0;
    std::string served_model_name;
    std::string tool_call_parser = "auto";
    std::string kv_cache_memory;
    bool no_prefix_caching = false;
    EngineConfig engine;
    server::HttpServerOptions http;
};

int serve(const ServeArgs& args) {
    // Before any thread starts (the kernels' pool, the engine, HTTP workers), so that only the
    // server's signal watcher takes SIGTERM/SIGINT.
    server::block_termination_signals();

    LoadOptions load;
    load.quant = args.quant;
    load.threads = args.threads;
    LoadedModel lm = load_model(args.model, load);
    if (!lm.tokenizer) fail("{}: the model folder has no tokenizer.json; `scr serve` needs one", lm.dir.string());

    EngineConfig config = args.engine;
    config.enable_prefix_caching = !args.no_prefix_caching;
    if (!args.kv_cache_memory.empty()) config.kv_cache_bytes = parse_byte_size(args.kv_cache_memory);
    AsyncEngine engine(*lm.model, lm.tokenizer.get(), config);  // validates the configuration
    server::AsyncEngineClient engine_client(engine);

    const ModelInfo& info = lm.model->info();
    server::ModelText text(*lm.tokenizer, lm.chat_template.get());
    server::ServingContext ctx;
    ctx.model_name = !args.served_model_name.empty() ? args.served_model_name
                     : !args.model.empty()             ? args.model
                                                       : lm.dir.filename().string();
    ctx.max_model_len = config.max_model_len > 0 ? config.max_model_len : info.max_position_embeddings;
    ctx.max_n = config.max_num_seqs;
    ctx.tool_format = args.tool_call_parser == "auto" ? server::detect_tool_call_format(lm.chat_template.get())
                                                      : server::parse_tool_call_format(args.tool_call_parser);
    ctx.defaults = server::sampling_defaults_from(lm.generation_config);
    ctx.text = &text;  // end-of-turn ids: the engine stops on the tokenizer's eos_ids() itself

    server::HttpServerOptions http = args.http;
    http.max_num_seqs = config.max_num_seqs;
    http.version = SCR_VERSION;
    server::HttpServer srv(http, ctx, engine_client);
    const int port = srv.bind();
    fmt::print("scr serve: listening on http://{}:{} (model {}, {} {}, context {}, tool calls: {}{})\n", http.host,
               port, ctx.model_name, info.stem, info.quant, ctx.max_model_len,
               server::tool_call_format_name(ctx.tool_format), http.api_key.empty() ? "" : ", API key required");
    std::fflush(stdout);
    return server::serve_until_signalled(srv);
}

void setup(CLI::App& app) {
    auto args = std::make_shared<ServeArgs>();
    auto* c = app.add_subcommand("serve", "serve a model over an OpenAI- and Anthropic-compatible HTTP API "
                                          "(docs/SERVER.md); SIGTERM drains and exits 0");
    c->add_option("model", args->model, "model folder or Hugging Face id (default: the embedded default model)");
    c->add_option("--host", args->http.host, "address to listen on")->capture_default_str();
    c->add_option("--port", args->http.port, "port (0: any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
    c->add_option("--api-key", args->http.api_key, "require `Authorization: Bearer KEY` (or `x-api-key`) on /v1/*")
        ->envname("SCR_API_KEY");
    c->add_option("--served-model-name", args->served_model_name, "the model name clients send (default: MODEL)");
    c->add_option("--quant", args->quant, "quant preset of the specialization to use (when several are compiled in)");
    c->add_option("--threads", args->threads, "CPU threads for the kernels (default: all cores)");
    c->add_option("--max-num-seqs", args->engine.max_num_seqs, "sequences one engine step may run")
        ->capture_default_str()->check(CLI::Range(1, 4096));
    c->add_option("--max-num-batched-tokens", args->engine.max_num_batched_tokens,
                  "tokens one engine step may carry (default: the compiled step size, 512 on the CPU, 2048 on CUDA)")
        ->check(CLI::Range(1, 1 << 20));
    c->add_option("--max-model-len", args->engine.max_model_len, "prompt + output tokens per request (default: the "
                                                                 "model's context)")->check(CLI::Range(1, 1 << 24));
    c->add_option("--kv-cache-memory", args->kv_cache_memory, "KV cache budget: bytes or e.g. 4GiB, 512MiB "
                                                              "(default: a fraction of free RAM)");
    c->add_flag("--no-prefix-caching", args->no_prefix_caching, "do not reuse KV blocks of shared prompt prefixes");
    c->add_option("--tool-call-parser", args->tool_call_parser, "auto | none | hermes | llama3_json")
        ->capture_default_str()->check(CLI::IsMember({"auto", "none", "hermes", "llama3_json"}));
    c->add_option("--max-body-bytes", args->http.max_body_bytes, "largest request body accepted (413 above)")
        ->capture_default_str();
    c->add_option("--http-threads", args->http.http_threads, "HTTP worker threads (default: max(32, 2 x max-num-seqs + 16))");
    c->add_option("--drain-timeout", args->http.drain_timeout_s, "seconds in-flight requests get to finish after SIGTERM")
        ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
    c->add_flag("--log-requests", args->http.log_requests, "print one line per HTTP request to stderr");
    c->callback([args] { exit_code() = serve(*args); });
}

const CommandRegistrar registrar(setup);

}  // namespace
}  // namespace scr::cli
