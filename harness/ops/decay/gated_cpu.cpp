// Decayed attention's chunk form with one gate per key dimension (GLA), fused for the CPU
// (harness/ops/decay/chunk.py is its batched form and oracle): GatedKernel of chunk_cpu.h.
//
// a = e^{x} (C x Dk per chunk, computed by the caller): every decay between two positions is a
// product of a's over the positions between them, so no exponential is taken here. In-chunk
// weights A_ij = sum_d q_id k_jd P_ijd, P_ij = prod_{j<u<=i} a_u (j <= i), block by block:
//   - a block whose running products p_i = prod_{r0<u<=i} a_u (from its first row r0) stay within
//     [kSafe, 1/kSafe] in every dimension is one product, A = tril((q * p) (k / p)^T): nothing in it
//     can overflow, and every term is the exact one up to rounding (relative, as in the direct sum).
//     With GLA's gates (a about 0.98-1) that is the whole chunk, one C x C x Dk product;
//   - any other block is halved: pairs across the halves factor through the boundary r between
//     them, A_RL = (q_R * prod_{r<u<=i} a_u) (k_L * prod_{j<u<=r} a_u)^T (both factors <= 1 for
//     decays <= 1), and each half is a block again;
//   - a block of kPairBlock rows or fewer that is still not safe sums its pairs directly,
//     carrying the product along i.
// Exact for any decay strength. The chunk form around it is the scalar gate's with rows:
// o = (fq * q) S + A v, S = diag(e^{b_C}) S + (fk * k)^T v, fq_i = prod_{u<=i} a_u,
// fk_i = prod_{i<u<=C} a_u. The backward pass also returns dx, the log decays' gradient:
// db = q * dq - k * dk per position and dimension, summed over every later position of the
// sequence (a running sum, as the chunks are walked in reverse), started from the final state's
// <dS_T, S_T> per dimension.
#include "chunk_cpu.h"

