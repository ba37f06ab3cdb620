// Where the engine thread leaves one HTTP request's outputs and the request's HTTP thread picks them
// up. The engine side only merges into per-choice buffers under a short lock and signals, so a slow
// client never holds up the engine loop, and a slow reader gets fewer, larger chunks instead of an
// ever-growing queue. Buffers are swapped, not copied, so steady-state streaming does not allocate.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "server/protocol.hpp"

namespace scr::server {

class RequestMailbox {
public:
    explicit RequestMailbox(int num_choices) : pending_(size_t(num_choices)) {}

    // Engine thread.
    void post(int choice, const RequestOutput& out) {
        {
            std::lock_guard lock(mutex_);
            pending_.at(size_t(choice)).merge(out);
            has_news_ = true;
        }
        news_.notify_one();
    }

    // HTTP thread: waits up to `timeout` for news; then `taken` holds each choice's news since the last
    // take (has_news false for choices with none). Returns false when nothing arrived.
    bool take(std::vector<ChoiceDelta>& taken, std::chrono::milliseconds timeout) {
        std::unique_lock lock(mutex_);
        if (!news_.wait_for(lock, timeout, [&] { return has_news_; })) return false;
        taken.resize(pending_.size());
        for (size_t i = 0; i < pending_.size(); ++i) {
            taken[i].clear();
            std::swap(taken[i], pending_[i]);
        }
        has_news_ = false;
        return true;
    }

private:
    std::mutex mutex_;
    std::condition_variable news_;
    std::vector<ChoiceDelta> pending_;
    bool has_news_ = false;
};

}  // namespace scr::server
