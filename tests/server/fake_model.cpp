#include "tests/server/fake_model.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/core/error.hpp"

namespace scr::server::testing {

using nlohmann::json;

std::vector<int32_t> ByteText::encode(std::string_view text, bool add_special_tokens) const {
    std::vector<int32_t> ids;
    if (add_special_tokens) ids.push_back(kBos);
    for (unsigned char c : text) ids.push_back(int32_t(c) + kOffset);
    return ids;
}

std::string ByteText::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
    std::string text;
    for (int32_t id : ids) {
        if (id == kBos || id == kEos) {
            if (!skip_special_tokens) text += id == kBos ? "<bos>" : "<eos>";
        } else if (id >= kOffset && id < vocab_size()) {
            text += char(id - kOffset);
        }
    }
    return text;
}

std::string ByteText::render_chat(const nlohmann::ordered_json& context) const {
    std::string out;
    if (context.contains("tools") && !context["tools"].empty()) out += "<|tools|>" + context["tools"].dump() + "\n";
    if (context.contains("enable_thinking") && context["enable_thinking"] == false) out += "<|no_think|>\n";
    const auto& messages = context.at("messages");
    for (size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (m["role"] == "system" && i > 0) throw scr::Error("System message must come first");
        out += fmt::format("<|{}|>{}", m["role"].get<std::string>(), m["content"].get<std::string>());
        if (m.contains("tool_calls"))
            for (const auto& call : m["tool_calls"]) out += "<tool_call>" + call["function"].dump() + "</tool_call>";
        out += "\n";
    }
    if (context.contains("add_generation_prompt") && context["add_generation_prompt"] == true) out += "<|assistant|>";
    return out;
}

ScriptedEngine::ScriptedEngine(ScriptedEngineConfig config) : config_(std::move(config)) {
    stats_.kv_blocks_total = stats_.kv_blocks_free = config_.kv_blocks;
    thread_ = std::thread([this] { loop(); });
}

ScriptedEngine::~ScriptedEngine() {
    stop_ = true;
    thread_.join();
}

void ScriptedEngine::submit(Request request, OutputCallback on_output) {
    std::lock_guard lock(mutex_);
    if (draining_) fail("engine is draining");
    if (request.prompt_ids.empty()) fail("empty prompt");
    if (int(request.prompt_ids.size()) >= config_.max_model_len)
        fail("prompt of {} tokens does not fit the context of {}", request.prompt_ids.size(), config_.max_model_len);
    if (live_.count(request.id)) fail("duplicate request id {}", request.id);
    submitted_.push_back(request);

    // The script: what follows the last "say:" in the prompt, up to the end of its line.
    ByteText text;
    const std::string prompt = text.decode(request.prompt_ids, true);
    std::string script = config_.default_script;
    if (const size_t at = prompt.rfind("say:"); at != std::string::npos) {
        script = prompt.substr(at + 4);
        if (!script.empty() && script[0] == ' ') script.erase(0, 1);
        script = script.substr(0, script.find('\n'));
    }
    Live live;
    live.samples.resize(size_t(request.params.n));
    for (auto& s : live.samples) s.script = script;
    live.on_output = std::move(on_output);
    const std::string id = request.id;
    live.request = std::move(request);
    live_.emplace(id, std::move(live));
    order_.push_back(id);
}

void ScriptedEngine::abort(const std::string& request_id) {
    std::lock_guard lock(mutex_);
    if (auto it = live_.find(request_id); it != live_.end()) it->second.aborted = true;
}

EngineStats ScriptedEngine::stats() const {
    std::lock_guard lock(mutex_);
    EngineStats s = stats_;
    s.num_running = s.num_waiting = 0;
    for (const auto& [id, live] : live_) (live.running ? s.num_running : s.num_waiting)++;
    return s;
}

std::vector<Request> ScriptedEngine::submitted() const {
    std::lock_guard lock(mutex_);
    return submitted_;
}

void ScriptedEngine::drain(double timeout_seconds) {
    std::unique_lock lock(mutex_);
    draining_ = true;
    const bool finished = idle_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                                         [&] { return live_.empty(); });
    if (finished) return;
    for (auto& [id, live] : live_) live.aborted = true;
    idle_.wait(lock, [&] { return live_.empty(); });
}

int64_t ScriptedEngine::blocks_for(const Live& live, const Sample&) const {
    return (int64_t(live.request.prompt_ids.size()) + live.request.params.max_tokens + 15) / 16;
}

void ScriptedEngine::loop() {
    while (!stop_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(config_.step_ms));
        std::vector<std::pair<OutputCallback, RequestOutput>> outputs;
        bool idle;
        {
            std::lock_guard lock(mutex_);
            step_locked(outputs);
            idle = live_.empty();
        }
        for (auto& [callback, out] : outputs) callback(out);  // on the engine thread, no lock held
        if (idle) idle_.notify_all();
    }
}