namespace harness_cpu {
namespace {

constexpr int64_t kPairBlock = 8;

// Largest spread of a block's running products for its one-product form: 2^-60 for float32
// (1/kSafe times a key stays far below its largest value), 2^-500 for float64.
template <typename T>
constexpr T safe_spread() { return sizeof(T) == 4 ? T(8.673617379884035e-19) : T(3.054936363499605e-151); }

// Running products of a over rows [r0, r1) from the start (f_i = prod_{r0<=u<=i} a_u) and
// to the end, exclusive (g_j = prod_{j<u<r1} a_u); either output may be null.
template <typename T>
void block_products(const T* a, int64_t r0, int64_t r1, int64_t dk, T* f, T* g) {
  if (f) {
    std::copy(a + r0 * dk, a + (r0 + 1) * dk, f + r0 * dk);
    for (int64_t i = r0 + 1; i < r1; ++i)
#pragma omp simd
      for (int64_t d = 0; d < dk; ++d) f[i * dk + d] = f[(i - 1) * dk + d] * a[i * dk + d];
  }
  if (g) {
    std::fill(g + (r1 - 1) * dk, g + r1 * dk, T(1));
    for (int64_t j = r1 - 2; j >= r0; --j)
#pragma omp simd
      for (int64_t d = 0; d < dk; ++d) g[j * dk + d] = g[(j + 1) * dk + d] * a[(j + 1) * dk + d];
  }
}

// rows [r0, r1) of out = x * f (elementwise).
template <typename T>
void scale_rows(const T* x, const T* f, int64_t r0, int64_t r1, int64_t dk, T* out) {
#pragma omp simd
  for (int64_t e = r0 * dk; e < r1 * dk; ++e) out[e] = x[e] * f[e];
}

// Scratch of one thread for the gated chunk: factors and scaled rows (C x Dk), a masked dA block.
template <typename T>
struct GatedScratch {
  std::vector<T> fq, fk, qs, ks, lf, rf, lq, rq, tmp, dm;
  explicit GatedScratch(int64_t c, int64_t dk)
      : fq(c * dk), fk(c * dk), qs(c * dk), ks(c * dk), lf(c * dk), rf(c * dk), lq(c * dk), rq(c * dk),
        tmp((c + 3) * dk), dm(c * c) {}
};

// The chunk's factors fq, fk and the scaled rows qs = fq q, ks = fk k.
template <typename T>
void gated_factors(const T* Q, const T* K, const T* Aa, int64_t c, int64_t dk, GatedScratch<T>& w) {
  block_products(Aa, 0, c, dk, w.fq.data(), w.fk.data());
  scale_rows(Q, w.fq.data(), 0, c, dk, w.qs.data());
  scale_rows(K, w.fk.data(), 0, c, dk, w.ks.data());
}

// What the weights of one chunk read, and where their gradients go (dA null: forward only).
template <typename T>
struct GatedChunk {
  const T *Q, *K, *Aa;
  int64_t c, dk;
  T* a;            // C x C weights, written below the diagonal (the caller zeroes the rest)
  const T* dA;     // C x C, read below the diagonal only
  T *dQ, *dK;      // the gradients of sum(dA * A) are added here
};

// Pairs (i, j) of rows [b0, b0 + len), j <= i, summed directly.
template <typename T>
void pair_weights(const GatedChunk<T>& g, int64_t b0, int64_t len, GatedScratch<T>& w) {
  const int64_t c = g.c, dk = g.dk;
  T* p = w.tmp.data();  // the product prod_{j<u<=i} a_u, carried along i
  T* kp = p + dk;       // k_j * p
  T* acc = p + 2 * dk;  // dK_j's sum over i
  for (int64_t j = b0; j < b0 + len; ++j) {
    const T* kj = g.K + j * dk;
    std::fill(p, p + dk, T(1));
    std::fill(acc, acc + dk, T(0));
    for (int64_t i = j; i < b0 + len; ++i) {
      const T* qi = g.Q + i * dk;
      const T* ai = g.Aa + i * dk;
      if (i > j) {
#pragma omp simd
        for (int64_t d = 0; d < dk; ++d) p[d] *= ai[d];
      }
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < dk; ++d) {
        kp[d] = kj[d] * p[d];
        dot += qi[d] * kp[d];
      }
      g.a[i * c + j] = dot;
      if (g.dA) {
        const T gij = g.dA[i * c + j];
        T* dqi = g.dQ + i * dk;
#pragma omp simd
        for (int64_t d = 0; d < dk; ++d) {
          dqi[d] += gij * kp[d];
          acc[d] += gij * qi[d] * p[d];
        }
      }
    }
    if (g.dA) {
      T* dkj = g.dK + j * dk;
#pragma omp simd
      for (int64_t d = 0; d < dk; ++d) dkj[d] += acc[d];
    }
  }
}

// Whether rows [b0, b0 + len) can be one product: their running products from b0 (into p, rows
// b0.. of a C x Dk buffer; p_b0 = 1) stay within [kSafe, 1/kSafe].
template <typename T>
bool safe_block(const T* Aa, int64_t b0, int64_t len, int64_t dk, T* p) {
  std::fill(p + b0 * dk, p + (b0 + 1) * dk, T(1));
  T lo = 1, hi = 1;
  for (int64_t i = b0 + 1; i < b0 + len; ++i) {
#pragma omp simd reduction(min : lo) reduction(max : hi)
    for (int64_t d = 0; d < dk; ++d) {
      const T x = p[(i - 1) * dk + d] * Aa[i * dk + d];
      p[i * dk + d] = x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
  }
  return lo >= safe_spread<T>() && hi <= T(1) / safe_spread<T>();  // false for NaN too
}

// Rows [b0, b0 + len) of the in-chunk weights (see the comment above), and their gradients.
template <typename T>
void block_weights(const GatedChunk<T>& g, int64_t b0, int64_t len, GatedScratch<T>& w) {
  const int64_t c = g.c, dk = g.dk;
  T* f = w.rf.data();
  T* xq = w.rq.data();
  T* xk = w.lq.data();
  T* tmp = w.tmp.data();
  if (len > 1 && safe_block(g.Aa, b0, len, dk, f)) {  // one product: (q * p) (k / p)^T, lower triangle
    for (int64_t e = b0 * dk; e < (b0 + len) * dk; ++e) {
      xq[e] = g.Q[e] * f[e];
      xk[e] = g.K[e] / f[e];
    }
    T* a_bb = g.a + b0 * c + b0;
    mm<T>(false, true, len, len, dk, xq + b0 * dk, dk, xk + b0 * dk, dk, T(0), a_bb, c);
    for (int64_t i = 0; i < len; ++i) std::fill(a_bb + i * c + i + 1, a_bb + i * c + len, T(0));
    if (g.dA) {
      const T* da_bb = g.dA + b0 * c + b0;
      T* dm = w.dm.data();  // dA's block, zero above the diagonal
      for (int64_t i = 0; i < len; ++i) {
        std::copy(da_bb + i * c, da_bb + i * c + i + 1, dm + i * len);
        std::fill(dm + i * len + i + 1, dm + (i + 1) * len, T(0));
      }
      mm<T>(false, false, len, dk, len, dm, len, xk + b0 * dk, dk, T(0), tmp, dk);  // dA (k / p)
      for (int64_t e = 0; e < len * dk; ++e) g.dQ[b0 * dk + e] += tmp[e] * f[b0 * dk + e];
      mm<T>(true, false, len, dk, len, dm, len, xq + b0 * dk, dk, T(0), tmp, dk);  // dA^T (q * p)
      for (int64_t e = 0; e < len * dk; ++e) g.dK[b0 * dk + e] += tmp[e] / f[b0 * dk + e];
    }
    return;
  }
  if (len <= kPairBlock) {
    pair_weights(g, b0, len, w);
    return;
  }
  const int64_t s = len / 2, l0 = b0, r0 = b0 + s;  // pairs across the halves, through their boundary
  T* rf = w.rf.data();
  T* lf = w.lf.data();
  block_products(g.Aa, r0, r0 + s, dk, rf, static_cast<T*>(nullptr));
  block_products(g.Aa, l0, r0, dk, static_cast<T*>(nullptr), lf);
  scale_rows(g.Q, rf, r0, r0 + s, dk, xq);
  scale_rows(g.K, lf, l0, r0, dk, xk);
  T* a_rl = g.a + r0 * c + l0;
  mm<T>(false, true, s, s, dk, xq + r0 * dk, dk, xk + l0 * dk, dk, T(0), a_rl, c);
  if (g.dA) {
    const T* da_rl = g.dA + r0 * c + l0;
    mm<T>(false, false, s, dk, s, da_rl, c, xk + l0 * dk, dk, T(0), tmp, dk);  // dA_RL kL'
    for (int64_t e = 0; e < s * dk; ++e) g.dQ[r0 * dk + e] += rf[r0 * dk + e] * tmp[e];
    mm<T>(true, false, s, dk, s, da_rl, c, xq + r0 * dk, dk, T(0), tmp, dk);  // dA_RL^T qR'
    for (int64_t e = 0; e < s * dk; ++e) g.dK[l0 * dk + e] += lf[l0 * dk + e] * tmp[e];
  }
  block_weights(g, l0, s, w);
  block_weights(g, r0, s, w);
}

// In-chunk weights into a (C x C, zero above the diagonal). With dA (C x C, read below the
// diagonal only), also adds the gradients of sum(dA * A) into dQ and dK.
template <typename T>
void gated_weights(const T* Q, const T* K, const T* Aa, int64_t c, int64_t dk, T* a, GatedScratch<T>& w,
                   const T* dA, T* dQ, T* dK) {
  std::fill(a, a + c * c, T(0));
  block_weights(GatedChunk<T>{Q, K, Aa, c, dk, a, dA, dQ, dK}, 0, c, w);
}

}  // namespace

template <typename T>
void GatedKernel<T>::forward(const T* q, const T* k, const T* v, const T* ga, const T* s0, T* o, T* starts,
                             T* s_final, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv) {
  parallel_sequences(m, [&](int64_t first, int64_t last) {
    std::vector<T> a(c * c);
    GatedScratch<T> w(c, dk);
    for (int64_t s = first; s < last; ++s) {
      T* S = s_final + s * dk * dv;
      start_state(S, s0, s, dk * dv);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t ch = s * n + j;
        const T* Q = q + ch * c * dk;
        const T* K = k + ch * c * dk;
        const T* V = v + ch * c * dv;
        const T* Aa = ga + ch * c * dk;
        T* O = o + ch * c * dv;
        std::copy(S, S + dk * dv, starts + ch * dk * dv);
        gated_factors(Q, K, Aa, c, dk, w);
        gated_weights<T>(Q, K, Aa, c, dk, a.data(), w, nullptr, nullptr, nullptr);
        mm<T>(false, false, c, dv, dk, w.qs.data(), dk, S, dv, T(0), O, dv);  // (fq q) S
        mm<T>(false, false, c, dv, c, a.data(), c, V, dv, T(1), O, dv);  // + A v
        const T* decay = w.fq.data() + (c - 1) * dk;  // e^{b_C} per key dimension: rows of S
        for (int64_t d = 0; d < dk; ++d)
#pragma omp simd
          for (int64_t e = 0; e < dv; ++e) S[d * dv + e] *= decay[d];
        mm<T>(true, false, dk, dv, c, w.ks.data(), dk, V, dv, T(1), S, dv);  // + (fk k)^T v
      }
    }
  });
}

