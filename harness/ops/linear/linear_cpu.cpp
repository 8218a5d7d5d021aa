// Linear attention's chunk form, fused for the CPU (harness/ops/linear/chunk.py is its batched
// form and oracle): LinearKernel of chunk_cpu.h.
//
// Per chunk (rows i of q, k, v; S, z the state entering the chunk; A = tril(q k^T)):
//   num = q S + A v      den = q.z + rowsum(A)      o = num / floor(den)
//   S += k^T v           z += colsum(k)
// and backward, with dnum = do / floor(den), dden = -(do . o) / floor(den) where the floor is
// not active, dA = tril(dnum v^T + dden 1^T), G the gradient reaching the state leaving it:
//   dq = dA k + dnum S^T + dden z^T    dk = dA^T q + v G^T + gz    dv = A^T dnum + k G
//   G += q^T dnum                      gz += q^T dden
// Without normalize, o = num (den is not formed); exclusive leaves the diagonal out of A.
#include "chunk_cpu.h"

namespace harness_cpu {
namespace {

// |den| floored at eps with its sign kept, 0 -> +eps (harness.ops.common.guards.floor_denominator).
template <typename T>
T floor_denominator(T den, T eps) {
  return den < 0 ? std::min(den, -eps) : std::max(den, eps);
}

// Zero the strict upper triangle (the diagonal too when exclusive): causal within the chunk.
template <typename T>
void causal_mask(T* a, int64_t c, bool exclusive) {
  for (int64_t i = 0; i < c; ++i) {
    std::fill(a + i * c + (exclusive ? i : i + 1), a + (i + 1) * c, T(0));
  }
}

}  // namespace

template <typename T>
void LinearKernel<T>::forward(const T* q, const T* k, const T* v, const T* s0, const T* z0, T* o, T* starts,
                              T* z_starts, T* den, T* s_final, T* z_final, int64_t m, int64_t n, int64_t c,
                              int64_t dk, int64_t dv, bool normalize, T eps, bool exclusive) {
  parallel_sequences(m, [&](int64_t first, int64_t last) {
    std::vector<T> a(c * c);
    for (int64_t s = first; s < last; ++s) {
      T* S = s_final + s * dk * dv;  // the running state lives in the output
      T* z = z_final + s * dk;
      start_state(S, s0, s, dk * dv);
      start_state(z, z0, s, dk);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t ch = s * n + j;
        const T* Q = q + ch * c * dk;
        const T* K = k + ch * c * dk;
        const T* V = v + ch * c * dv;
        T* O = o + ch * c * dv;
        std::copy(S, S + dk * dv, starts + ch * dk * dv);  // entering states: saved for backward
        std::copy(z, z + dk, z_starts + ch * dk);
        mm<T>(false, true, c, c, dk, Q, dk, K, dk, T(0), a.data(), c);  // A = q k^T
        causal_mask(a.data(), c, exclusive);
        mm<T>(false, false, c, dv, dk, Q, dk, S, dv, T(0), O, dv);  // num = q S
        mm<T>(false, false, c, dv, c, a.data(), c, V, dv, T(1), O, dv);  // num += A v
        if (normalize) {
          T* D = den + ch * c;
          for (int64_t i = 0; i < c; ++i) {
            T acc = 0;
            const T* ai = a.data() + i * c;
            const T* qi = Q + i * dk;
#pragma omp simd reduction(+ : acc)
            for (int64_t t = 0; t < c; ++t) acc += ai[t];
#pragma omp simd reduction(+ : acc)
            for (int64_t d = 0; d < dk; ++d) acc += qi[d] * z[d];
            D[i] = acc;
            const T r = T(1) / floor_denominator(acc, eps);
            T* oi = O + i * dv;
#pragma omp simd
            for (int64_t e = 0; e < dv; ++e) oi[e] *= r;
          }
        }
        mm<T>(true, false, dk, dv, c, K, dk, V, dv, T(1), S, dv);  // S += k^T v
        for (int64_t i = 0; i < c; ++i) {
          const T* ki = K + i * dk;
#pragma omp simd
          for (int64_t d = 0; d < dk; ++d) z[d] += ki[d];
        }
      }
    }
  });
}

