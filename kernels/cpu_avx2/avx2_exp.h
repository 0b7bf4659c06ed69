// 2^x on 8 floats with AVX2 and FMA, for the attention kernels' softmax (kernels/cpu_avx2/
// paged_decode.cpp, kernels/cpu/paged_prefill.h): 2^n * 2^f with n = round(x), |f| <= 1/2, 2^f by
// its Taylor polynomial of degree 7 (relative error below 1e-8 on that range) and 2^n built in the
// exponent bits. x below -126 (2^n under the smallest normal float), -inf included, gives 0; NaN
// gives NaN (as the torch reference's softmax does).

#pragma once

#include <immintrin.h>

namespace structserve_cpu_avx2 {

inline __m256 exp2_ps(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-126.f), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(-126.f), x);   // NaN in x is kept: max_ps returns its second operand
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.525273380405984e-05f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381606e-04f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129107628477e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866482158e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265069591007e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471805599453e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

// e^x for x <= 0 (or -inf): 2^(x log2 e).
inline __m256 exp_ps(__m256 x) { return exp2_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f))); }

}  // namespace structserve_cpu_avx2
