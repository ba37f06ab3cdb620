// The CUDA target's A/B switches read from the environment (host code, shared by every kernel header).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace scr::kernels::cuda {

// One integer switch from the environment (the SCR_CUDA_* A/B switches): unset or empty gives
// `fallback`; a value that is not a whole decimal number or that `valid` refuses is named on stderr
// with what is allowed (`allowed`, e.g. "1 to 8") and gives `fallback` too, never a silent guess.
// `fallback_name` says what the fallback means where its number would not (e.g. "the rule").
template <class Valid>
long long env_int_switch(const char* name, long long fallback, Valid valid, const char* allowed, const char* fallback_name = nullptr) {
    const char* e = std::getenv(name);
    if (!e || !*e) return fallback;
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(e, &end, 10);
    if (end != e && *end == '\0' && errno == 0 && valid(n)) return n;
    if (fallback_name) std::fprintf(stderr, "scr: %s=%s is not %s; using %s\n", name, e, allowed, fallback_name);
    else std::fprintf(stderr, "scr: %s=%s is not %s; using %lld\n", name, e, allowed, fallback);
    return fallback;
}

}  // namespace scr::kernels::cuda
