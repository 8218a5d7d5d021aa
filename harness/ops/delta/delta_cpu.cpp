// The delta rule's chunk form, with or without a scalar decay (DeltaNet, Gated DeltaNet), fused
// for the CPU (harness/ops/delta/chunk.py is its batched form and oracle): DeltaKernel of
// chunk_cpu.h.
//
// Per chunk (rows i of q, k, v, beta; S the state entering; b_i the log decay from the chunk start,
// g_i = e^{b_i}, f_i = e^{b_C - b_i}, G_ij = e^{b_i - b_j} for j <= i, all 1 without decay; the
// WY/UT form of harness/ops/delta/chunk.py):
//   Vt = V - (g k) S                          the values less what the entering state returns
//   M U = diag(beta) Vt,  M = I + L,  L_ij = beta_i G_ij k_i.k_j (j < i)   (one triangular solve)
//   o = (g q) S + P U,    P = tril((q k^T) * G)
//   S' = g_C S + (f k)^T U
// Backward, with dO and G' the gradient reaching S' (decay factors held fixed; the log decays'
// gradient comes from the identity below):
//   dU = (f k) G' + P^T dO                dP = tril(dO U^T) * G
//   dY = M^{-T} dU                        dVt = beta dY      dbeta = rowsum(Vt dY) + rowsum(dL * G * kk)
//   dL = -strict_lower(dY U^T)            dKK = diag(beta) dL * G (strict lower), kk = k k^T
//   dq = dP k + g (dO S^T)                dv = dVt
//   dk = dP^T q + f (U G'^T) + (dKK + dKK^T) k - g (dVt S^T)
//   G  = g_C G' + (g q)^T dO - (g k)^T dVt   (the gradient reaching S, for the chunk before)
// Log decays: with B_t the decay from the sequence start, S~_t = e^{-B_t} S_t obeys
// S~_t = (I - beta k k^T) S~_{t-1} + beta k (e^{-B_t} v_t)^T and o_t = S~_t^T (e^{B_t} q_t): the
// outputs depend on B only through e^{B} q and e^{-B} v (and e^{B_T} on the final state), so
// dB_t = q_t.dq_t - v_t.dv_t (+ <dS_T, S_T> at the last position), summed over later positions.
#include "chunk_cpu.h"

