// The CUDA target's A/B switches read from the environment (host code, shared by every kernel header).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

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

// One switch with named values (e.g. SCR_CUDA_MOE_GEMM=0 | 1 | mma): unset or empty gives `fallback`
// quietly; one of `choices`' texts gives its value; anything else is named on stderr with the texts
// allowed and gives `fallback` (called `fallback_name`), never a silent guess.
template <class T>
T env_choice_switch(const char* name, T fallback, std::initializer_list<std::pair<const char*, std::type_identity_t<T>>> choices,
                    const char* fallback_name) {
    const char* e = std::getenv(name);
    if (!e || !*e) return fallback;
    std::string allowed;
    for (const auto& [text, value] : choices) {
        if (std::strcmp(e, text) == 0) return value;
        allowed += (allowed.empty() ? "" : ", ") + std::string(text);
    }
    std::fprintf(stderr, "scr: %s=%s is not one of %s; using %s\n", name, e, allowed.c_str(), fallback_name);
    return fallback;
}

// An on / off switch: 0 or 1, else as env_choice_switch.
inline bool env_flag_switch(const char* name, bool fallback) {
    return env_choice_switch(name, fallback, {{"0", false}, {"1", true}}, fallback ? "1" : "0");
}

// SCR_CUDA_PREFILL (A/B runs): the GEMM above the decode regime; read by the kernels (linear.cuh)
// and the cuBLASLt wrapper (runtime/cuda/prefill_gemm.cu), once per process.
enum class PrefillGemm { cublaslt, mma, wmma };
inline PrefillGemm prefill_gemm_choice() {
    static const PrefillGemm v = env_choice_switch(
        "SCR_CUDA_PREFILL", PrefillGemm::cublaslt,
        {{"cublaslt", PrefillGemm::cublaslt}, {"mma", PrefillGemm::mma}, {"wmma", PrefillGemm::wmma}}, "cublaslt");
    return v;
}

}  // namespace scr::kernels::cuda
