// Plain value types shared by the collectives API.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gfdit {

/// Largest world gfdit supports on one node.
constexpr int kMaxRanks = 64;
/// Most requests one batched denoising step runs together (NOTE [batches] in src/runtime/control.cpp).
constexpr int32_t kMaxBatch = 64;

/// Element types the collectives understand.
enum class DType : int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kUInt8 = 5,
  kFloat64 = 6
};

/// Reduction applied by reduceScatter and allReduce.
enum class ReduceOp : int32_t { kSum = 0, kMax = 1, kMin = 2, kProd = 3 };

/// Size in bytes of one element of dtype.
size_t dtypeSize(DType dtype);
/// Name of a dtype ("float32", ...).
const char* dtypeName(DType dtype);
/// Name of a reduce op ("sum", ...).
const char* reduceOpName(ReduceOp op);

/// Bytes laid out as `rows` rows of `row_bytes`, `stride` bytes apart (a contiguous buffer is one row).
struct BufferView {
  void* ptr = nullptr;
  size_t rows = 0;
  size_t row_bytes = 0;
  size_t stride = 0;

  /// A contiguous buffer of `bytes` bytes.
  static BufferView contiguous(void* p, size_t bytes) { return BufferView{p, 1, bytes, bytes}; }
  /// Strided rows.
  static BufferView strided(void* p, size_t rows, size_t row_bytes, size_t stride) {
    return BufferView{p, rows, row_bytes, stride};
  }
  /// Total payload bytes.
  size_t bytes() const { return rows * row_bytes; }
  /// Whether the payload is one contiguous block.
  bool isContiguous() const { return rows <= 1 || stride == row_bytes; }
};

}  // namespace gfdit
