#pragma once

#include <string>

#include "compiler/dsl/ast.hpp"

namespace scr::dsl {

// Throws scr::Error "file:line:col: expected X, found Y" on a syntax error.
Program parse(const std::string& file, const std::string& source);
Program parse_file(const std::string& path);

}  // namespace scr::dsl