namespace harness_cpu {
namespace {

template <typename T>
struct DeltaScratch {
  std::vector<T> kk, gam, pm, mt, tcc, qg, kg, kf, vt, u, du, tmp, b, g, f;
  DeltaScratch(int64_t c, int64_t dk, int64_t dv)
      : kk(c * c), gam(c * c), pm(c * c), mt(c * c), tcc(c * c), qg(c * dk), kg(c * dk), kf(c * dk), vt(c * dv),
        u(c * dv), du(c * dv), tmp(c * std::max(dk, dv)), b(c), g(c), f(c) {}
};

// The chunk's forward quantities up to U (everything o, S' and the backward pass need). With a
// decay, G (c (c + 1) / 2 exponentials) is kept in keep_g where given (the forward of learned
// decays), or read from kept_g where given (their backward; chunk_cpu.h: kept_row): the same
// values either way.
template <typename T>
void delta_chunk_state(const T* Q, const T* K, const T* V, const T* Bt, const T* X, const T* S, int64_t c,
                       int64_t dk, int64_t dv, DeltaScratch<T>& w, const T* kept_g = nullptr,
                       T* keep_g = nullptr) {
  T* gam = w.gam.data();
  if (X) {
    T acc = 0;
    for (int64_t i = 0; i < c; ++i) w.b[i] = (acc += X[i]);
    if (kept_g) unpack_kept(kept_g, c, gam);
    for (int64_t i = 0; i < c; ++i) {
      w.g[i] = std::exp(w.b[i]);
      w.f[i] = std::exp(w.b[c - 1] - w.b[i]);
      if (!kept_g) {
        for (int64_t j = 0; j <= i; ++j) gam[i * c + j] = std::exp(w.b[i] - w.b[j]);
        std::fill(gam + i * c + i + 1, gam + (i + 1) * c, T(0));
        if (keep_g) std::copy(gam + i * c, gam + i * c + i + 1, keep_g + kept_row(i));
      }
      for (int64_t d = 0; d < dk; ++d) {
        w.qg[i * dk + d] = w.g[i] * Q[i * dk + d];
        w.kg[i * dk + d] = w.g[i] * K[i * dk + d];
        w.kf[i * dk + d] = w.f[i] * K[i * dk + d];
      }
    }
  } else {
    std::fill(w.g.begin(), w.g.end(), T(1));
    std::fill(w.f.begin(), w.f.end(), T(1));
    for (int64_t i = 0; i < c; ++i) {
      std::fill(gam + i * c, gam + i * c + i + 1, T(1));
      std::fill(gam + i * c + i + 1, gam + (i + 1) * c, T(0));
    }
    std::copy(Q, Q + c * dk, w.qg.begin());
    std::copy(K, K + c * dk, w.kg.begin());
    std::copy(K, K + c * dk, w.kf.begin());
  }
  mm<T>(false, true, c, c, dk, K, dk, K, dk, T(0), w.kk.data(), c);  // k k^T
  for (int64_t i = 0; i < c; ++i)  // M's strict lower triangle (its unit diagonal is implied)
    for (int64_t j = 0; j < i; ++j) w.mt[i * c + j] = Bt[i] * gam[i * c + j] * w.kk[i * c + j];
  std::copy(V, V + c * dv, w.vt.begin());
  mm<T>(false, false, c, dv, dk, w.kg.data(), dk, S, dv, T(1), w.vt.data(), dv, T(-1));  // Vt = V - (g k) S
  for (int64_t i = 0; i < c; ++i)
    for (int64_t e = 0; e < dv; ++e) w.u[i * dv + e] = Bt[i] * w.vt[i * dv + e];
  unit_lower_solve<T>(false, c, dv, w.mt.data(), w.u.data());  // U = M^{-1} diag(beta) Vt
  mm<T>(false, true, c, c, dk, Q, dk, K, dk, T(0), w.pm.data(), c);  // P = tril(q k^T * G)
  for (int64_t e = 0; e < c * c; ++e) w.pm[e] *= gam[e];
}

}  // namespace

template <typename T>
void DeltaKernel<T>::forward(const T* q, const T* k, const T* v, const T* beta, const T* x, const T* s0, T* o,
                             T* starts, T* s_final, T* masks, int64_t m, int64_t n, int64_t c, int64_t dk,
                             int64_t dv) {
  parallel_sequences(m, [&](int64_t first, int64_t last) {
    DeltaScratch<T> w(c, dk, dv);
    for (int64_t s = first; s < last; ++s) {
      T* S = s_final + s * dk * dv;
      start_state(S, s0, s, dk * dv);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t ch = s * n + j;
        T* start = starts + ch * dk * dv;
        std::copy(S, S + dk * dv, start);
        delta_chunk_state<T>(q + ch * c * dk, k + ch * c * dk, v + ch * c * dv, beta + ch * c,
                             x ? x + ch * c : nullptr, start, c, dk, dv, w, nullptr,
                             masks ? masks + ch * kept_row(c) : nullptr);
        T* O = o + ch * c * dv;
        mm<T>(false, false, c, dv, dk, w.qg.data(), dk, start, dv, T(0), O, dv);  // (g q) S
        mm<T>(false, false, c, dv, c, w.pm.data(), c, w.u.data(), dv, T(1), O, dv);  // + P U
        const T gc = w.g[c - 1];
        if (gc != T(1))
          for (int64_t e = 0; e < dk * dv; ++e) S[e] *= gc;
        mm<T>(true, false, dk, dv, c, w.kf.data(), dk, w.u.data(), dv, T(1), S, dv);  // + (f k)^T U
      }
    }
  });
}