void ScriptedEngine::finish_sample(Live& live, Sample& s, int index, FinishReason reason, std::string stop_reason,
                                   std::vector<std::pair<OutputCallback, RequestOutput>>& outputs) {
    s.done = true;
    stats_.kv_blocks_free += s.blocks;
    s.blocks = 0;
    RequestOutput out;
    out.request_id = live.request.id;
    out.index = index;
    out.new_text = s.text.substr(s.emitted);
    s.emitted = s.text.size();
    out.finish_reason = reason;
    out.stop_reason = std::move(stop_reason);
    out.num_prompt_tokens = int(live.request.prompt_ids.size());
    out.num_output_tokens = s.num_tokens;
    outputs.emplace_back(live.on_output, std::move(out));
}

void ScriptedEngine::step_locked(std::vector<std::pair<OutputCallback, RequestOutput>>& outputs) {
    if (!live_.empty()) ++stats_.steps;  // steps that ran something, as an engine counts them
    int running = 0;
    for (auto it = order_.begin(); it != order_.end();) {
        Live& live = live_.at(*it);
        const SamplingParams& p = live.request.params;
        if (live.aborted) {
            for (size_t i = 0; i < live.samples.size(); ++i)
                if (!live.samples[i].done)
                    finish_sample(live, live.samples[i], int(i), FinishReason::abort, "", outputs);
            ++stats_.requests_aborted;
            live_.erase(*it);
            it = order_.erase(it);
            continue;
        }
        if (!live.running) {  // admit when a slot and the KV blocks for the whole request are free
            const int64_t need = blocks_for(live, live.samples[0]) * int64_t(live.samples.size());
            if (running >= config_.max_num_seqs || need > stats_.kv_blocks_free) {
                ++it;
                continue;
            }
            live.running = true;
            stats_.kv_blocks_free -= need;
            for (auto& s : live.samples) s.blocks = blocks_for(live, s);
            stats_.prompt_tokens += int64_t(live.request.prompt_ids.size());
            stats_.prefix_cache_queries += int64_t(live.request.prompt_ids.size());
        }
        ++running;
        size_t max_stop = 0;
        for (const auto& stop : p.stop) max_stop = std::max(max_stop, stop.size());
        bool all_done = true;
        for (size_t i = 0; i < live.samples.size(); ++i) {
            Sample& s = live.samples[i];
            if (s.done) continue;
            const bool at_end = s.next_byte >= s.script.size() && !p.ignore_eos;
            const int32_t token = at_end || s.script.empty()
                                      ? ByteText::kEos
                                      : int32_t((unsigned char)s.script[s.next_byte++ % s.script.size()]) +
                                            ByteText::kOffset;
            ++s.num_tokens;
            ++stats_.generation_tokens;
            if (token != ByteText::kEos) s.text += char(token - ByteText::kOffset);

            FinishReason finish = FinishReason::none;
            std::string stop_reason;
            if (token == ByteText::kEos) {
                finish = FinishReason::stop;
            } else if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end()) {
                finish = FinishReason::stop;
                stop_reason = std::to_string(token);
            }
            for (const auto& stop : p.stop) {
                const size_t from = s.emitted > stop.size() ? s.emitted - stop.size() : 0;
                if (const size_t at = s.text.find(stop, from); at != std::string::npos) {
                    s.text.resize(p.include_stop_str_in_output ? at + stop.size() : at);
                    finish = FinishReason::stop;
                    stop_reason = stop;
                    break;
                }
            }
            if (finish == FinishReason::none && s.num_tokens >= p.max_tokens) finish = FinishReason::length;

            RequestOutput out;
            out.request_id = live.request.id;
            out.index = int(i);
            out.new_token_ids = {token};
            if (p.logprobs >= 0) {
                TokenLogprob lp{token, -0.5f, {}};
                for (int k = 0; k < p.logprobs; ++k) lp.top.emplace_back((token + k) % 258, -0.5f - float(k));
                out.logprobs.push_back(std::move(lp));
            }
            out.num_prompt_tokens = int(live.request.prompt_ids.size());
            out.num_output_tokens = s.num_tokens;
            if (finish != FinishReason::none) {
                s.done = true;
                stats_.kv_blocks_free += s.blocks;
                s.blocks = 0;
                out.new_text = s.text.substr(std::min(s.emitted, s.text.size()));
                s.emitted = s.text.size();
                out.finish_reason = finish;
                out.stop_reason = stop_reason;
            } else {
                // Hold back what a stop string might still claim, and never split a UTF-8 character.
                size_t safe = s.text.size();
                if (max_stop > 1) safe = safe >= max_stop - 1 ? safe - (max_stop - 1) : 0;
                while (safe > s.emitted && safe < s.text.size() && (s.text[safe] & 0xC0) == 0x80) --safe;
                if (safe > s.emitted) {
                    out.new_text = s.text.substr(s.emitted, safe - s.emitted);
                    s.emitted = safe;
                }
                all_done = false;
            }
            outputs.emplace_back(live.on_output, std::move(out));
        }
        if (all_done) {
            ++stats_.requests_finished;
            live_.erase(*it);
            it = order_.erase(it);
        } else {
            ++it;
        }
    }
}

}  // namespace scr::server::testing
