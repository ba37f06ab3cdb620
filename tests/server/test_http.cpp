// The HTTP glue over real sockets (loopback), with the scripted engine standing in for the model:
// routing, error shapes, auth, body limits, streaming, client disconnects, slow readers, drain, and
// SIGTERM on a server process.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "server/http_server.hpp"
#include "tests/server/fake_model.hpp"

extern char** environ;

namespace scr::server {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using testing::ByteText;
using testing::ScriptedEngine;
using testing::ScriptedEngineConfig;

class LiveServer {
public:
    explicit LiveServer(HttpServerOptions opt = {}, ScriptedEngineConfig engine_config = {})
        : engine(engine_config) {
        ctx.model_name = "scripted";
        ctx.max_model_len = engine_config.max_model_len;
        ctx.max_n = 8;
        ctx.tool_format = ToolCallFormat::hermes;
        ctx.end_of_turn_ids = {ByteText::kEos};
        ctx.text = &text;
        opt.port = 0;
        opt.version = "test";
        server = std::make_unique<HttpServer>(opt, ctx, engine);
        port = server->bind();
        serve_thread = std::thread([this] { server->serve(); });
    }
    ~LiveServer() {
        server->drain();
        serve_thread.join();
    }

    std::unique_ptr<httplib::Client> client() const {
        auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
        c->set_read_timeout(20, 0);
        return c;
    }

    // Waits until the engine holds nothing (all KV blocks free, nothing running or waiting).
    bool engine_idle(std::chrono::milliseconds within) const {
        const auto deadline = std::chrono::steady_clock::now() + within;
        while (std::chrono::steady_clock::now() < deadline) {
            const EngineStats s = engine.stats();
            if (s.num_running == 0 && s.num_waiting == 0 && s.kv_blocks_free == s.kv_blocks_total) return true;
            std::this_thread::sleep_for(5ms);
        }
        return false;
    }

    ByteText text;
    ScriptedEngine engine;
    ServingContext ctx;
    std::unique_ptr<HttpServer> server;
    int port = 0;
    std::thread serve_thread;
};

struct Streamed {
    int status = 0;
    std::string body;
    bool transport_ok = false;
};

// POSTs and reads the response as it streams; `on_chunk` may return false to hang up.
Streamed post_streaming(const LiveServer& s, const std::string& path, const std::string& body,
                        std::function<bool(const std::string& so_far)> on_chunk = nullptr) {
    Streamed out;
    auto cli = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    req.response_handler = [&](const httplib::Response& r) {
        out.status = r.status;
        return true;
    };
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        out.body.append(data, len);
        return on_chunk ? on_chunk(out.body) : true;
    };
    out.transport_ok = bool(cli->send(req));
    return out;
}

// A chat request the scripted engine answers with `say`.
std::string chat_body(const std::string& say, int max_tokens, bool stream) {
    return json({{"model", "scripted"}, {"messages", {{{"role", "user"}, {"content", "say: " + say}}}},
                 {"max_tokens", max_tokens}, {"stream", stream}}).dump();
}

// Concatenated delta contents of an OpenAI SSE stream, and whether it ended with [DONE].
std::pair<std::string, bool> stream_content(const std::string& sse) {
    std::string content;
    bool done = false;
    size_t pos = 0;
    while ((pos = sse.find("data: ", pos)) != std::string::npos) {
        const size_t end = sse.find("\n\n", pos);
        const std::string data = sse.substr(pos + 6, end - pos - 6);
        pos = end;
        if (data == "[DONE]") {
            done = true;
            continue;
        }
        const json chunk = json::parse(data);
        if (chunk.contains("choices") && !chunk["choices"].empty() && chunk["choices"][0]["delta"].contains("content"))
            content += chunk["choices"][0]["delta"]["content"].get<std::string>();
    }
    return {content, done};
}

