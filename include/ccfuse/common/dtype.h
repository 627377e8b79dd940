// ccfuse/common/dtype.h: element types. bf16 on the host is stored as its 16 bits; conversions
// round to nearest even, the same as __float2bfloat16_rn on the device.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "ccfuse/common/hd.h"

namespace ccfuse {

enum class DType { kFloat32, kBFloat16, kFloat16 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
  }
  return "?";
}
inline int dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// Host bf16: 1 sign, 8 exponent, 7 mantissa bits.
struct bf16 {
  uint16_t bits = 0;

  static bf16 from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bf16 out;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {  // NaN stays a (quiet) NaN
      out.bits = uint16_t((u >> 16) | 0x40u);
      return out;
    }
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    out.bits = uint16_t((u + rounding) >> 16);
    return out;
  }
  float to_float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <typename T> inline float to_f32(T v);
template <> inline float to_f32<float>(float v) { return v; }
template <> inline float to_f32<bf16>(bf16 v) { return v.to_float(); }
template <typename T> inline T from_f32(float v);
template <> inline float from_f32<float>(float v) { return v; }
template <> inline bf16 from_f32<bf16>(float v) { return bf16::from_float(v); }

}  // namespace ccfuse
