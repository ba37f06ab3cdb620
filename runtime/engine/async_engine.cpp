// AsyncEngine: the Engine loop on its own thread. submit/abort/stats/drain may be called from any
// thread; they only touch the inbox under a mutex. Outputs are delivered on the engine thread.
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "runtime/core/error.hpp"
#include "runtime/engine/engine.hpp"

namespace scr {

struct AsyncEngine::Impl {
    Engine engine;
    std::mutex mu;
    std::condition_variable wake;      // the loop waits on it for work
    std::condition_variable progress;  // drain waits on it
    std::vector<std::pair<Request, OutputCallback>> inbox;
    std::vector<std::string> aborts;
    bool abort_everything = false;
    bool accepting = true;
    bool stopping = false;
    bool idle = true;                  // nothing queued, nothing unfinished (as of the last loop)
    EngineStats snapshot;
    std::thread thread;

    Impl(CompiledModel& model, const text::Tokenizer* tok, EngineConfig cfg) : engine(model, tok, cfg) {
        snapshot = engine.stats();
        thread = std::thread([this] { loop(); });
    }

    void loop() {
        std::vector<std::pair<Request, OutputCallback>> new_requests;
        std::vector<std::string> new_aborts;
        for (;;) {
            bool abort_all = false, stop = false;
            {
                std::unique_lock lock(mu);
                wake.wait(lock, [&] {
                    return stopping || !inbox.empty() || !aborts.empty() || abort_everything ||
                           engine.has_unfinished();
                });
                new_requests.swap(inbox);
                new_aborts.swap(aborts);
                abort_all = abort_everything;
                abort_everything = false;
                stop = stopping;
            }
            for (auto& [req, cb] : new_requests) {
                const std::string id = req.id;
                try {
                    engine.add_request(std::move(req), cb);
                } catch (const std::exception& e) {  // e.g. a duplicate id, found only here
                    RequestOutput out;
                    out.request_id = id;
                    out.finish_reason = FinishReason::error;
                    out.error = e.what();
                    cb(out);
                }
            }
            new_requests.clear();
            for (auto& id : new_aborts) engine.abort(id);
            new_aborts.clear();
            if (abort_all || stop) engine.abort_all();
            if (!stop && engine.has_unfinished()) {
                try {
                    engine.step();
                } catch (const std::exception& e) {  // a throwing callback must not kill the server
                    std::fprintf(stderr, "AsyncEngine: step failed: %s\n", e.what());
                }
            }
            {
                std::lock_guard lock(mu);
                snapshot = engine.stats();
                idle = inbox.empty() && !engine.has_unfinished();
            }
            progress.notify_all();
            if (stop) return;
        }
    }
};

AsyncEngine::AsyncEngine(CompiledModel& model, const text::Tokenizer* tokenizer, EngineConfig config)
    : impl_(std::make_unique<Impl>(model, tokenizer, config)) {}

AsyncEngine::~AsyncEngine() {
    {
        std::lock_guard lock(impl_->mu);
        impl_->stopping = true;
    }
    impl_->wake.notify_all();
    impl_->thread.join();
}

void AsyncEngine::submit(Request request, OutputCallback on_output) {
    impl_->engine.validate(request);  // const and thread-safe: errors reach the caller
    {
        std::lock_guard lock(impl_->mu);
        if (!impl_->accepting) fail("request {}: the engine is draining and takes no new requests", request.id);
        impl_->inbox.emplace_back(std::move(request), std::move(on_output));
        impl_->idle = false;
    }
    impl_->wake.notify_all();
}

void AsyncEngine::abort(const std::string& request_id) {
    {
        std::lock_guard lock(impl_->mu);
        impl_->aborts.push_back(request_id);
    }
    impl_->wake.notify_all();
}

EngineStats AsyncEngine::stats() const {
    std::lock_guard lock(impl_->mu);
    return impl_->snapshot;
}

void AsyncEngine::drain(double timeout_seconds) {
    std::unique_lock lock(impl_->mu);
    impl_->accepting = false;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(std::max(0.0, timeout_seconds)));
    if (!impl_->progress.wait_until(lock, deadline, [&] { return impl_->idle; })) {
        impl_->abort_everything = true;
        impl_->wake.notify_all();
        impl_->progress.wait(lock, [&] { return impl_->idle; });
    }
}

}  // namespace scr