TEST(Http, ProbesAndInfoEndpoints) {
    LiveServer s;
    auto cli = s.client();
    auto health = cli->Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    EXPECT_EQ(json::parse(health->body)["status"], "ok");
    auto models = cli->Get("/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "scripted");
    EXPECT_EQ(json::parse(cli->Get("/v1/models/scripted")->body)["id"], "scripted");
    EXPECT_EQ(cli->Get("/v1/models/other")->status, 404);
    EXPECT_EQ(json::parse(cli->Get("/version")->body)["version"], "test");
    auto missing = cli->Get("/v1/nothing");
    EXPECT_EQ(missing->status, 404);
    EXPECT_EQ(json::parse(missing->body)["error"]["message"], "Invalid URL (GET /v1/nothing)");
    auto metrics = cli->Get("/metrics");
    EXPECT_EQ(metrics->status, 200);
    EXPECT_NE(metrics->body.find("scr_kv_cache_blocks_total 4096"), std::string::npos);
}

TEST(Http, ChatNonStreaming) {
    LiveServer s;
    auto res = s.client()->Post("/v1/chat/completions", chat_body("hello there", 50, false), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
    const json body = json::parse(res->body);
    EXPECT_EQ(body["choices"][0]["message"]["content"], "hello there");
    EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(body["usage"]["completion_tokens"], 12);  // 11 bytes + <eos>
    const size_t prompt_len = std::string("<|user|>say: hello there\n<|assistant|>").size();
    EXPECT_EQ(body["usage"]["prompt_tokens"], prompt_len);
    // What the engine was asked for.
    const auto submitted = s.engine.submitted();
    ASSERT_EQ(submitted.size(), 1u);
    EXPECT_EQ(submitted[0].params.max_tokens, 50);
    EXPECT_EQ(submitted[0].prompt_ids.size(), prompt_len);
}

TEST(Http, ChatStreamingAndLength) {
    LiveServer s;
    const auto r = post_streaming(s, "/v1/chat/completions", chat_body("abcdefghij", 4, true));
    EXPECT_EQ(r.status, 200);
    const auto [content, done] = stream_content(r.body);
    EXPECT_EQ(content, "abcd");
    EXPECT_TRUE(done);
    EXPECT_NE(r.body.find("\"finish_reason\":\"length\""), std::string::npos);
}

TEST(Http, ErrorsHaveStatusAndOpenAIShape) {
    LiveServer s;
    auto cli = s.client();
    auto check = [&](const httplib::Result& res, int status, const char* code) {
        ASSERT_TRUE(res);
        EXPECT_EQ(res->status, status) << res->body;
        const json body = json::parse(res->body);
        ASSERT_TRUE(body.contains("error")) << res->body;
        for (const char* key : {"message", "type", "param", "code"}) EXPECT_TRUE(body["error"].contains(key)) << key;
        if (code) {
            EXPECT_EQ(body["error"]["code"], code);
        }
    };
    check(cli->Post("/v1/chat/completions", "{not json", "application/json"), 400, "invalid_json");
    check(cli->Post("/v1/chat/completions", R"({"messages": []})", "application/json"), 400, "invalid_value");
    check(cli->Post("/v1/chat/completions", R"({"model": "x", "messages": [{"role": "user", "content": "a"}]})",
                    "application/json"), 404, "model_not_found");
    check(cli->Post("/v1/completions", R"({"prompt": "a", "max_tokens": 100000})", "application/json"), 400,
          "context_length_exceeded");
    check(cli->Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "foo": 1})",
                    "application/json"), 400, "unknown_parameter");
    // Anthropic's endpoint answers in Anthropic's shape.
    auto a = cli->Post("/v1/messages", R"({"messages": [{"role": "user", "content": "a"}]})", "application/json");
    ASSERT_TRUE(a);
    EXPECT_EQ(a->status, 400);
    EXPECT_EQ(json::parse(a->body)["type"], "error");
    EXPECT_EQ(json::parse(a->body)["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(s.engine_idle(2s));
}

TEST(Http, ApiKeyAndBodyLimit) {
    HttpServerOptions opt;
    opt.api_key = "sk-test";
    opt.max_body_bytes = 4096;
    LiveServer s(opt);
    auto cli = s.client();
    const std::string body = chat_body("x", 3, false);
    auto missing = cli->Post("/v1/chat/completions", body, "application/json");
    EXPECT_EQ(missing->status, 401);
    EXPECT_EQ(json::parse(missing->body)["error"]["code"], "invalid_api_key");
    auto wrong = cli->Post("/v1/chat/completions", {{"Authorization", "Bearer sk-nope"}}, body, "application/json");
    EXPECT_EQ(wrong->status, 401);
    auto right = cli->Post("/v1/chat/completions", {{"Authorization", "Bearer sk-test"}}, body, "application/json");
    EXPECT_EQ(right->status, 200);
    auto anthropic = cli->Post("/v1/messages", {{"x-api-key", "bad"}}, "{}", "application/json");
    EXPECT_EQ(json::parse(anthropic->body)["error"]["type"], "authentication_error");
    EXPECT_EQ(cli->Get("/health")->status, 200);  // probes stay open
    auto big = cli->Post("/v1/chat/completions", {{"Authorization", "Bearer sk-test"}}, std::string(10000, ' '),
                         "application/json");
    ASSERT_TRUE(big);
    EXPECT_EQ(big->status, 413);
    EXPECT_NE(json::parse(big->body)["error"]["message"].get<std::string>().find("4096"), std::string::npos);
}

TEST(Http, DisconnectMidStreamFreesTheRequestAtOnce) {
    ScriptedEngineConfig slow;
    slow.step_ms = 10;
    LiveServer s({}, slow);
    const std::string body = R"({"messages": [{"role": "user", "content": "go"}], "max_tokens": 3000,
                                 "ignore_eos": true, "stream": true})";
    int chunks = 0;
    const auto r = post_streaming(s, "/v1/chat/completions", body, [&](const std::string&) { return ++chunks < 5; });
    EXPECT_FALSE(r.transport_ok);  // we hung up
    const auto hung_up = std::chrono::steady_clock::now();
    ASSERT_TRUE(s.engine_idle(2s)) << "request still holds the engine after the client left";
    EXPECT_LT(std::chrono::steady_clock::now() - hung_up, 1s);
    const EngineStats stats = s.engine.stats();
    EXPECT_EQ(stats.requests_aborted, 1);
    EXPECT_LT(stats.generation_tokens, 300);  // stopped long before 3000 tokens
    const std::string metrics = s.client()->Get("/metrics")->body;
    EXPECT_NE(metrics.find("scr_client_disconnects_total 1\n"), std::string::npos);
    EXPECT_NE(metrics.find("scr_http_active_generations 0\n"), std::string::npos);
}

