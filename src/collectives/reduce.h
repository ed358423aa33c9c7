// Element-wise reductions over the dtypes the collectives support.
#pragma once

#include <cstddef>

#include "gfdit/types.h"

namespace gfdit {
namespace reduce {

/// Bytes of one accumulator element: float32 for the 16-bit float types, the dtype itself otherwise.
size_t accElemSize(DType dtype);
/// acc[i] = src[i] (widened).
void accInit(void* acc, const void* src, size_t count, DType dtype);
/// acc[i] = op(acc[i], src[i]).
void accApply(void* acc, const void* src, size_t count, DType dtype, ReduceOp op);
/// dst[i] = acc[i] (narrowed, round to nearest even).
void accStore(void* dst, const void* acc, size_t count, DType dtype);

/// float <-> IEEE half and bfloat16, round to nearest even.
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bf16ToFloat(uint16_t b);
uint16_t floatToBf16(float f);

}  // namespace reduce
}  // namespace gfdit
