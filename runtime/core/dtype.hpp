// Element types shared by the compiler, the weight loader and the kernels.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace scr {

enum class DType : uint8_t { f32, f16, bf16, f64, i8, u8, i32, u32, i64, f8e4m3, bool_ };

constexpr int64_t dtype_bytes(DType t) {
    switch (t) {
        case DType::f32: case DType::i32: case DType::u32: return 4;
        case DType::f16: case DType::bf16: return 2;
        case DType::f64: case DType::i64: return 8;
        case DType::i8: case DType::u8: case DType::f8e4m3: case DType::bool_: return 1;
    }
    return 0;
}

// Names as they appear in safetensors headers ("F32", "BF16", ...).
constexpr std::string_view dtype_safetensors_name(DType t) {
    switch (t) {
        case DType::f32: return "F32"; case DType::f16: return "F16"; case DType::bf16: return "BF16";
        case DType::f64: return "F64"; case DType::i8: return "I8"; case DType::u8: return "U8";
        case DType::i32: return "I32"; case DType::u32: return "U32"; case DType::i64: return "I64";
        case DType::f8e4m3: return "F8_E4M3"; case DType::bool_: return "BOOL";
    }
    return "?";
}

// Short names used by presets and generated code ("f32", "bf16", ...).
constexpr std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::f32: return "f32"; case DType::f16: return "f16"; case DType::bf16: return "bf16";
        case DType::f64: return "f64"; case DType::i8: return "i8"; case DType::u8: return "u8";
        case DType::i32: return "i32"; case DType::u32: return "u32"; case DType::i64: return "i64";
        case DType::f8e4m3: return "f8e4m3"; case DType::bool_: return "bool";
    }
    return "?";
}

inline std::optional<DType> dtype_from_safetensors(std::string_view s) {
    for (int i = 0; i <= int(DType::bool_); ++i)
        if (dtype_safetensors_name(DType(i)) == s) return DType(i);
    return std::nullopt;
}

inline std::optional<DType> dtype_from_name(std::string_view s) {
    for (int i = 0; i <= int(DType::bool_); ++i)
        if (dtype_name(DType(i)) == s) return DType(i);
    return std::nullopt;
}

// bf16 <-> f32. Rounding to nearest even, as torch does; NaN stays NaN.
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t f32_to_bf16(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// IEEE half <-> f32 (for f16 checkpoints).
inline float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    uint32_t out;
    if (exp == 0) {
        if (man == 0) out = sign;
        else {  // subnormal: renormalize
            int e = -1;
            do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
            out = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
        }
    } else if (exp == 31) out = sign | 0x7f800000u | man << 13;
    else out = sign | (exp + 127 - 15) << 23 | man << 13;
    return std::bit_cast<float>(out);
}

inline uint16_t f32_to_f16(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return uint16_t(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return uint16_t(sign);
        man |= 0x800000u;
        uint32_t shift = uint32_t(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) ++half;
        return uint16_t(sign | half);
    }
    uint32_t half = sign | uint32_t(exp) << 10 | man >> 13;
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
    return uint16_t(half);
}

}  // namespace scr
