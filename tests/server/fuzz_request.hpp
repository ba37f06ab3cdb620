// One fuzz input through the request side and the response side of the protocol layer: the first
// byte picks the endpoint, the rest is the body. Anything other than success or an ApiError with a
// 4xx status is a bug: the function aborts (libFuzzer) or throws std::logic_error (GoogleTest).
#pragma once

#include <cstddef>
#include <cstdint>

namespace scr::server::testing {
// Returns true when the request was accepted, false when it got a 4xx ApiError.
bool fuzz_one_request(const uint8_t* data, size_t size);
}
