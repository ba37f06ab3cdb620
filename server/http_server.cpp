#include "server/http_server.hpp"

#include <httplib.h>
#include <pthread.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "runtime/core/error.hpp"
#include "server/request_mailbox.hpp"

namespace scr::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// How long an HTTP thread waits for engine news before httplib re-checks that the client is still
// there: the bound on how late a disconnect is noticed while a request waits for tokens.
constexpr auto kPollInterval = std::chrono::milliseconds(50);
constexpr int kListenBacklog = 1024;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

class ListeningServer : public httplib::Server {
public:
    // cpp-httplib listens with a backlog of 5 (compiled into the shared library): a burst of new
    // clients overflows it and waits out a SYN retransmit (1 s). listen() again on the bound socket
    // raises the backlog.
    void raise_backlog(int backlog) { ::listen(svr_sock_, backlog); }
};

// One generation request in flight. Shared by the HTTP thread serving it and the engine callbacks.
struct Generation {
    explicit Generation(int num_choices)
        : mailbox(num_choices), finished(size_t(num_choices), false), last_token_at(size_t(num_choices)) {}

    std::vector<std::string> engine_ids;
    int n = 1;
    Clock::time_point arrival;
    RequestMailbox mailbox;

    // HTTP thread only.
    std::unique_ptr<ResponseWriter> writer;
    std::vector<ChoiceDelta> taken;
    std::vector<bool> finished;
    int num_finished = 0;
    std::string outbox;           // bytes waiting to be written
    bool complete = false;        // the response's last bytes are in outbox (or written)
    std::optional<ApiError> failure;

    // Engine thread only (latency metrics).
    std::vector<Clock::time_point> last_token_at;
    bool saw_first_token = false;
};

bool is_anthropic_path(const std::string& path) { return path.starts_with("/v1/messages"); }

// Bounded label set for per-endpoint metrics.
std::string endpoint_label(const std::string& path) {
    static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages",
                                  "/v1/messages/count_tokens", "/v1/models", "/health", "/metrics",
                                  "/tokenize", "/detokenize", "/version"};
    for (const char* k : known)
        if (path == k) return k;
    if (path.starts_with("/v1/models/")) return "/v1/models/{model}";
    return "other";
}

}  // namespace

struct HttpServer::Impl {
    Impl(HttpServerOptions o, ServingContext c, EngineClient& e)
        : opt(std::move(o)), ctx(std::move(c)), engine(e), metrics(std::make_shared<ServerMetrics>()),
          created_unix(std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count()) {}

    HttpServerOptions opt;
    ServingContext ctx;
    EngineClient& engine;
    std::shared_ptr<ServerMetrics> metrics;  // engine callbacks may outlive the server
    ListeningServer http;
    int64_t created_unix;

    std::atomic<bool> draining{false};
    std::atomic<bool> serving{false}, serve_done{false};
    std::once_flag drain_once;
    std::mutex active_mutex;
    std::condition_variable active_cv;
    int active = 0;  // generation responses being written

    // Held by whatever serves a generation response; the last holder's release wakes drain().
    struct ActiveToken {
        explicit ActiveToken(Impl& impl) : impl(impl) {
            std::lock_guard lock(impl.active_mutex);
            ++impl.active;
            impl.metrics->active_generations.fetch_add(1);
        }
        ~ActiveToken() {
            {
                std::lock_guard lock(impl.active_mutex);
                --impl.active;
                impl.metrics->active_generations.fetch_sub(1);
            }
            impl.active_cv.notify_all();
        }
        Impl& impl;
    };

    void send_error(httplib::Response& res, const ApiError& e, bool anthropic) const {
        res.status = e.status;
        res.set_content(to_wire(anthropic ? anthropic_error_body(e) : openai_error_body(e)), "application/json");
    }

    static ApiError shutting_down() {
        return ApiError(503, "server_error", "The server is shutting down and takes no new requests", "",
                        "server_shutting_down");
    }

    void abort_all(const Generation& g) {
        for (const auto& id : g.engine_ids) engine.abort(id);
    }