template <typename T>
void LinearKernel<T>::backward(const T* q, const T* k, const T* v, const T* o, const T* starts, const T* z_starts,
                               const T* den, const T* dout, const T* ds_final, const T* dz_final, T* dq, T* dk_,
                               T* dv_, T* ds0, T* dz0, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv,
                               bool normalize, T eps, bool exclusive) {
  parallel_sequences(m, [&](int64_t first, int64_t last) {
    std::vector<T> a(c * c), da(c * c), dnum_buf(c * dv), dden(c, T(0));
    for (int64_t s = first; s < last; ++s) {
      T* G = ds0 + s * dk * dv;  // the running state gradient lives in the output
      T* gz = dz0 + s * dk;
      std::copy(ds_final + s * dk * dv, ds_final + (s + 1) * dk * dv, G);
      std::copy(dz_final + s * dk, dz_final + (s + 1) * dk, gz);
      for (int64_t j = n - 1; j >= 0; --j) {
        const int64_t ch = s * n + j;
        const T* Q = q + ch * c * dk;
        const T* K = k + ch * c * dk;
        const T* V = v + ch * c * dv;
        const T* dO = dout + ch * c * dv;
        const T* S = starts + ch * dk * dv;
        const T* zj = z_starts + ch * dk;
        const T* dnum = dO;
        if (normalize) {  // through the read-out o = num / floor(den)
          const T* O = o + ch * c * dv;
          const T* D = den + ch * c;
          for (int64_t i = 0; i < c; ++i) {
            const T r = T(1) / floor_denominator(D[i], eps);
            const T* doi = dO + i * dv;
            const T* oi = O + i * dv;
            T* dni = dnum_buf.data() + i * dv;
            T dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t e = 0; e < dv; ++e) {
              dni[e] = doi[e] * r;
              dot += doi[e] * oi[e];
            }
            const bool passes = D[i] >= eps || D[i] <= -eps;  // the floor is flat inside (-eps, eps)
            dden[i] = passes ? -dot * r : T(0);
          }
          dnum = dnum_buf.data();
        }
        mm<T>(false, true, c, c, dk, Q, dk, K, dk, T(0), a.data(), c);  // A, recomputed
        causal_mask(a.data(), c, exclusive);
        mm<T>(false, true, c, c, dv, dnum, dv, V, dv, T(0), da.data(), c);  // dA = dnum v^T
        if (normalize) {
          for (int64_t i = 0; i < c; ++i) {
            T* dai = da.data() + i * c;
#pragma omp simd
            for (int64_t t = 0; t < c; ++t) dai[t] += dden[i];
          }
        }
        causal_mask(da.data(), c, exclusive);
        T* dQ = dq + ch * c * dk;
        T* dK = dk_ + ch * c * dk;
        T* dV = dv_ + ch * c * dv;
        mm<T>(false, false, c, dk, c, da.data(), c, K, dk, T(0), dQ, dk);  // dq = dA k
        mm<T>(false, true, c, dk, dv, dnum, dv, S, dv, T(1), dQ, dk);  //    + dnum S^T
        mm<T>(true, false, c, dk, c, da.data(), c, Q, dk, T(0), dK, dk);  // dk = dA^T q
        mm<T>(false, true, c, dk, dv, V, dv, G, dv, T(1), dK, dk);  //    + v G^T
        mm<T>(true, false, c, dv, c, a.data(), c, dnum, dv, T(0), dV, dv);  // dv = A^T dnum
        mm<T>(false, false, c, dv, dk, K, dk, G, dv, T(1), dV, dv);  //    + k G
        for (int64_t i = 0; i < c; ++i) {
          T* dqi = dQ + i * dk;
          T* dki = dK + i * dk;
          const T di = dden[i];
#pragma omp simd
          for (int64_t d = 0; d < dk; ++d) {
            dqi[d] += di * zj[d];  // dq += dden z^T
            dki[d] += gz[d];       // dk += gz
          }
        }
        for (int64_t i = 0; i < c; ++i) {  // gz += q^T dden, once every row has used it
          const T* qi = Q + i * dk;
          const T di = dden[i];
#pragma omp simd
          for (int64_t d = 0; d < dk; ++d) gz[d] += di * qi[d];
        }
        mm<T>(true, false, dk, dv, c, Q, dk, dnum, dv, T(1), G, dv);  // G += q^T dnum (after its use)
      }
    }
  });
}

template struct LinearKernel<float>;
template struct LinearKernel<double>;

}  // namespace harness_cpu
