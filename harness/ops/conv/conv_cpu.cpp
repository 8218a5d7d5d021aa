// The short causal depthwise convolution of the mixers, fused for the CPU (harness/ops/conv/forms.py
// holds its PyTorch forms, F.conv1d its oracle): ConvKernel of chunk_cpu.h.
//
// y[b, t, c] = bias[c] + sum_i w[i, c] x[b, t - K + 1 + i, c] (x zero before t = 0), on the
// (B, T, C) layout the projections produce, in one pass per direction. A group's members
// (harness/ops/common/members.py) come as consecutive blocks of B / members sequences, each
// block with its own taps and bias: w (members, K, C), bias (members, C); one member is a solo
// run's call. The PyTorch forms take
// K shifted multiply-adds (each a pass over the tensor, each with a backward node) or a
// convolution with two transposes; at training sizes that was about a sixth of a step.
// Backward: dx[b, s, c] = sum_i w[i, c] dy[b, s + K - 1 - i, c]; dw[i, c] and dbias[c] are sums
// over (b, t), accumulated per block of sequences and added in a fixed order (deterministic
// for a given thread count).
#include "chunk_cpu.h"

namespace harness_cpu {

template <typename T>
void ConvKernel<T>::forward(const T* x, const T* w, const T* bias, T* y, int64_t B, int64_t L, int64_t C, int64_t K,
                            int64_t members) {
  const int64_t per_member = B / members;
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t g = b / per_member;  // the sequence's member: its own taps and bias
      const T* wg = w + g * K * C;
      const T* bg = bias + g * C;
      const T* xb = x + b * L * C;
      T* yb = y + b * L * C;
      for (int64_t t = 0; t < L; ++t) {
        T* yt = yb + t * C;
        std::copy(bg, bg + C, yt);
        for (int64_t i = std::max<int64_t>(0, K - 1 - t); i < K; ++i) {
          const T* xs = xb + (t - K + 1 + i) * C;
          const T* wi = wg + i * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) yt[c] += wi[c] * xs[c];
        }
      }
    }
  });
}

template <typename T>
void ConvKernel<T>::backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* dbias, int64_t B, int64_t L,
                             int64_t C, int64_t K, int64_t members) {
  // Each member's sequences are cut into the same `parts` blocks, whatever the number of members,
  // so a member's dw and dbias are summed in the order its solo run sums them.
  const int64_t per_member = B / members;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(per_member, at::get_num_threads()));
  const int64_t stride = (K + 1) * C;  // per block and member: dw (K x C), then dbias
  std::vector<T> partial(parts * members * stride, T(0));
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t g = 0; g < members; ++g) {
        const T* wg = w + g * K * C;
        T* pw = partial.data() + (p * members + g) * stride;
        T* pb = pw + K * C;
        for (int64_t b = g * per_member + p * per_member / parts; b < g * per_member + (p + 1) * per_member / parts; ++b) {
          const T* xb = x + b * L * C;
          const T* gb = dy + b * L * C;
          T* db = dx + b * L * C;
          for (int64_t s = 0; s < L; ++s) {
            T* ds = db + s * C;
            std::fill(ds, ds + C, T(0));
            for (int64_t i = std::max<int64_t>(0, s + K - L); i < K; ++i) {  // dx: y_{s+K-1-i} (before L) read x_s
              const T* g_ = gb + (s + K - 1 - i) * C;
              const T* wi = wg + i * C;
#pragma omp simd
              for (int64_t c = 0; c < C; ++c) ds[c] += wi[c] * g_[c];
            }
            const T* g_ = gb + s * C;  // dw, dbias: y_s's reads
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) pb[c] += g_[c];
            for (int64_t i = std::max<int64_t>(0, K - 1 - s); i < K; ++i) {
              const T* xs = xb + (s - K + 1 + i) * C;
              T* pwi = pw + i * C;
#pragma omp simd
              for (int64_t c = 0; c < C; ++c) pwi[c] += g_[c] * xs[c];
            }
          }
        }
      }
    }
  });
  std::fill(dw, dw + members * K * C, T(0));
  std::fill(dbias, dbias + members * C, T(0));
  for (int64_t p = 0; p < parts; ++p) {
    for (int64_t g = 0; g < members; ++g) {
      const T* pw = partial.data() + (p * members + g) * stride;
      T* dwg = dw + g * K * C;
      T* dbg = dbias + g * C;
      for (int64_t e = 0; e < K * C; ++e) dwg[e] += pw[e];
      for (int64_t c = 0; c < C; ++c) dbg[c] += pw[K * C + c];
    }
  }
}

template struct ConvKernel<float>;
template struct ConvKernel<double>;

}  // namespace harness_cpu