template <typename T>
void DeltaKernel<T>::backward(const T* q, const T* k, const T* v, const T* beta, const T* x, const T* starts,
                              const T* s_fin, const T* dout, const T* ds_final, const T* masks, T* dq, T* dk_,
                              T* dv_, T* dbeta, T* dx, T* ds0, int64_t m, int64_t n, int64_t c, int64_t dk,
                              int64_t dv) {
  parallel_sequences(m, [&](int64_t first, int64_t last) {
    DeltaScratch<T> w(c, dk, dv);
    std::vector<T> dp(c * c), dkk(c * c), dy(c * dv);
    for (int64_t s = first; s < last; ++s) {
      T* G = ds0 + s * dk * dv;  // the running state gradient lives in the output
      const T* dS = ds_final + s * dk * dv;
      std::copy(dS, dS + dk * dv, G);
      T suffix = 0;  // the log decays' gradient summed over later positions
      if (x) {
        const T* Sf = s_fin + s * dk * dv;
        for (int64_t e = 0; e < dk * dv; ++e) suffix += dS[e] * Sf[e];
      }
      for (int64_t j = n - 1; j >= 0; --j) {
        const int64_t ch = s * n + j;
        const T* Q = q + ch * c * dk;
        const T* K = k + ch * c * dk;
        const T* V = v + ch * c * dv;
        const T* Bt = beta + ch * c;
        const T* S = starts + ch * dk * dv;
        const T* dO = dout + ch * c * dv;
        T* dQ = dq + ch * c * dk;
        T* dK = dk_ + ch * c * dk;
        T* dV = dv_ + ch * c * dv;
        T* dB = dbeta + ch * c;
        delta_chunk_state<T>(Q, K, V, Bt, x ? x + ch * c : nullptr, S, c, dk, dv, w,
                             masks ? masks + ch * kept_row(c) : nullptr);
        T* tmp = w.tmp.data();
        const T* gam = w.gam.data();
        // dU = (f k) G' + P^T dO
        mm<T>(false, false, c, dv, dk, w.kf.data(), dk, G, dv, T(0), w.du.data(), dv);
        mm<T>(true, false, c, dv, c, w.pm.data(), c, dO, dv, T(1), w.du.data(), dv);
        // dk = f (U G'^T) ...
        mm<T>(false, true, c, dk, dv, w.u.data(), dv, G, dv, T(0), tmp, dk);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t d = 0; d < dk; ++d) dK[i * dk + d] = w.f[i] * tmp[i * dk + d];
        // dP = tril(dO U^T) * G; dq = dP k + g (dO S^T); dk += dP^T q
        mm<T>(false, true, c, c, dv, dO, dv, w.u.data(), dv, T(0), dp.data(), c);
        for (int64_t e = 0; e < c * c; ++e) dp[e] *= gam[e];
        mm<T>(false, true, c, dk, dv, dO, dv, S, dv, T(0), tmp, dk);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t d = 0; d < dk; ++d) dQ[i * dk + d] = w.g[i] * tmp[i * dk + d];
        mm<T>(false, false, c, dk, c, dp.data(), c, K, dk, T(1), dQ, dk);
        mm<T>(true, false, c, dk, c, dp.data(), c, Q, dk, T(1), dK, dk);
        // dY = M^{-T} dU; dVt = beta dY; dbeta = rowsum(Vt dY)
        std::copy(w.du.begin(), w.du.end(), dy.begin());
        unit_lower_solve<T>(true, c, dv, w.mt.data(), dy.data());
        for (int64_t i = 0; i < c; ++i) {
          T acc = 0;
          for (int64_t e = 0; e < dv; ++e) {
            acc += w.vt[i * dv + e] * dy[i * dv + e];
            dV[i * dv + e] = Bt[i] * dy[i * dv + e];
          }
          dB[i] = acc;
        }
        // dL = -strict_lower(dY U^T): dbeta_i += sum_j dL_ij G_ij kk_ij, dKK = beta_i dL_ij G_ij
        mm<T>(false, true, c, c, dv, dy.data(), dv, w.u.data(), dv, T(0), w.tcc.data(), c);
        std::fill(dkk.begin(), dkk.end(), T(0));
        for (int64_t i = 0; i < c; ++i) {
          T acc = 0;
          for (int64_t jj = 0; jj < i; ++jj) {
            const T dl_g = -w.tcc[i * c + jj] * gam[i * c + jj];
            acc += dl_g * w.kk[i * c + jj];
            const T e = Bt[i] * dl_g;
            dkk[i * c + jj] += e;  // dKK + dKK^T: k k^T is symmetric
            dkk[jj * c + i] += e;
          }
          dB[i] += acc;
        }
        mm<T>(false, false, c, dk, c, dkk.data(), c, K, dk, T(1), dK, dk);
        // dk -= g (dVt S^T)
        mm<T>(false, true, c, dk, dv, dV, dv, S, dv, T(0), tmp, dk);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t d = 0; d < dk; ++d) dK[i * dk + d] -= w.g[i] * tmp[i * dk + d];
        if (x) {  // dB_i = q_i.dq_i - v_i.dv_i, summed over later positions
          T* dX = dx + ch * c;
          for (int64_t i = c - 1; i >= 0; --i) {
            T acc = 0;
            for (int64_t d = 0; d < dk; ++d) acc += Q[i * dk + d] * dQ[i * dk + d];
            for (int64_t e = 0; e < dv; ++e) acc -= V[i * dv + e] * dV[i * dv + e];
            suffix += acc;
            dX[i] = suffix;
          }
        }
        // G = g_C G' + (g q)^T dO - (g k)^T dVt
        const T gc = w.g[c - 1];
        if (gc != T(1))
          for (int64_t e = 0; e < dk * dv; ++e) G[e] *= gc;
        mm<T>(true, false, dk, dv, c, w.qg.data(), dk, dO, dv, T(1), G, dv);
        mm<T>(true, false, dk, dv, c, w.kg.data(), dk, dV, dv, T(1), G, dv, T(-1));
      }
    }
  });
}

template struct DeltaKernel<float>;
template struct DeltaKernel<double>;

}  // namespace harness_cpu
