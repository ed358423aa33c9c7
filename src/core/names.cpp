// Names of enums, for messages.
#include "gfdit/error.h"
#include "gfdit/types.h"

namespace gfdit {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidUsage: return "InvalidUsage";
    case ErrorCode::kTimeout: return "Timeout";
    case ErrorCode::kSystemError: return "SystemError";
    case ErrorCode::kRemoteError: return "RemoteError";
    case ErrorCode::kInternal: return "Internal";
  }
  return "Unknown";
}

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
    case DType::kFloat64: return 8;
  }
  throw Error(ErrorCode::kInvalidUsage, "unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kFloat64: return "float64";
  }
  return "unknown";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProd: return "prod";
  }
  return "unknown";
}

}  // namespace gfdit
