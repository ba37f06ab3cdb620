// One exception type for every user-facing failure: a message that names the problem
// (file, tensor, key, request field). The CLI prints it and exits non-zero; the server maps it
// to an HTTP status.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace scr {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
    throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace scr