    std::shared_ptr<Generation> submit(GenerationJob& job, Clock::time_point arrival) {
        static constexpr const char* prefixes[] = {"chatcmpl-", "cmpl-", "msg_"};
        auto gen = std::make_shared<Generation>(job.num_choices());
        std::string id = random_id(prefixes[int(job.api)]);
        gen->writer = make_response_writer(job, ctx, id, created_unix);
        gen->n = job.params.n;
        gen->arrival = arrival;
        for (size_t p = 0; p < job.prompts.size(); ++p) {
            Request r;
            r.id = fmt::format("{}-{}", id, p);
            r.prompt_ids = std::move(job.prompts[p]);
            r.params = job.params;
            r.priority = job.priority;
            r.arrival_time = seconds(arrival.time_since_epoch());
            const int first_choice = int(p) * job.params.n;
            auto on_output = [gen, metrics = metrics, first_choice](const RequestOutput& out) {
                const int choice = first_choice + out.index;
                if (!out.new_token_ids.empty()) {
                    const auto now = Clock::now();
                    auto& last = gen->last_token_at.at(size_t(choice));
                    if (last == Clock::time_point{}) {
                        if (!gen->saw_first_token) {
                            gen->saw_first_token = true;
                            metrics->time_to_first_token.observe(seconds(now - gen->arrival));
                        }
                    } else {
                        const auto k = out.new_token_ids.size();
                        metrics->inter_token_latency.observe(seconds(now - last) / double(k), k);
                    }
                    last = now;
                }
                gen->mailbox.post(choice, out);
            };
            std::string engine_id = r.id;
            try {
                engine.submit(std::move(r), std::move(on_output));
            } catch (const scr::Error& e) {
                abort_all(*gen);
                if (draining) throw shutting_down();
                throw ApiError(400, "invalid_request_error", e.what(), "", "engine_rejected");
            }
            gen->engine_ids.push_back(std::move(engine_id));
        }
        return gen;
    }

    // Moves taken news into the writer. A choice that failed (engine error, abort) fails the request.
    void absorb(Generation& g) {
        for (size_t i = 0; i < g.taken.size(); ++i) {
            const ChoiceDelta& d = g.taken[i];
            if (!d.has_news || g.finished[i]) continue;
            if (d.finish == FinishReason::error || d.finish == FinishReason::abort) {
                if (!g.failure) {
                    g.failure = d.finish == FinishReason::abort
                                    ? ApiError(503, "server_error", "The request was aborted by the server "
                                                                    "(shutting down)", "", "request_aborted")
                                    : ApiError(500, "server_error", "Generation failed: " + d.error, "",
                                               "engine_error");
                }
            } else {
                g.writer->on_delta(int(i), d, g.outbox);
            }
            if (d.finish != FinishReason::none) {
                g.finished[i] = true;
                ++g.num_finished;
                metrics->count_finished(d.finish);
            }
        }
        if (g.failure) {
            abort_all(g);
        } else if (g.num_finished == int(g.finished.size())) {
            g.writer->on_complete(g.outbox);
            g.complete = true;
            metrics->e2e_latency.observe(seconds(Clock::now() - g.arrival));
        }
    }

