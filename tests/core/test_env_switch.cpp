// The CUDA target's integer A/B switches (kernels/cuda/env_switch.hpp, host code only): a value is
// taken only when it is a whole decimal number the switch allows; anything else is named on stderr
// and gives the default, never a silent 0 (atoi's reading of "abc").
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cuda/env_switch.hpp"

namespace {

using scr::kernels::cuda::env_int_switch;

constexpr const char* kName = "SCR_TEST_ENV_INT_SWITCH";
const auto kOneToEight = [](long long n) { return n >= 1 && n <= 8; };

// The switch read with `value` set (null: unset), and what it wrote to stderr.
std::pair<long long, std::string> read_with(const char* value, const char* fallback_name = nullptr) {
    if (value) setenv(kName, value, 1);
    else unsetenv(kName);
    testing::internal::CaptureStderr();
    const long long v = env_int_switch(kName, 5, kOneToEight, "1 to 8", fallback_name);
    const std::string err = testing::internal::GetCapturedStderr();
    unsetenv(kName);
    return {v, err};
}

TEST(EnvIntSwitch, UnsetOrEmptyGivesTheDefaultQuietly) {
    for (const char* value : {static_cast<const char*>(nullptr), ""}) {
        const auto [v, err] = read_with(value);
        EXPECT_EQ(v, 5);
        EXPECT_EQ(err, "");
    }
}

TEST(EnvIntSwitch, AnAllowedNumberIsTaken) {
    for (const auto& [text, want] : {std::pair{"1", 1LL}, {"8", 8LL}, {"3", 3LL}}) {
        const auto [v, err] = read_with(text);
        EXPECT_EQ(v, want) << text;
        EXPECT_EQ(err, "") << text;
    }
}

TEST(EnvIntSwitch, AnythingElseIsNamedAndGivesTheDefault) {
    // Not a number, trailing text, out of the allowed range, out of long long's range, blank.
    for (const char* text : {"abc", "4x", "0", "9", "-3", "99999999999999999999999", " ", "2.5"}) {
        const auto [v, err] = read_with(text);
        EXPECT_EQ(v, 5) << text;
        EXPECT_NE(err.find(std::string(kName) + "=" + text), std::string::npos) << "not named: " << err;
        EXPECT_NE(err.find("is not 1 to 8; using 5"), std::string::npos) << err;
    }
}

TEST(EnvIntSwitch, TheDefaultCanBeNamedInWords) {
    const auto [v, err] = read_with("12", "the rule");
    EXPECT_EQ(v, 5);
    EXPECT_NE(err.find("using the rule"), std::string::npos) << err;
}

}  // namespace