TEST(Http, ConcurrentStreamsAndAReaderThatStopsReading) {
    ScriptedEngineConfig cfg;
    cfg.step_ms = 2;
    LiveServer s({}, cfg);
    // A client that stops reading a fat stream (8 samples x 20 logprobs per token, about 4 MB/s):
    // the server's writes to it block once the socket buffers fill. Others must not notice.
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::atomic<bool> stalled{false};
    auto stuck = std::async(std::launch::async, [&] {
        return post_streaming(s, "/v1/chat/completions",
                              R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2000, "n": 8,
                                  "ignore_eos": true, "logprobs": true, "top_logprobs": 20, "stream": true})",
                              [&](const std::string&) {
                                  stalled = true;
                                  released.wait_for(20s);
                                  return false;  // then hang up
                              });
    });
    while (!stalled) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(300ms);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::future<Streamed>> others;
    for (int i = 0; i < 24; ++i)
        others.push_back(std::async(std::launch::async, [&, i] {
            return post_streaming(s, "/v1/chat/completions", chat_body("client " + std::to_string(i), 100, true));
        }));
    for (int i = 0; i < 24; ++i) {
        const Streamed r = others[size_t(i)].get();
        EXPECT_EQ(r.status, 200);
        const auto [content, done] = stream_content(r.body);
        EXPECT_EQ(content, "client " + std::to_string(i));
        EXPECT_TRUE(done);
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    release.set_value();
    stuck.get();
    EXPECT_TRUE(s.engine_idle(5s)) << "the stalled client's request was not aborted";
}

