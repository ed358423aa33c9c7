// Conversions and reductions against independent references: the compiler's _Float16 and double math.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "reduce.h"

using namespace gfdit;

TEST(Reduce, HalfConversionMatchesCompiler) {
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 ref;
    uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&ref, &bits, 2);
    float f = reduce::halfToFloat(bits);
    float rf = static_cast<float>(ref);
    if (std::isnan(rf)) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(f, rf) << "half bits " << h;
    ASSERT_EQ(reduce::floatToHalf(f), bits) << "round trip of half bits " << h;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.f, 70000.f);
  for (int i = 0; i < 200000; ++i) {
    float f = dist(rng) * (i % 3 == 0 ? 1e-6f : 1.f);
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    ASSERT_EQ(reduce::floatToHalf(f), rb) << "float " << f;
  }
}

TEST(Reduce, Bf16RoundsToNearestEven) {
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f) || std::isinf(f)) continue;
    uint16_t b = reduce::floatToBf16(f);
    double got = reduce::bf16ToFloat(b);
    // Neighbours of the result must not be closer.
    double up = reduce::bf16ToFloat(static_cast<uint16_t>(b + 1));
    double down = reduce::bf16ToFloat(static_cast<uint16_t>(b - 1));
    if (std::isinf(got)) {  // overflow: only beyond half an ulp above the largest bf16
      ASSERT_GE(std::fabs(f), 3.3961e38) << f;
      continue;
    }
    double err = std::fabs(got - f);
    if (std::isfinite(up)) ASSERT_LE(err, std::fabs(up - f)) << f;
    if (std::isfinite(down) && (b & 0x7fff) != 0) ASSERT_LE(err, std::fabs(down - f)) << f;
  }
}

TEST(Reduce, AccumulateEveryDtypeAndOp) {
  const size_t n = 1000;
  std::mt19937 rng(3);
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(static_cast<int>(rng() % 200) - 100);
    b[i] = static_cast<float>(static_cast<int>(rng() % 200) - 100);
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd}) {
    auto ref = [&](size_t i) {
      switch (op) {
        case ReduceOp::kSum: return a[i] + b[i];
        case ReduceOp::kMax: return std::max(a[i], b[i]);
        case ReduceOp::kMin: return std::min(a[i], b[i]);
        default: return a[i] * b[i];
      }
    };
    std::vector<float> acc(n);
    reduce::accInit(acc.data(), a.data(), n, DType::kFloat32);
    reduce::accApply(acc.data(), b.data(), n, DType::kFloat32, op);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], ref(i));
    std::vector<int64_t> ai(n), bi(n), acci(n);
    for (size_t i = 0; i < n; ++i) {
      ai[i] = static_cast<int64_t>(a[i]);
      bi[i] = static_cast<int64_t>(b[i]);
    }
    reduce::accInit(acci.data(), ai.data(), n, DType::kInt64);
    reduce::accApply(acci.data(), bi.data(), n, DType::kInt64, op);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<float>(acci[i]), ref(i));
    std::vector<uint16_t> ab(n), bb(n), out(n);
    for (size_t i = 0; i < n; ++i) {
      ab[i] = reduce::floatToBf16(a[i]);
      bb[i] = reduce::floatToBf16(b[i]);
    }
    std::vector<float> accf(n);
    reduce::accInit(accf.data(), ab.data(), n, DType::kBFloat16);
    reduce::accApply(accf.data(), bb.data(), n, DType::kBFloat16, op);
    reduce::accStore(out.data(), accf.data(), n, DType::kBFloat16);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], reduce::floatToBf16(ref(i)));
  }
}

TEST(Reduce, MaxAndMinPropagateNaN) {
  // As torch.maximum / torch.minimum: a NaN on either side gives NaN, whatever the order.
  const float nan = std::nanf("");
  std::vector<float> a = {1.f, nan, nan, -3.f, 2.f};
  std::vector<float> b = {nan, 5.f, nan, -4.f, 7.f};
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
    for (int order = 0; order < 2; ++order) {
      const auto& x = order ? b : a;
      const auto& y = order ? a : b;
      std::vector<float> acc(x);
      reduce::accApply(acc.data(), y.data(), acc.size(), DType::kFloat32, op);
      EXPECT_TRUE(std::isnan(acc[0]) && std::isnan(acc[1]) && std::isnan(acc[2]));
      EXPECT_EQ(acc[3], op == ReduceOp::kMax ? -3.f : -4.f);
      EXPECT_EQ(acc[4], op == ReduceOp::kMax ? 7.f : 2.f);
      // 16-bit floats go through the float32 accumulator: the same rule, and the NaN survives the store.
      std::vector<uint16_t> xb(x.size()), yb(y.size()), out(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xb[i] = reduce::floatToHalf(x[i]);
        yb[i] = reduce::floatToHalf(y[i]);
      }
      std::vector<float> accf(x.size());
      reduce::accInit(accf.data(), xb.data(), x.size(), DType::kFloat16);
      reduce::accApply(accf.data(), yb.data(), x.size(), DType::kFloat16, op);
      reduce::accStore(out.data(), accf.data(), x.size(), DType::kFloat16);
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(reduce::halfToFloat(out[i]))) << i;
    }
  }
  std::vector<double> d = {nan, 1.0}, e = {2.0, nan};
  reduce::accApply(d.data(), e.data(), 2, DType::kFloat64, ReduceOp::kMax);
  EXPECT_TRUE(std::isnan(d[0]) && std::isnan(d[1]));
}

TEST(Reduce, SignedIntegersWrapAround) {
  // Two's complement wrap-around, as torch's int32/int64 tensors give, not undefined behaviour (UBSan clean).
  std::vector<int32_t> a = {INT32_MAX, INT32_MIN, 46341, -7};
  std::vector<int32_t> b = {1, -1, 46341, 3};
  std::vector<int32_t> sum(a), prod(a);
  reduce::accApply(sum.data(), b.data(), 4, DType::kInt32, ReduceOp::kSum);
  reduce::accApply(prod.data(), b.data(), 4, DType::kInt32, ReduceOp::kProd);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(sum[i], static_cast<int32_t>(static_cast<uint32_t>(a[i]) + static_cast<uint32_t>(b[i]))) << i;
    int64_t wide = static_cast<int64_t>(a[i]) * b[i];
    EXPECT_EQ(prod[i], static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(wide)))) << i;
  }
  EXPECT_EQ(sum[0], INT32_MIN);
  EXPECT_EQ(sum[1], INT32_MAX);
  std::vector<int64_t> c = {INT64_MAX, 3037000500}, d2 = {1, 3037000500};
  std::vector<int64_t> s64(c), p64(c);
  reduce::accApply(s64.data(), d2.data(), 2, DType::kInt64, ReduceOp::kSum);
  reduce::accApply(p64.data(), d2.data(), 2, DType::kInt64, ReduceOp::kProd);
  EXPECT_EQ(s64[0], INT64_MIN);
  EXPECT_EQ(p64[1], static_cast<int64_t>(3037000500ull * 3037000500ull));
  std::vector<uint8_t> u = {200, 16}, v = {100, 16};
  reduce::accApply(u.data(), v.data(), 2, DType::kUInt8, ReduceOp::kProd);
  EXPECT_EQ(u[0], static_cast<uint8_t>(20000 % 256));
  EXPECT_EQ(u[1], 0);
}
