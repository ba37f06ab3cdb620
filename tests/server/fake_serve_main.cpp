// scr_fake_serve: the real HTTP server (server/) over the scripted engine and byte tokenizer of
// fake_model.hpp. The node client tests run against it when no model is built in, and it lets the
// HTTP layer's behaviour (streaming, disconnects, drain, errors) be tested in isolation.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "server/http_server.hpp"
#include "tests/server/fake_model.hpp"

int main(int argc, char** argv) {
    using namespace scr::server;
    CLI::App app{"scr_fake_serve: the scr HTTP server over a scripted engine (tests only)"};
    HttpServerOptions opt;
    testing::ScriptedEngineConfig engine_cfg;
    std::string tool_format = "hermes";
    opt.port = 0;
    app.add_option("--host", opt.host);
    app.add_option("--port", opt.port);
    app.add_option("--api-key", opt.api_key);
    app.add_option("--step-ms", engine_cfg.step_ms, "engine step time");
    app.add_option("--max-num-seqs", engine_cfg.max_num_seqs);
    app.add_option("--max-model-len", engine_cfg.max_model_len);
    app.add_option("--kv-blocks", engine_cfg.kv_blocks);
    app.add_option("--max-body-bytes", opt.max_body_bytes);
    app.add_option("--drain-timeout", opt.drain_timeout_s);
    app.add_option("--tool-call-parser", tool_format);
    CLI11_PARSE(app, argc, argv);

    block_termination_signals();
    testing::ByteText text;
    testing::ScriptedEngine engine(engine_cfg);
    ServingContext ctx;
    ctx.model_name = "scripted";
    ctx.max_model_len = engine_cfg.max_model_len;
    ctx.max_n = engine_cfg.max_num_seqs;
    ctx.tool_format = parse_tool_call_format(tool_format);
    ctx.end_of_turn_ids = {testing::ByteText::kEos};
    ctx.text = &text;
    opt.max_num_seqs = engine_cfg.max_num_seqs;
    opt.version = "fake";
    HttpServer server(opt, ctx, engine);
    const int port = server.bind();
    fmt::print("scr serve: listening on http://{}:{} (model {})\n", opt.host, port, ctx.model_name);
    std::fflush(stdout);
    return serve_until_signalled(server);
}
