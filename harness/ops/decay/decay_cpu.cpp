// Decayed attention's chunk form with one scalar gate per position (RetNet, Mamba-2), fused for
// the CPU (harness/ops/decay/chunk.py is its batched form and oracle): ScalarDecayKernel of
// chunk_cpu.h.
//
// Per chunk (b_i the log decay from the chunk start, b_C at its end, M_ij = e^{b_i - b_j} for
// j <= i, else 0; A = (q k^T) * M):
//   o = e^{b} q S + A v                S = e^{b_C} S + (e^{b_C - b} k)^T v
// and backward, with dA = (do v^T) * M:
//   dq = dA k + e^{b} do S^T    dk = dA^T q + e^{b_C - b} v G^T    dv = A^T do + e^{b_C - b} k G
//   db_i = q_i . dq_i - k_i . dk_i (the log-decay gradient before its suffix sum over time)
//   G = e^{b_C} G + (e^{b} q)^T do
#include "chunk_cpu.h"

#include <cstring>

namespace harness_cpu {
namespace {

// Multiply the lower triangle by e^{b_i - b_j} (every exponent <= 0 for log decays <= 0) and zero
// the strict upper triangle.
template <typename T>
void decay_mask(T* a, const T* b, int64_t c) {
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j <= i; ++j) a[i * c + j] *= std::exp(b[i] - b[j]);
    std::fill(a + i * c + i + 1, a + (i + 1) * c, T(0));
  }
}

// The decay factors of one chunk from its log decays x: b (the log decay from the chunk start),
// fq = e^{b}, fk = e^{b_C - b}, and the scaled rows qs = fq q, ks = fk k. Returns b_C.
template <typename T>
T decay_factors(const T* x, const T* q, const T* k, int64_t c, int64_t dk, T* b, T* fq, T* fk, T* qs, T* ks) {
  T acc = 0;
  for (int64_t i = 0; i < c; ++i) b[i] = (acc += x[i]);
  const T b_end = b[c - 1];
  for (int64_t i = 0; i < c; ++i) {
    fq[i] = std::exp(b[i]);
    fk[i] = std::exp(b_end - b[i]);
#pragma omp simd
    for (int64_t d = 0; d < dk; ++d) {
      qs[i * dk + d] = q[i * dk + d] * fq[i];
      ks[i * dk + d] = k[i * dk + d] * fk[i];
    }
  }
  return b_end;
}


// The decay mask of a chunk into mask (c x c): e^{b_i - b_j} on and below the diagonal, 0 above.
template <typename T>
T* compute_mask(T* mask, const T* b, int64_t c) {
  std::fill(mask, mask + c * c, T(1));
  decay_mask(mask, b, c);
  return mask;
}

// a = q k^T masked in place as decay_mask masks it, each factor also written to the kept mask
// (chunk_cpu.h: kept_row), which unpack_kept turns back into the values compute_mask gives.
template <typename T>
void decay_mask_keeping(T* a, const T* b, int64_t c, T* kept) {
  for (int64_t i = 0; i < c; ++i) {
    T* row = kept + kept_row(i);
    for (int64_t j = 0; j <= i; ++j) a[i * c + j] *= (row[j] = std::exp(b[i] - b[j]));
    std::fill(a + i * c + i + 1, a + (i + 1) * c, T(0));
  }
}

// The decay mask of a chunk (e^{b_i - b_j} on and below the diagonal, 0 above) depends on the
// chunk's log decays alone, and at small key widths its c (c + 1) / 2 exponentials cost more than
// the chunk's products. Where the log decays repeat (RetNet's fixed decay per head, the same in
// every sequence and chunk), the last few masks are kept and reused, keyed by the log decays'
// bytes. A reused mask holds the very values computing it again would give (1 * e^z is e^z), so
// no result changes. Data-dependent decays (Mamba-2's gates) never repeat: after kGiveUp lookups
// without a hit (as many as it has slots) the cache stops keeping masks, and the forward goes
// back to masking in place. Where the log decays are learned (their gradient is wanted), the
// forward keeps every chunk's mask for the backward pass instead (masks_out, the lower triangles:
// decay_mask_keeping), which then computes no exponential.
// One cache per thread; kSlots covers the decay heads of a layer (model.n_heads x
// model.options.retnet_heads) up to 16.
template <typename T>
class MaskCache {
 public:
  explicit MaskCache(int64_t c) : c_(c) {}

