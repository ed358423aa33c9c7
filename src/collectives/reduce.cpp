// Reductions: the 16-bit float types accumulate in float32, so the order of members changes the
// result less than a reduction in the narrow type would (NCCL reduces in the narrow type).
#include "reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gfdit/error.h"

namespace gfdit {
namespace reduce {

float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to inf
  if (abs < 0x38800000u) {                                              // subnormal or zero in half
    // value = abs_float; half subnormal unit = 2^-24.
    float a;
    std::memcpy(&a, &abs, 4);
    float scaled = a * 16777216.0f;  // / 2^-24, exact for these magnitudes
    // round to nearest even
    uint32_t q = static_cast<uint32_t>(scaled);
    float rem = scaled - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t mant = abs & 0x7fffff;
  uint32_t h = exp << 10 | mant >> 13;
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | h);
}

float bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Sums and products of signed integers wrap around (two's complement, as torch's integer tensors do) instead
// of overflowing, which C++ leaves undefined: the arithmetic runs on the unsigned type of the same width.
template <typename T>
inline T wrapAdd(T a, T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return static_cast<T>(a + b);
  }
}

template <typename T>
inline T wrapMul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, T>>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// max and min propagate NaN, as torch.maximum / torch.minimum and torch's own reductions do: a NaN on any
// member makes the element NaN everywhere. (For integers `a != a` is always false.)
template <typename T>
inline T maxOf(T a, T b) {
  return (a > b || a != a) ? a : b;
}

template <typename T>
inline T minOf(T a, T b) {
  return (a < b || a != a) ? a : b;
}

template <typename T>
void applyTyped(T* acc, const T* src, size_t count, ReduceOp op) {
  // One loop per op so the compiler vectorises each.
  switch (op) {
    case ReduceOp::kSum:
      for (size_t i = 0; i < count; ++i) acc[i] = wrapAdd(acc[i], src[i]);
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < count; ++i) acc[i] = maxOf(acc[i], src[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < count; ++i) acc[i] = minOf(acc[i], src[i]);
      break;
    case ReduceOp::kProd:
      for (size_t i = 0; i < count; ++i) acc[i] = wrapMul(acc[i], src[i]);
      break;
  }
}

template <float (*kWiden)(uint16_t)>
void applyNarrow(float* acc, const uint16_t* src, size_t count, ReduceOp op) {
  constexpr size_t kBlock = 256;
  float tmp[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    size_t n = std::min(kBlock, count - base);
    for (size_t i = 0; i < n; ++i) tmp[i] = kWiden(src[base + i]);
    applyTyped(acc + base, tmp, n, op);
  }
}

}  // namespace

size_t accElemSize(DType dtype) {
  return (dtype == DType::kFloat16 || dtype == DType::kBFloat16) ? 4 : dtypeSize(dtype);
}

void accInit(void* acc, const void* src, size_t count, DType dtype) {
  auto* a = static_cast<float*>(acc);
  auto* s = static_cast<const uint16_t*>(src);
  switch (dtype) {
    case DType::kFloat16:
      for (size_t i = 0; i < count; ++i) a[i] = halfToFloat(s[i]);
      return;
    case DType::kBFloat16:
      for (size_t i = 0; i < count; ++i) a[i] = bf16ToFloat(s[i]);
      return;
    default: std::memcpy(acc, src, count * dtypeSize(dtype));
  }
}

void accApply(void* acc, const void* src, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32: return applyTyped(static_cast<float*>(acc), static_cast<const float*>(src), count, op);
    case DType::kFloat16:
      return applyNarrow<halfToFloat>(static_cast<float*>(acc), static_cast<const uint16_t*>(src), count, op);
    case DType::kBFloat16:
      return applyNarrow<bf16ToFloat>(static_cast<float*>(acc), static_cast<const uint16_t*>(src), count, op);
    case DType::kInt32: return applyTyped(static_cast<int32_t*>(acc), static_cast<const int32_t*>(src), count, op);
    case DType::kInt64: return applyTyped(static_cast<int64_t*>(acc), static_cast<const int64_t*>(src), count, op);
    case DType::kUInt8: return applyTyped(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(src), count, op);
    case DType::kFloat64: return applyTyped(static_cast<double*>(acc), static_cast<const double*>(src), count, op);
  }
  GFDIT_THROW(kInvalidUsage) << "unsupported dtype " << static_cast<int>(dtype);
}

void accStore(void* dst, const void* acc, size_t count, DType dtype) {
  auto* a = static_cast<const float*>(acc);
  auto* d = static_cast<uint16_t*>(dst);
  switch (dtype) {
    case DType::kFloat16:
      for (size_t i = 0; i < count; ++i) d[i] = floatToHalf(a[i]);
      return;
    case DType::kBFloat16:
      for (size_t i = 0; i < count; ++i) d[i] = floatToBf16(a[i]);
      return;
    default:
      if (dst != acc) std::memcpy(dst, acc, count * dtypeSize(dtype));
  }
}

}  // namespace reduce
}  // namespace gfdit
