// The HTTP glue: cpp-httplib routes -> the protocol layer (protocol.hpp) and the engine
// (engine_client.hpp). Each generation request is served by one HTTP worker thread, which submits
// to the engine, then waits on the request's mailbox and writes what arrives; the engine thread only
// posts into mailboxes. A client that goes away mid-response is noticed between tokens and its
// engine requests are aborted at once, freeing their KV blocks. See docs/SERVER.md.
#pragma once

#include <memory>
#include <string>

#include "server/engine_client.hpp"
#include "server/metrics.hpp"
#include "server/protocol.hpp"

namespace scr::server {

struct HttpServerOptions {
    std::string host = "127.0.0.1";
    int port = 8000;                      // 0: any free port (bind() returns it)
    std::string api_key;                  // empty: no authentication
    size_t max_body_bytes = 16u << 20;    // larger bodies get 413
    int http_threads = 0;                 // 0: enough for every sequence to stream plus idle connections
    int max_num_seqs = 64;                // sizes the default thread count
    int keep_alive_timeout_s = 5;
    int read_timeout_s = 30;              // a client must send its request within this
    int write_timeout_s = 30;             // a client that reads nothing for this long is dropped
    double drain_timeout_s = 30;          // SIGTERM: time in-flight requests get to finish
    std::string version = "0.0.0";
    bool log_requests = false;
};

class HttpServer {
public:
    HttpServer(HttpServerOptions options, ServingContext context, EngineClient& engine);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Binds the listening socket; returns the port. Throws scr::Error when the address is unusable.
    int bind();
    // Accepts and serves until drain() completes.
    void serve();
    // Graceful stop, callable from any thread (idempotent): new work is refused (503), in-flight
    // requests get drain_timeout_s to finish (then the engine aborts them and clients get an error
    // event), responses are flushed, the listener and idle connections close and serve() returns.
    void drain();

    ServerMetrics& metrics();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// For a server's main(): ignore SIGPIPE and block SIGTERM/SIGINT in this thread and every thread it
// starts later (call before starting any), so they are taken only by serve_until_signalled.
void block_termination_signals();
// Serves until SIGTERM or SIGINT, then drains. Returns 0 after a clean drain.
int serve_until_signalled(HttpServer& server);

}  // namespace scr::server