TEST(Http, DrainFinishesInFlightAndRefusesNewWork) {
    ScriptedEngineConfig cfg;
    cfg.step_ms = 10;
    HttpServerOptions opt;
    opt.drain_timeout_s = 10;
    auto s = std::make_unique<LiveServer>(opt, cfg);
    std::promise<void> first_chunk;
    bool signalled = false;
    auto stream = std::async(std::launch::async, [&] {
        return post_streaming(*s, "/v1/chat/completions", chat_body("a fifty byte sentence, more or less, to stream", 100, true),
                              [&](const std::string&) {
                                  if (!signalled) {
                                      signalled = true;
                                      first_chunk.set_value();
                                  }
                                  return true;
                              });
    });
    first_chunk.get_future().wait();
    auto drained = std::async(std::launch::async, [&] { s->server->drain(); });
    // Once /health says so, the server is draining (the drain thread may start late on a busy machine).
    for (int i = 0; i < 500; ++i) {
        auto health = s->client()->Get("/health");
        if (!health || health->status == 503) break;
        std::this_thread::sleep_for(10ms);
    }
    auto late = s->client()->Post("/v1/chat/completions", chat_body("x", 3, false), "application/json");
    if (late) {  // refused, or the listener is already closed
        EXPECT_EQ(late->status, 503);
        EXPECT_EQ(json::parse(late->body)["error"]["code"], "server_shutting_down");
    }
    const Streamed r = stream.get();
    const auto [content, done] = stream_content(r.body);
    EXPECT_EQ(content, "a fifty byte sentence, more or less, to stream");
    EXPECT_TRUE(done);
    drained.get();
    s.reset();  // serve() has returned: the destructor's join does not hang
}

TEST(Http, DrainTimeoutAbortsWithAnErrorEvent) {
    ScriptedEngineConfig cfg;
    cfg.step_ms = 5;
    HttpServerOptions opt;
    opt.drain_timeout_s = 0.2;
    LiveServer s(opt, cfg);
    std::promise<void> first_chunk;
    bool signalled = false;
    auto stream = std::async(std::launch::async, [&] {
        return post_streaming(s, "/v1/chat/completions",
                              R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4000,
                                  "ignore_eos": true, "stream": true})",
                              [&](const std::string&) {
                                  if (!signalled) {
                                      signalled = true;
                                      first_chunk.set_value();
                                  }
                                  return true;
                              });
    });
    first_chunk.get_future().wait();
    const auto start = std::chrono::steady_clock::now();
    s.server->drain();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
    const Streamed r = stream.get();
    EXPECT_NE(r.body.find("\"code\":\"request_aborted\""), std::string::npos) << r.body;
    EXPECT_TRUE(stream_content(r.body).second);
    EXPECT_TRUE(s.engine_idle(1s));
}

#ifdef SCR_FAKE_SERVE_PATH
// SIGTERM to a server process: in-flight stream completes, the process exits 0.
TEST(Http, SigtermDrainsAndExitsZero) {
    int out_pipe[2];
    ASSERT_EQ(pipe(out_pipe), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
    posix_spawn_file_actions_addclose(&actions, out_pipe[0]);
    const char* argv[] = {SCR_FAKE_SERVE_PATH, "--step-ms", "10", nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, SCR_FAKE_SERVE_PATH, &actions, nullptr, const_cast<char**>(argv), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(out_pipe[1]);
    std::string line;
    char c;
    while (read(out_pipe[0], &c, 1) == 1 && c != '\n') line += c;
    close(out_pipe[0]);
    const size_t colon = line.rfind(':');
    ASSERT_NE(colon, std::string::npos) << line;
    const int port = std::stoi(line.substr(colon + 1));

    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(20, 0);
    std::string body;
    bool killed = false;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = chat_body("twenty-five bytes of text", 100, true);
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        body.append(data, len);
        if (!killed) {
            killed = true;
            kill(pid, SIGTERM);
        }
        return true;
    };
    EXPECT_TRUE(bool(cli.send(req)));
    const auto [content, done] = stream_content(body);
    EXPECT_EQ(content, "twenty-five bytes of text");
    EXPECT_TRUE(done);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
}
#endif

}  // namespace
}  // namespace scr::server
