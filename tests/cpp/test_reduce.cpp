// Conversions and reductions against independent references: the compiler's _Float16 and double math.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

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