  bool caching() const { return hits_ > 0 || lookups_ < kGiveUp; }

  // The mask of the chunk whose log decays are x and whose prefix sums (decay_factors) are b.
  const T* get(const T* x, const T* b) {
    if (!caching()) return compute_mask(masks_.data(), b, c_);
    ++lookups_;
    for (int i = 0; i < used_; ++i)
      if (std::memcmp(keys_.data() + i * c_, x, c_ * sizeof(T)) == 0) {
        ++hits_;
        return masks_.data() + i * c_ * c_;
      }
    const int slot = next_;
    next_ = (next_ + 1) % kSlots;
    used_ = std::min(used_ + 1, kSlots);
    if (masks_.size() < static_cast<size_t>(used_ * c_ * c_)) {  // a new slot
      if (masks_.empty()) {  // reserved at the first lookup: filled slot by slot, never reallocated
        keys_.reserve(kSlots * c_);
        masks_.reserve(kSlots * c_ * c_);
      }
      keys_.resize(used_ * c_);
      masks_.resize(used_ * c_ * c_);
    }
    std::copy(x, x + c_, keys_.data() + slot * c_);
    return compute_mask(masks_.data() + slot * c_ * c_, b, c_);
  }

 private:
  static constexpr int kSlots = 16, kGiveUp = kSlots;

  int64_t c_;
  std::vector<T> keys_, masks_;
  int used_ = 0, next_ = 0;
  int64_t lookups_ = 0, hits_ = 0;
};

}  // namespace

template <typename T>
void ScalarDecayKernel<T>::forward(const T* q, const T* k, const T* v, const T* x, const T* s0, T* o, T* starts,
                                   T* s_final, T* masks_out, int64_t m, int64_t n, int64_t c, int64_t dk,
                                   int64_t dv) {
  parallel_sequences(m, [&](int64_t first, int64_t last) {
    std::vector<T> a(c * c), b(c), fq(c), fk(c), qs(c * dk), ks(c * dk);
    MaskCache<T> masks(c);
    for (int64_t s = first; s < last; ++s) {
      T* S = s_final + s * dk * dv;
      start_state(S, s0, s, dk * dv);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t ch = s * n + j;
        const T* Q = q + ch * c * dk;
        const T* K = k + ch * c * dk;
        const T* V = v + ch * c * dv;
        const T* X = x + ch * c;
        T* O = o + ch * c * dv;
        std::copy(S, S + dk * dv, starts + ch * dk * dv);
        const T b_end = decay_factors(X, Q, K, c, dk, b.data(), fq.data(), fk.data(), qs.data(), ks.data());
        mm<T>(false, true, c, c, dk, Q, dk, K, dk, T(0), a.data(), c);  // q k^T, then the decay mask
        if (masks_out) {
          decay_mask_keeping(a.data(), b.data(), c, masks_out + ch * kept_row(c));
        } else if (masks.caching()) {
          const T* mask = masks.get(X, b.data());
          for (int64_t i = 0; i < c; ++i) {
            for (int64_t j = 0; j <= i; ++j) a[i * c + j] *= mask[i * c + j];
            std::fill(a.begin() + i * c + i + 1, a.begin() + (i + 1) * c, T(0));
          }
        } else {
          decay_mask(a.data(), b.data(), c);
        }
        mm<T>(false, false, c, dv, dk, qs.data(), dk, S, dv, T(0), O, dv);  // e^b q S
        mm<T>(false, false, c, dv, c, a.data(), c, V, dv, T(1), O, dv);  // + A v
        const T decay = std::exp(b_end);
#pragma omp simd
        for (int64_t e = 0; e < dk * dv; ++e) S[e] *= decay;
        mm<T>(true, false, dk, dv, c, ks.data(), dk, V, dv, T(1), S, dv);  // + (e^{b_C - b} k)^T v
      }
    }
  });
}

