// Errors the HTTP API reports to clients: an HTTP status plus OpenAI's error object
// {"error": {"message", "type", "param", "code"}} (Anthropic's shape for /v1/messages).
// Protocol code throws ApiError; the HTTP glue turns it into a response. Nothing here knows sockets.
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace scr::server {

struct ApiError : std::runtime_error {
    int status;
    std::string type;   // OpenAI: invalid_request_error, authentication_error, not_found_error, server_error
    std::string param;  // the request field at fault, "" when none
    std::string code;   // machine-readable reason, "" when none

    ApiError(int status, std::string type, const std::string& message, std::string param = {},
             std::string code = {})
        : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
          code(std::move(code)) {}

    // 400 for a field that is missing, of the wrong type, or out of range.
    static ApiError invalid(const std::string& param, const std::string& message,
                            std::string code = "invalid_value") {
        return ApiError(400, "invalid_request_error", message, param, std::move(code));
    }
    static ApiError unsupported(const std::string& param, const std::string& message) {
        return ApiError(400, "invalid_request_error", message, param, "unsupported_parameter");
    }
};

// {"error": {...}} as OpenAI sends it; null param/code when empty.
nlohmann::json openai_error_body(const ApiError& e);
// {"type": "error", "error": {"type", "message"}} as Anthropic sends it; the type is mapped from the
// HTTP status (invalid_request_error, authentication_error, not_found_error, ...).
nlohmann::json anthropic_error_body(const ApiError& e);

// JSON text for the wire. Model text is valid UTF-8 by the engine's contract; token pieces of
// partial characters may not be, so invalid bytes become U+FFFD instead of throwing.
std::string to_wire(const nlohmann::json& j);

}  // namespace scr::server
