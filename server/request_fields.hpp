// Typed, named access to the fields of one JSON request object (internal to the protocol layer).
// Each accessor marks its key as known; reject_unknown() then refuses whatever the client sent that
// no accessor asked for, as OpenAI does ("Unrecognized request argument supplied").
// JSON null counts as absent, as in OpenAI's API.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.hpp"

namespace scr::server {

class RequestFields {
public:
    // `path` prefixes field names in errors, e.g. "stream_options." or "messages[2].".
    RequestFields(const nlohmann::ordered_json& object, std::string path = {});

    const nlohmann::ordered_json* get(std::string_view key);  // nullptr when absent or null
    std::optional<double> number(std::string_view key, double lo, double hi);
    std::optional<int64_t> integer(std::string_view key, int64_t lo, int64_t hi);
    std::optional<bool> boolean(std::string_view key);
    std::optional<std::string> string(std::string_view key);
    const nlohmann::ordered_json* object(std::string_view key);
    const nlohmann::ordered_json* array(std::string_view key);

    // Accepted and without effect here (e.g. "user", "metadata").
    void ignore(std::initializer_list<std::string_view> keys);
    // Known but not supported by this server: 400 if present and not null.
    void reject(std::string_view key, std::string_view why);
    void reject_unknown() const;

    std::string name(std::string_view key) const { return path_ + std::string(key); }

private:
    const nlohmann::ordered_json& object_;
    std::string path_;
    std::vector<std::string> known_;
};

}  // namespace scr::server