template <typename T>
void GatedKernel<T>::backward(const T* q, const T* k, const T* v, const T* ga, const T* starts, const T* s_fin,
                              const T* dout, const T* ds_final, T* dq, T* dk_, T* dv_, T* dx, T* ds0, int64_t m,
                              int64_t n, int64_t c, int64_t dk, int64_t dv) {
  parallel_sequences(m, [&](int64_t first, int64_t last) {
    std::vector<T> a(c * c), da(c * c), suffix(dk);
    GatedScratch<T> w(c, dk);
    for (int64_t s = first; s < last; ++s) {
      T* G = ds0 + s * dk * dv;  // the running state gradient lives in the output
      const T* dS = ds_final + s * dk * dv;
      const T* Sf = s_fin + s * dk * dv;
      std::copy(dS, dS + dk * dv, G);
      for (int64_t d = 0; d < dk; ++d) {  // the final state's share of the last log decay: <dS_T, S_T>
        T acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t e = 0; e < dv; ++e) acc += dS[d * dv + e] * Sf[d * dv + e];
        suffix[d] = acc;
      }
      for (int64_t j = n - 1; j >= 0; --j) {
        const int64_t ch = s * n + j;
        const T* Q = q + ch * c * dk;
        const T* K = k + ch * c * dk;
        const T* V = v + ch * c * dv;
        const T* Aa = ga + ch * c * dk;
        const T* dO = dout + ch * c * dv;
        const T* S = starts + ch * dk * dv;
        T* dQ = dq + ch * c * dk;
        T* dK = dk_ + ch * c * dk;
        T* dV = dv_ + ch * c * dv;
        T* dX = dx + ch * c * dk;
        gated_factors(Q, K, Aa, c, dk, w);
        T* tmp = w.tmp.data();
        mm<T>(false, true, c, dk, dv, dO, dv, S, dv, T(0), tmp, dk);  // do S^T, rows scaled by fq
        for (int64_t e = 0; e < c * dk; ++e) dQ[e] = w.fq[e] * tmp[e];
        mm<T>(false, true, c, dk, dv, V, dv, G, dv, T(0), tmp, dk);  // v G^T, rows scaled by fk
        for (int64_t e = 0; e < c * dk; ++e) dK[e] = w.fk[e] * tmp[e];
        mm<T>(false, true, c, c, dv, dO, dv, V, dv, T(0), da.data(), c);  // dA = do v^T (read below the diagonal)
        gated_weights<T>(Q, K, Aa, c, dk, a.data(), w, da.data(), dQ, dK);  // A, and its share of dq, dk
        mm<T>(true, false, c, dv, c, a.data(), c, dO, dv, T(0), dV, dv);  // dv = A^T do
        mm<T>(false, false, c, dv, dk, w.ks.data(), dk, G, dv, T(1), dV, dv);  //    + (fk k) G
        for (int64_t i = c - 1; i >= 0; --i) {  // dx_i = sum over later positions of q dq - k dk
#pragma omp simd
          for (int64_t d = 0; d < dk; ++d) {
            suffix[d] += Q[i * dk + d] * dQ[i * dk + d] - K[i * dk + d] * dK[i * dk + d];
            dX[i * dk + d] = suffix[d];
          }
        }
        const T* decay = w.fq.data() + (c - 1) * dk;  // G for the chunk before: diag(e^{b_C}) G + (fq q)^T do
        for (int64_t d = 0; d < dk; ++d)
#pragma omp simd
          for (int64_t e = 0; e < dv; ++e) G[d * dv + e] *= decay[d];
        mm<T>(true, false, dk, dv, c, w.qs.data(), dk, dO, dv, T(1), G, dv);
      }
    }
  });
}

template struct GatedKernel<float>;
template struct GatedKernel<double>;

}  // namespace harness_cpu