template <typename T>
void ScalarDecayKernel<T>::backward(const T* q, const T* k, const T* v, const T* x, const T* starts, const T* dout,
                                    const T* ds_final, const T* masks_in, T* dq, T* dk_, T* dv_, T* db, T* ds0,
                                    int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv) {
  parallel_sequences(m, [&](int64_t first, int64_t last) {
    std::vector<T> a(c * c), da(c * c), b(c), fq(c), fk(c), qs(c * dk), ks(c * dk), tmp(c * dk);
    std::vector<T> unpacked(masks_in ? c * c : 0);
    MaskCache<T> masks(c);
    for (int64_t s = first; s < last; ++s) {
      T* G = ds0 + s * dk * dv;  // the running state gradient lives in the output
      std::copy(ds_final + s * dk * dv, ds_final + (s + 1) * dk * dv, G);
      for (int64_t j = n - 1; j >= 0; --j) {
        const int64_t ch = s * n + j;
        const T* Q = q + ch * c * dk;
        const T* K = k + ch * c * dk;
        const T* V = v + ch * c * dv;
        const T* X = x + ch * c;
        const T* dO = dout + ch * c * dv;
        const T* S = starts + ch * dk * dv;
        const T b_end = decay_factors(X, Q, K, c, dk, b.data(), fq.data(), fk.data(), qs.data(), ks.data());
        if (masks_in) unpack_kept(masks_in + ch * kept_row(c), c, unpacked.data());
        const T* mask = masks_in ? unpacked.data() : masks.get(X, b.data());
        mm<T>(false, true, c, c, dk, Q, dk, K, dk, T(0), a.data(), c);  // A, recomputed
        mm<T>(false, true, c, c, dv, dO, dv, V, dv, T(0), da.data(), c);  // dA = (do v^T) * M
#pragma omp simd
        for (int64_t e = 0; e < c * c; ++e) {
          a[e] *= mask[e];
          da[e] *= mask[e];
        }
        T* dQ = dq + ch * c * dk;
        T* dK = dk_ + ch * c * dk;
        T* dV = dv_ + ch * c * dv;
        mm<T>(false, true, c, dk, dv, dO, dv, S, dv, T(0), tmp.data(), dk);  // do S^T, rows scaled by e^b
        mm<T>(false, false, c, dk, c, da.data(), c, K, dk, T(0), dQ, dk);
        for (int64_t i = 0; i < c; ++i)
#pragma omp simd
          for (int64_t d = 0; d < dk; ++d) dQ[i * dk + d] += fq[i] * tmp[i * dk + d];
        mm<T>(false, true, c, dk, dv, V, dv, G, dv, T(0), tmp.data(), dk);  // v G^T, rows scaled by e^{b_C - b}
        mm<T>(true, false, c, dk, c, da.data(), c, Q, dk, T(0), dK, dk);
        for (int64_t i = 0; i < c; ++i)
#pragma omp simd
          for (int64_t d = 0; d < dk; ++d) dK[i * dk + d] += fk[i] * tmp[i * dk + d];
        mm<T>(true, false, c, dv, c, a.data(), c, dO, dv, T(0), dV, dv);  // dv = A^T do
        mm<T>(false, false, c, dv, dk, ks.data(), dk, G, dv, T(1), dV, dv);  //    + (e^{b_C - b} k) G
        T* dB = db + ch * c;
        for (int64_t i = 0; i < c; ++i) {
          T acc_b = 0;
#pragma omp simd reduction(+ : acc_b)
          for (int64_t d = 0; d < dk; ++d) acc_b += Q[i * dk + d] * dQ[i * dk + d] - K[i * dk + d] * dK[i * dk + d];
          dB[i] = acc_b;
        }
        const T decay = std::exp(b_end);  // G for the chunk before: e^{b_C} G + (e^b q)^T do
#pragma omp simd
        for (int64_t e = 0; e < dk * dv; ++e) G[e] *= decay;
        mm<T>(true, false, dk, dv, c, qs.data(), dk, dO, dv, T(1), G, dv);
      }
    }
  });
}

template struct ScalarDecayKernel<float>;
template struct ScalarDecayKernel<double>;

}  // namespace harness_cpu