    void handle_generation(const httplib::Request& req, httplib::Response& res, ApiKind api) {
        const auto arrival = Clock::now();
        const bool anthropic = api == ApiKind::messages;
        std::shared_ptr<Generation> gen;
        try {
            if (draining) throw shutting_down();
            const RequestJson body = parse_json_body(req.body);
            GenerationJob job = api == ApiKind::chat         ? parse_chat_request(body, ctx)
                                : api == ApiKind::completion ? parse_completion_request(body, ctx)
                                                             : parse_messages_request(body, ctx);
            auto token = std::make_shared<ActiveToken>(*this);
            gen = submit(job, arrival);

            // Headers wait for the first news, so a request that fails before producing anything gets
            // a real HTTP status rather than a 200 with an error inside.
            while (!gen->mailbox.take(gen->taken, kPollInterval)) {
            }
            absorb(*gen);
            if (gen->failure) throw *gen->failure;
            const char* content_type = gen->writer->content_type();
            if (gen->complete) {
                res.set_content(std::move(gen->outbox), content_type);
                return;
            }
            if (job.stream) {
                res.set_header("Cache-Control", "no-cache");
                res.set_header("X-Accel-Buffering", "no");
            }
            res.set_chunked_content_provider(
                content_type,
                [this, gen, token](size_t, httplib::DataSink& sink) {
                    // httplib checks that the client is still there before each call.
                    if (!gen->outbox.empty()) {
                        if (!sink.write(gen->outbox.data(), gen->outbox.size())) return false;
                        gen->outbox.clear();
                    }
                    if (gen->complete) {
                        sink.done();
                        return true;
                    }
                    if (gen->mailbox.take(gen->taken, kPollInterval)) {
                        absorb(*gen);
                        if (gen->failure && !gen->complete) {
                            gen->writer->on_failure(*gen->failure, gen->outbox);
                            gen->complete = true;
                        }
                    }
                    return true;
                },
                [this, gen, token](bool) {
                    if (!gen->complete) {  // the client went away: free its sequences and KV blocks now
                        abort_all(*gen);
                        metrics->count_disconnect();
                    }
                });
        } catch (const ApiError& e) {
            if (gen) abort_all(*gen);
            send_error(res, e, anthropic);
        }
    }

    // Non-generation POST endpoints: JSON in, JSON out.
    template <typename Fn>
    void handle_json(const httplib::Request& req, httplib::Response& res, Fn&& fn) {
        const bool anthropic = is_anthropic_path(req.path);
        try {
            const RequestJson body = parse_json_body(req.body);
            res.set_content(to_wire(fn(body)), "application/json");
        } catch (const ApiError& e) {
            send_error(res, e, anthropic);
        }
    }

    void routes() {
        http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
            handle_generation(req, res, ApiKind::chat);
        });
        http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
            handle_generation(req, res, ApiKind::completion);
        });
        http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
            handle_generation(req, res, ApiKind::messages);
        });
        http.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
            handle_json(req, res, [&](const RequestJson& body) { return count_message_tokens(body, ctx); });
        });
        http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
            handle_json(req, res, [&](const RequestJson& body) { return tokenize_response(body, ctx); });
        });
        http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
            handle_json(req, res, [&](const RequestJson& body) { return detokenize_response(body, ctx); });
        });
        http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(to_wire(models_response(ctx, created_unix)), "application/json");
        });
        http.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
            if (req.matches[1] != ctx.model_name) {
                send_error(res, ApiError(404, "invalid_request_error",
                                         fmt::format("The model `{}` does not exist", req.matches[1].str()),
                                         "model", "model_not_found"), false);
                return;
            }
            res.set_content(to_wire(models_response(ctx, created_unix)["data"][0]), "application/json");
        });
        http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
            res.status = draining ? 503 : 200;
            res.set_content(draining ? R"({"status":"draining"})" : R"({"status":"ok"})", "application/json");
        });
        http.Get("/version", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(to_wire({{"version", opt.version}}), "application/json");
        });
        http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(metrics->render(engine.stats()), "text/plain; version=0.0.4; charset=utf-8");
        });

        // Authentication before the body is read: /v1/* and the tokenizer endpoints; /health, /metrics
        // and /version stay open for probes and scrapers.
        http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            const bool protected_path = req.path.starts_with("/v1/") || req.path == "/tokenize" ||
                                        req.path == "/detokenize";
            if (!protected_path) return httplib::Server::HandlerResponse::Unhandled;
            try {
                check_api_key(opt.api_key, req.get_header_value("Authorization"), req.get_header_value("x-api-key"));
            } catch (const ApiError& e) {
                send_error(res, e, is_anthropic_path(req.path));
                return httplib::Server::HandlerResponse::Handled;
            }
            return httplib::Server::HandlerResponse::Unhandled;
        });
        // httplib's own errors (unknown route, oversized or malformed request) in the API's error shape.
        http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            std::string message;
            switch (res.status) {
                case 404: message = fmt::format("Invalid URL ({} {})", req.method, req.path); break;  // OpenAI's wording
                case 413: message = fmt::format("The request body is larger than the {} bytes this server accepts",
                                                opt.max_body_bytes); break;
                default: message = fmt::format("HTTP error {}", res.status); break;
            }
            const ApiError e(res.status, "invalid_request_error", message);
            res.set_content(to_wire(is_anthropic_path(req.path) ? anthropic_error_body(e) : openai_error_body(e)),
                            "application/json");
        });
        http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
            std::string what = "unknown error";
            try {
                std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                what = e.what();
            } catch (...) {
            }
            send_error(res, ApiError(500, "server_error", "Internal server error: " + what), is_anthropic_path(req.path));
        });
        http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
            metrics->count_http(endpoint_label(req.path), res.status);
            if (opt.log_requests) fmt::print(stderr, "{} {} -> {}\n", req.method, req.path, res.status);
        });
    }

    void configure() {
        const int threads = opt.http_threads > 0 ? opt.http_threads : std::max(32, 2 * opt.max_num_seqs + 16);
        http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
        http.set_payload_max_length(opt.max_body_bytes);
        http.set_keep_alive_timeout(opt.keep_alive_timeout_s);
        http.set_keep_alive_max_count(1000);
        http.set_read_timeout(opt.read_timeout_s, 0);
        http.set_write_timeout(opt.write_timeout_s, 0);
        http.set_tcp_nodelay(true);
        routes();
    }
};

