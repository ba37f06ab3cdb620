// Fuzz entry point for the HTTP request parser (built as a libFuzzer target with -DSCR_FUZZ=ON and
// clang; tests/server/test_fuzz_bodies.cpp runs the same function over mutated bodies under CTest).
#include "tests/server/fuzz_request.hpp"

#include <fmt/format.h>

#include <stdexcept>

#include "server/protocol.hpp"
#include "tests/server/fake_model.hpp"

namespace scr::server::testing {

namespace {

const ServingContext& fuzz_context() {
    static const ByteText text;
    static const ServingContext ctx = [] {
        ServingContext c;
        c.model_name = "scripted";
        c.max_model_len = 512;
        c.max_n = 8;
        c.tool_format = ToolCallFormat::hermes;
        c.end_of_turn_ids = {ByteText::kEos};
        c.text = &text;
        return c;
    }();
    return ctx;
}

// Runs a parsed job's response writer over made-up engine news, checking the non-stream body parses.
void exercise_writer(const GenerationJob& job, const ServingContext& ctx, uint8_t seed) {
    auto writer = make_response_writer(job, ctx, "fuzz-1", 0);
    std::string out;
    for (int i = 0; i < job.num_choices(); ++i) {
        ChoiceDelta d;
        d.text = seed & 1 ? "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>" : "hello \"world\"\n";
        d.token_ids = {5, 6};
        if (job.params.logprobs >= 0) d.logprobs = {{5, -0.1f, {{5, -0.1f}}}, {6, -0.2f, {}}};
        d.num_prompt_tokens = int(job.prompts[size_t(i / job.params.n)].size());
        d.num_output_tokens = 2;
        d.has_news = true;
        writer->on_delta(i, d, out);
        d.clear();
        d.finish = seed & 2 ? FinishReason::length : FinishReason::stop;
        d.has_news = true;
        writer->on_delta(i, d, out);
    }
    writer->on_complete(out);
    if (!job.stream && nlohmann::json::parse(out, nullptr, false).is_discarded())
        throw std::logic_error("non-stream response is not JSON: " + out);
}

}  // namespace

bool fuzz_one_request(const uint8_t* data, size_t size) {
    if (size == 0) return false;
    const ServingContext& ctx = fuzz_context();
    const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
        const RequestJson j = parse_json_body(body);
        switch (data[0] % 6) {
            case 0: exercise_writer(parse_chat_request(j, ctx), ctx, data[0]); break;
            case 1: exercise_writer(parse_completion_request(j, ctx), ctx, data[0]); break;
            case 2: exercise_writer(parse_messages_request(j, ctx), ctx, data[0]); break;
            case 3: tokenize_response(j, ctx); break;
            case 4: detokenize_response(j, ctx); break;
            default: count_message_tokens(j, ctx); break;
        }
        return true;
    } catch (const ApiError& e) {
        if (e.status < 400 || e.status >= 500)
            throw std::logic_error(fmt::format("status {} for a client error: {}", e.status, e.what()));
        return false;
    }
}

}  // namespace scr::server::testing

#ifdef SCR_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    (void)scr::server::testing::fuzz_one_request(data, size);  // an escaping exception aborts: a finding
    return 0;
}
#endif
