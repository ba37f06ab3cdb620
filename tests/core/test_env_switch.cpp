// The CUDA target's integer A/B switches (kernels/cuda/env_switch.hpp, host code only): a value is
// taken only when it is a whole decimal number the switch allows; anything else is named on stderr
// and gives the default, never a silent 0 (atoi's reading of "abc").
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cuda/env_switch.hpp"

namespace {

using scr::kernels::cuda::env_choice_switch;
using scr::kernels::cuda::env_flag_switch;
using scr::kernels::cuda::env_int_switch;

constexpr const char* kName = "SCR_TEST_ENV_INT_SWITCH";
const auto kOneToEight = [](long long n) { return n >= 1 && n <= 8; };

// What `read()` returns with kName set to `value` (null: unset), and what it wrote to stderr.
template <class Read>
auto read_env_with(const char* value, Read read) {
    if (value) setenv(kName, value, 1);
    else unsetenv(kName);
    testing::internal::CaptureStderr();
    const auto v = read();
    const std::string err = testing::internal::GetCapturedStderr();
    unsetenv(kName);
    return std::pair{v, err};
}

std::pair<long long, std::string> read_with(const char* value, const char* fallback_name = nullptr) {
    return read_env_with(value, [&] { return env_int_switch(kName, 5, kOneToEight, "1 to 8", fallback_name); });
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

// Named-value switches (SCR_CUDA_MOE_GEMM=0 | 1 | mma and the like).
enum class Form { kRule, kOff, kOn, kMma };

std::pair<Form, std::string> choose_with(const char* value) {
    return read_env_with(value, [] {
        return env_choice_switch(kName, Form::kRule, {{"0", Form::kOff}, {"1", Form::kOn}, {"mma", Form::kMma}}, "the row rule");
    });
}

TEST(EnvChoiceSwitch, UnsetOrEmptyGivesTheDefaultQuietly) {
    for (const char* value : {static_cast<const char*>(nullptr), ""}) {
        const auto [f, err] = choose_with(value);
        EXPECT_EQ(f, Form::kRule);
        EXPECT_EQ(err, "");
    }
}

TEST(EnvChoiceSwitch, EachNamedValueIsTaken) {
    for (const auto& [text, want] : {std::pair{"0", Form::kOff}, {"1", Form::kOn}, {"mma", Form::kMma}}) {
        const auto [f, err] = choose_with(text);
        EXPECT_EQ(f, want) << text;
        EXPECT_EQ(err, "") << text;
    }
}

TEST(EnvChoiceSwitch, AnythingElseIsNamedWithTheChoicesAndGivesTheDefault) {
    // A typo, another case, a number not listed, a prefix, trailing text, blank.
    for (const char* text : {"mmma", "MMA", "2", "m", "1 ", " "}) {
        const auto [f, err] = choose_with(text);
        EXPECT_EQ(f, Form::kRule) << text;
        EXPECT_NE(err.find(std::string(kName) + "=" + text + " is not one of 0, 1, mma; using the row rule"), std::string::npos)
            << "not named: " << err;
    }
}

TEST(EnvFlagSwitch, ZeroOrOneElseTheDefaultNamed) {
    for (const bool fallback : {false, true}) {
        auto read = [&](const char* value) { return read_env_with(value, [&] { return env_flag_switch(kName, fallback); }); };
        EXPECT_EQ(read(nullptr), std::pair(fallback, std::string()));
        EXPECT_EQ(read("0"), std::pair(false, std::string()));
        EXPECT_EQ(read("1"), std::pair(true, std::string()));
        // "0abc" was read as off by the earlier first-character tests; now it is named.
        const auto [on, err] = read("0abc");
        EXPECT_EQ(on, fallback);
        EXPECT_NE(err.find("is not one of 0, 1; using " + std::string(fallback ? "1" : "0")), std::string::npos) << err;
    }
}

}  // namespace
