// Test doubles for the server's two seams, so the HTTP layer is tested without a model:
//   ByteText: a byte-level tokenizer (token = byte + 2; 0 = <bos>, 1 = <eos>) and a tiny chat template.
//   ScriptedEngine: an EngineClient with its own loop thread that "generates" a script: the text after
//     the last "say:" in the prompt (up to the end of that line), else a fixed sentence repeated; one
//     token per step per sample, then <eos>. It honours max_tokens, stop strings, stop_token_ids,
//     ignore_eos, n, logprobs and abort, and accounts KV blocks like a paged engine (16 tokens per
//     block, held until finish or abort) so leak checks mean something.
// The end-to-end tests against the real engine live in tests/server/node (run with `scr serve`).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "server/engine_client.hpp"
#include "server/protocol.hpp"

namespace scr::server::testing {

class ByteText final : public TextFrontend {
public:
    static constexpr int32_t kBos = 0, kEos = 1, kOffset = 2;
    std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
    std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
    // "<|system|>...\n<|user|>...\n" ... "<|assistant|>"; tools as "<|tools|>[json]\n". Throws scr::Error
    // when a system message is not first (as many real templates do).
    std::string render_chat(const nlohmann::ordered_json& context) const override;
    int vocab_size() const override { return 256 + kOffset; }
};

struct ScriptedEngineConfig {
    int step_ms = 1;             // wall time of one engine step
    int max_num_seqs = 64;       // requests running at once; the rest wait
    int max_model_len = 4096;
    int64_t kv_blocks = 4096;    // 16 tokens each
    std::string default_script = "the quick brown fox jumps over the lazy dog. ";
};

class ScriptedEngine final : public EngineClient {
public:
    explicit ScriptedEngine(ScriptedEngineConfig config = {});
    ~ScriptedEngine() override;

    void submit(Request request, OutputCallback on_output) override;
    void abort(const std::string& request_id) override;
    EngineStats stats() const override;
    void drain(double timeout_seconds) override;

    // Requests submitted so far (tests check what the server asked for).
    std::vector<Request> submitted() const;

private:
    struct Sample {
        std::string script;       // what this sample will say
        size_t next_byte = 0;
        std::string text;         // generated so far
        size_t emitted = 0;       // bytes of `text` already sent
        int num_tokens = 0;
        bool done = false;
        int64_t blocks = 0;
    };
    struct Live {
        Request request;
        OutputCallback on_output;
        std::vector<Sample> samples;
        bool aborted = false;
        bool running = false;
    };

    void loop();
    void step_locked(std::vector<std::pair<OutputCallback, RequestOutput>>& outputs);
    void finish_sample(Live& live, Sample& s, int index, FinishReason reason, std::string stop_reason,
                       std::vector<std::pair<OutputCallback, RequestOutput>>& outputs);
    int64_t blocks_for(const Live& live, const Sample& s) const;

    ScriptedEngineConfig config_;
    mutable std::mutex mutex_;
    std::condition_variable idle_;
    std::map<std::string, Live> live_;
    std::deque<std::string> order_;
    std::vector<Request> submitted_;
    EngineStats stats_;
    bool draining_ = false;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace scr::server::testing
