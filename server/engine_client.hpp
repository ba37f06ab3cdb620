// The slice of AsyncEngine the HTTP server drives. The server talks to this interface so its glue can
// also run over a scripted engine in tests (tests/server/fake_engine.hpp); `scr serve` passes the real
// AsyncEngine through AsyncEngineClient.
#pragma once

#include <string>

#include "runtime/engine/engine.hpp"

namespace scr::server {

class EngineClient {
public:
    virtual ~EngineClient() = default;
    // Thread-safe. Throws scr::Error for a request the engine cannot serve. The callback runs on the
    // engine thread and must not block.
    virtual void submit(Request request, OutputCallback on_output) = 0;
    virtual void abort(const std::string& request_id) = 0;
    virtual EngineStats stats() const = 0;
    // Stop taking requests; wait up to timeout for in-flight ones, then abort the rest.
    virtual void drain(double timeout_seconds) = 0;
};

class AsyncEngineClient final : public EngineClient {
public:
    explicit AsyncEngineClient(AsyncEngine& engine) : engine_(engine) {}
    void submit(Request request, OutputCallback on_output) override {
        engine_.submit(std::move(request), std::move(on_output));
    }
    void abort(const std::string& request_id) override { engine_.abort(request_id); }
    EngineStats stats() const override { return engine_.stats(); }
    void drain(double timeout_seconds) override { engine_.drain(timeout_seconds); }

private:
    AsyncEngine& engine_;
};

}  // namespace scr::server
