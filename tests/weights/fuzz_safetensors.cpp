// Fuzz entry point for the safetensors header parser (untrusted input): any bytes must give a
// parsed header or an scr::Error, never a crash. Built as a libFuzzer target with -DSCR_FUZZ=ON
// (clang); the GoogleTest suite also drives it with mutated inputs under ASan/UBSan.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "runtime/core/error.hpp"
#include "runtime/weights/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 8) return 0;
    uint64_t data_bytes = 0;
    std::memcpy(&data_bytes, data, 8);
    std::string_view text(reinterpret_cast<const char*>(data + 8), size - 8);
    try {
        auto tensors = scr::parse_safetensors_header(text, data_bytes % (1ull << 40), "fuzz");
        for (auto& t : tensors)
            if (t.end < t.begin) __builtin_trap();  // the parser promised ordered offsets
    } catch (const scr::Error&) {
    }
    return 0;
}