HttpServer::HttpServer(HttpServerOptions options, ServingContext context, EngineClient& engine)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(context), engine)) {
    impl_->configure();
}

HttpServer::~HttpServer() = default;

ServerMetrics& HttpServer::metrics() { return *impl_->metrics; }

int HttpServer::bind() {
    Impl& s = *impl_;
    int port = s.opt.port;
    if (port == 0) {
        port = s.http.bind_to_any_port(s.opt.host);
        if (port < 0) fail("cannot listen on {} (any port): {}", s.opt.host, std::strerror(errno));
    } else if (!s.http.bind_to_port(s.opt.host, port)) {
        fail("cannot listen on {}:{}: {}", s.opt.host, port, std::strerror(errno));
    }
    s.http.raise_backlog(kListenBacklog);
    return port;
}

void HttpServer::serve() {
    Impl& s = *impl_;
    s.serving = true;
    if (!s.draining) s.http.listen_after_bind();
    s.serve_done = true;
}

void HttpServer::drain() {
    Impl& s = *impl_;
    std::call_once(s.drain_once, [&] {
        s.draining = true;  // from here on, new generation requests get 503
        s.engine.drain(s.opt.drain_timeout_s);
        // Every request has finished or been aborted; let the HTTP threads write their last bytes.
        {
            std::unique_lock lock(s.active_mutex);
            s.active_cv.wait_for(lock, std::chrono::seconds(s.opt.write_timeout_s + 1), [&] { return s.active == 0; });
        }
        // stop() closes the listener; serve() returns once the workers have closed their connections.
        // Repeat until then in case serve() was just entering listen.
        while (s.serving && !s.serve_done) {
            s.http.stop();
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    });
}

void block_termination_signals() {
    std::signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int serve_until_signalled(HttpServer& server) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    std::atomic<bool> serve_returned{false}, drained{false};
    std::thread watcher([&] {
        while (!serve_returned) {
            timespec wait{0, 200'000'000};
            const int sig = sigtimedwait(&set, nullptr, &wait);
            if (sig == SIGTERM || sig == SIGINT) {
                fmt::print(stderr, "scr serve: {} received: draining in-flight requests\n",
                           sig == SIGTERM ? "SIGTERM" : "SIGINT");
                server.drain();
                drained = true;
                return;
            }
        }
    });
    server.serve();
    serve_returned = true;
    watcher.join();
    if (drained) fmt::print(stderr, "scr serve: drained, exiting\n");
    return drained ? 0 : 1;
}

}  // namespace scr::server
