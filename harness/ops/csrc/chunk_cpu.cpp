// The chunk forms of causal linear and decayed attention, fused for the CPU: one pass over
// each sequence.
//
// The batched PyTorch forms (harness/ops/linear_chunk.py, decay_chunk.py) are bound by memory
// traffic: every product streams a whole tensor through main memory, about 29 tensor-sized
// passes for a forward and backward. Here one thread walks one sequence chunk by chunk,
// carrying the state; a chunk's q, k, v (48 KB at C = Dk = Dv = 64) stay in cache through all
// of its products, which are single-threaded BLAS calls. The backward passes walk the chunks in
// reverse carrying G, the gradient of the state. The mathematics is the batched forms', line
// for line (see their module docstrings); they are the oracles of this file's tests.
//
// Linear, per chunk (rows i of q, k, v; S, z the state entering the chunk; A = tril(q k^T)):
//   num = q S + A v      den = q.z + rowsum(A)      o = num / floor(den)
//   S += k^T v           z += colsum(k)
// and backward, with dnum = do / floor(den), dden = -(do . o) / floor(den) where the floor is
// not active, dA = tril(dnum v^T + dden 1^T), G the gradient reaching the state leaving it:
//   dq = dA k + dnum S^T + dden z^T    dk = dA^T q + v G^T + gz    dv = A^T dnum + k G
//   G += q^T dnum                      gz += q^T dden
//
// Decayed with a scalar gate, per chunk (b_i the log decay from the chunk start, b_C at its end,
// M_ij = e^{b_i - b_j} for j <= i, else 0; A = (q k^T) * M):
//   o = e^{b} q S + A v                S = e^{b_C} S + (e^{b_C - b} k)^T v
// and backward, with dA = (do v^T) * M:
//   dq = dA k + e^{b} do S^T    dk = dA^T q + e^{b_C - b} v G^T    dv = A^T do + e^{b_C - b} k G
//   db_i = q_i . dq_i - k_i . dk_i (the log-decay gradient before its suffix sum over time)
//   G = e^{b_C} G + (e^{b} q)^T do
//
// Decayed with one gate per key dimension (GLA): the same with rows, the in-chunk weights built
// block by block from products of the gates (see "per-dimension gates" below).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

// BLAS of the MKL that ships inside libtorch_cpu (column-major, Fortran calling convention).
extern "C" {
int MKL_Set_Num_Threads_Local(int);
void SGEMM(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
           const int*, const float*, const int*, const float*, float*, const int*);
void DGEMM(const char*, const char*, const int*, const int*, const int*, const double*, const double*,
           const int*, const double*, const int*, const double*, double*, const int*);
void STRSM(const char*, const char*, const char*, const char*, const int*, const int*, const float*, const float*,
           const int*, float*, const int*);
void DTRSM(const char*, const char*, const char*, const char*, const int*, const int*, const double*,
           const double*, const int*, double*, const int*);
}

namespace {

void blas(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
          const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
          const int* ldc) {
  SGEMM(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void blas(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
          const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
          const int* ldc) {
  DGEMM(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void trsm(const char* side, const char* uplo, const char* ta, const char* diag, const int* m, const int* n,
          const float* alpha, const float* a, const int* lda, float* b, const int* ldb) {
  STRSM(side, uplo, ta, diag, m, n, alpha, a, lda, b, ldb);
}

void trsm(const char* side, const char* uplo, const char* ta, const char* diag, const int* m, const int* n,
          const double* alpha, const double* a, const int* lda, double* b, const int* ldb) {
  DTRSM(side, uplo, ta, diag, m, n, alpha, a, lda, b, ldb);
}

// Row-major C (M x N) = alpha op(A) op(B) + beta C. Column-major BLAS sees every row-major matrix
// transposed, so it is asked for C^T = op(B)^T op(A)^T.
template <typename T>
void mm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
        const T* B, int64_t ldb, T beta, T* C, int64_t ldc, T alpha = T(1)) {
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  blas(&tb, &ta, &n, &m, &k, &alpha, B, &lb, A, &la, &beta, C, &lc);
}

// X = M^{-1} B (or M^{-T} B when trans) in place of B (C x N, row-major), M (C x C, row-major)
// unit lower triangular: only its strict lower triangle is read. Column-major BLAS sees X^T M^T =
// B^T with M^T upper triangular (side R), or X^T M = B^T (its transpose).
template <typename T>
void unit_lower_solve(bool trans, int64_t C, int64_t N, const T* M, T* B) {
  const char side = 'R', uplo = 'U', ta = trans ? 'T' : 'N', diag = 'U';
  const int m = static_cast<int>(N), n = static_cast<int>(C), ld_m = static_cast<int>(C), ld_b = static_cast<int>(N);
  const T one = 1;
  trsm(&side, &uplo, &ta, &diag, &m, &n, &one, M, &ld_m, B, &ld_b);
}

// |den| floored at eps with its sign kept, 0 -> +eps (harness.ops.guards.floor_denominator).
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

// Multiply the lower triangle by e^{b_i - b_j} (every exponent <= 0 for log decays <= 0) and zero
// the strict upper triangle.
template <typename T>
void decay_mask(T* a, const T* b, int64_t c) {
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j <= i; ++j) a[i * c + j] *= std::exp(b[i] - b[j]);
    std::fill(a + i * c + i + 1, a + (i + 1) * c, T(0));
  }
}

// A sequence's running state starts as its slice of `init` (size elements), or zeros without one.
template <typename T>
void start_state(T* state, const T* init, int64_t s, int64_t size) {
  if (init) std::copy(init + s * size, init + (s + 1) * size, state); else std::fill(state, state + size, T(0));
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

// One BLAS thread inside each task: the tasks already use every core.
struct SerialBlas {
  int previous;
  SerialBlas() : previous(MKL_Set_Num_Threads_Local(1)) {}
  ~SerialBlas() { MKL_Set_Num_Threads_Local(previous); }
};

template <typename T>
void forward_impl(const T* q, const T* k, const T* v, const T* s0, const T* z0, T* o, T* starts,
                  T* z_starts, T* den, T* s_final, T* z_final, int64_t m, int64_t n, int64_t c,
                  int64_t dk, int64_t dv, bool normalize, T eps, bool exclusive) {
  at::parallel_for(0, m, 1, [&](int64_t first, int64_t last) {
    SerialBlas serial;
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
void backward_impl(const T* q, const T* k, const T* v, const T* o, const T* starts, const T* z_starts,
                   const T* den, const T* dout, const T* ds_final, const T* dz_final, T* dq, T* dk_,
                   T* dv_, T* ds0, T* dz0, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv,
                   bool normalize, T eps, bool exclusive) {
  at::parallel_for(0, m, 1, [&](int64_t first, int64_t last) {
    SerialBlas serial;
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

template <typename T>
void decay_forward_impl(const T* q, const T* k, const T* v, const T* x, const T* s0, T* o, T* starts,
                        T* s_final, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv) {
  at::parallel_for(0, m, 1, [&](int64_t first, int64_t last) {
    SerialBlas serial;
    std::vector<T> a(c * c), b(c), fq(c), fk(c), qs(c * dk), ks(c * dk);
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
        decay_mask(a.data(), b.data(), c);
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
void decay_backward_impl(const T* q, const T* k, const T* v, const T* x, const T* starts, const T* dout,
                         const T* ds_final, T* dq, T* dk_, T* dv_, T* db, T* ds0, int64_t m, int64_t n,
                         int64_t c, int64_t dk, int64_t dv) {
  at::parallel_for(0, m, 1, [&](int64_t first, int64_t last) {
    SerialBlas serial;
    std::vector<T> a(c * c), da(c * c), b(c), fq(c), fk(c), mask(c * c), qs(c * dk), ks(c * dk), tmp(c * dk);
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
        std::fill(mask.begin(), mask.end(), T(1));
        decay_mask(mask.data(), b.data(), c);
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

// ---- per-dimension gates (GLA) ---------------------------------------------------------------
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

template <typename T>
void gated_forward_impl(const T* q, const T* k, const T* v, const T* ga, const T* s0, T* o, T* starts,
                        T* s_final, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv) {
  at::parallel_for(0, m, 1, [&](int64_t first, int64_t last) {
    SerialBlas serial;
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
void gated_backward_impl(const T* q, const T* k, const T* v, const T* ga, const T* starts, const T* s_fin,
                         const T* dout, const T* ds_final, T* dq, T* dk_, T* dv_, T* dx, T* ds0, int64_t m,
                         int64_t n, int64_t c, int64_t dk, int64_t dv) {
  at::parallel_for(0, m, 1, [&](int64_t first, int64_t last) {
    SerialBlas serial;
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

// ---- the delta rule (DeltaNet, Gated DeltaNet) -------------------------------------------------
// Per chunk (rows i of q, k, v, beta; S the state entering; b_i the log decay from the chunk start,
// g_i = e^{b_i}, f_i = e^{b_C - b_i}, G_ij = e^{b_i - b_j} for j <= i, all 1 without decay; the
// WY/UT form of harness/ops/delta_chunk.py):
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

template <typename T>
struct DeltaScratch {
  std::vector<T> kk, gam, pm, mt, tcc, qg, kg, kf, vt, u, du, tmp, b, g, f;
  DeltaScratch(int64_t c, int64_t dk, int64_t dv)
      : kk(c * c), gam(c * c), pm(c * c), mt(c * c), tcc(c * c), qg(c * dk), kg(c * dk), kf(c * dk), vt(c * dv),
        u(c * dv), du(c * dv), tmp(c * std::max(dk, dv)), b(c), g(c), f(c) {}
};

// The chunk's forward quantities up to U (everything o, S' and the backward pass need).
template <typename T>
void delta_chunk_state(const T* Q, const T* K, const T* V, const T* Bt, const T* X, const T* S, int64_t c,
                       int64_t dk, int64_t dv, DeltaScratch<T>& w) {
  T* gam = w.gam.data();
  if (X) {
    T acc = 0;
    for (int64_t i = 0; i < c; ++i) w.b[i] = (acc += X[i]);
    for (int64_t i = 0; i < c; ++i) {
      w.g[i] = std::exp(w.b[i]);
      w.f[i] = std::exp(w.b[c - 1] - w.b[i]);
      for (int64_t j = 0; j <= i; ++j) gam[i * c + j] = std::exp(w.b[i] - w.b[j]);
      std::fill(gam + i * c + i + 1, gam + (i + 1) * c, T(0));
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

template <typename T>
void delta_forward_impl(const T* q, const T* k, const T* v, const T* beta, const T* x, const T* s0, T* o,
                        T* starts, T* s_final, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv) {
  at::parallel_for(0, m, 1, [&](int64_t first, int64_t last) {
    SerialBlas serial;
    DeltaScratch<T> w(c, dk, dv);
    for (int64_t s = first; s < last; ++s) {
      T* S = s_final + s * dk * dv;
      start_state(S, s0, s, dk * dv);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t ch = s * n + j;
        T* start = starts + ch * dk * dv;
        std::copy(S, S + dk * dv, start);
        delta_chunk_state<T>(q + ch * c * dk, k + ch * c * dk, v + ch * c * dv, beta + ch * c,
                             x ? x + ch * c : nullptr, start, c, dk, dv, w);
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
void delta_backward_impl(const T* q, const T* k, const T* v, const T* beta, const T* x, const T* starts,
                         const T* s_fin, const T* dout, const T* ds_final, T* dq, T* dk_, T* dv_, T* dbeta,
                         T* dx, T* ds0, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv) {
  at::parallel_for(0, m, 1, [&](int64_t first, int64_t last) {
    SerialBlas serial;
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
        delta_chunk_state<T>(Q, K, V, Bt, x ? x + ch * c : nullptr, S, c, dk, dv, w);
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

void check(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, " must be a contiguous CPU tensor");
}

}  // namespace

// q, k: (M, N, C, Dk); v: (M, N, C, Dv); s0 (M, Dk, Dv) and z0 (M, Dk) or empty.
// Returns o, the entering states S (M, N, Dk, Dv) and z (M, N, Dk), den (M, N, C), S_final, z_final.
std::vector<torch::Tensor> forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor s0,
                                   torch::Tensor z0, bool normalize, double eps, bool exclusive) {
  for (auto* t : {&q, &k, &v}) check(*t, "q, k, v");
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto o = torch::empty({m, n, c, dv}, q.options());
  auto starts = torch::empty({m, n, dk, dv}, q.options());
  auto z_starts = torch::empty({m, n, dk}, q.options());
  auto den = torch::empty({m, n, normalize ? c : 0}, q.options());
  auto s_final = torch::empty({m, dk, dv}, q.options());
  auto z_final = torch::empty({m, dk}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "linear_chunk_cpu_forward", [&] {
    forward_impl<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                           s0.numel() ? s0.contiguous().data_ptr<scalar_t>() : nullptr,
                           z0.numel() ? z0.contiguous().data_ptr<scalar_t>() : nullptr,
                           o.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), z_starts.data_ptr<scalar_t>(),
                           den.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(), z_final.data_ptr<scalar_t>(),
                           m, n, c, dk, dv, normalize, static_cast<scalar_t>(eps), exclusive);
  });
  return {o, starts, z_starts, den, s_final, z_final};
}

// Gradients of forward's (o, S_final, z_final): returns dq, dk, dv, dS0, dz0.
std::vector<torch::Tensor> backward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor o,
                                    torch::Tensor starts, torch::Tensor z_starts, torch::Tensor den,
                                    torch::Tensor dout, torch::Tensor ds_final, torch::Tensor dz_final,
                                    bool normalize, double eps, bool exclusive) {
  for (auto* t : {&q, &k, &v, &o, &starts, &z_starts, &den}) check(*t, "saved tensors");
  dout = dout.contiguous();
  ds_final = ds_final.contiguous();
  dz_final = dz_final.contiguous();
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto dq = torch::empty_like(q), dkk = torch::empty_like(k), dvv = torch::empty_like(v);
  auto ds0 = torch::empty({m, dk, dv}, q.options()), dz0 = torch::empty({m, dk}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "linear_chunk_cpu_backward", [&] {
    backward_impl<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                            o.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), z_starts.data_ptr<scalar_t>(),
                            den.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(), ds_final.data_ptr<scalar_t>(),
                            dz_final.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dkk.data_ptr<scalar_t>(),
                            dvv.data_ptr<scalar_t>(), ds0.data_ptr<scalar_t>(), dz0.data_ptr<scalar_t>(),
                            m, n, c, dk, dv, normalize, static_cast<scalar_t>(eps), exclusive);
  });
  return {dq, dkk, dvv, ds0, dz0};
}

// q, k: (M, N, C, Dk); v: (M, N, C, Dv); x: (M, N, C) log decays; s0 (M, Dk, Dv) or empty.
// Returns o, the entering states S (M, N, Dk, Dv) and S_final.
std::vector<torch::Tensor> decay_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor x,
                                         torch::Tensor s0) {
  for (auto* t : {&q, &k, &v, &x}) check(*t, "q, k, v, log decays");
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto o = torch::empty({m, n, c, dv}, q.options());
  auto starts = torch::empty({m, n, dk, dv}, q.options());
  auto s_final = torch::empty({m, dk, dv}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "decay_chunk_cpu_forward", [&] {
    decay_forward_impl<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                                 x.data_ptr<scalar_t>(), s0.numel() ? s0.contiguous().data_ptr<scalar_t>() : nullptr,
                                 o.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(),
                                 m, n, c, dk, dv);
  });
  return {o, starts, s_final};
}

// Gradients of decay_forward's (o, S_final) except the final state's log-decay term: returns
// dq, dk, dv, db (M, N, C: q.dq - k.dk per position) and dS0.
std::vector<torch::Tensor> decay_backward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor x,
                                          torch::Tensor starts, torch::Tensor dout, torch::Tensor ds_final) {
  for (auto* t : {&q, &k, &v, &x, &starts}) check(*t, "saved tensors");
  dout = dout.contiguous();
  ds_final = ds_final.contiguous();
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto dq = torch::empty_like(q), dkk = torch::empty_like(k), dvv = torch::empty_like(v);
  auto db = torch::empty({m, n, c}, q.options()), ds0 = torch::empty({m, dk, dv}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "decay_chunk_cpu_backward", [&] {
    decay_backward_impl<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                                  x.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(),
                                  ds_final.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dkk.data_ptr<scalar_t>(),
                                  dvv.data_ptr<scalar_t>(), db.data_ptr<scalar_t>(), ds0.data_ptr<scalar_t>(),
                                  m, n, c, dk, dv);
  });
  return {dq, dkk, dvv, db, ds0};
}

// Per-dimension gates. q, k, a: (M, N, C, Dk), a = e^{log decay}; v: (M, N, C, Dv); s0 (M, Dk, Dv)
// or empty. Returns o, the entering states S (M, N, Dk, Dv) and S_final.
std::vector<torch::Tensor> gated_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor a,
                                         torch::Tensor s0) {
  for (auto* t : {&q, &k, &v, &a}) check(*t, "q, k, v, decays");
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  TORCH_CHECK(a.sizes() == q.sizes(), "per-dimension decays must be shaped as q");
  auto o = torch::empty({m, n, c, dv}, q.options());
  auto starts = torch::empty({m, n, dk, dv}, q.options());
  auto s_final = torch::empty({m, dk, dv}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "gated_chunk_cpu_forward", [&] {
    gated_forward_impl<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                                 a.data_ptr<scalar_t>(), s0.numel() ? s0.contiguous().data_ptr<scalar_t>() : nullptr,
                                 o.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(),
                                 m, n, c, dk, dv);
  });
  return {o, starts, s_final};
}

// Gradients of gated_forward's (o, S_final): returns dq, dk, dv, dx (M, N, C, Dk: the gradient of
// the log decays, final state's term included) and dS0.
std::vector<torch::Tensor> gated_backward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor a,
                                          torch::Tensor starts, torch::Tensor s_final, torch::Tensor dout,
                                          torch::Tensor ds_final) {
  for (auto* t : {&q, &k, &v, &a, &starts, &s_final}) check(*t, "saved tensors");
  dout = dout.contiguous();
  ds_final = ds_final.contiguous();
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto dq = torch::empty_like(q), dkk = torch::empty_like(k), dvv = torch::empty_like(v);
  auto dx = torch::empty_like(q), ds0 = torch::empty({m, dk, dv}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "gated_chunk_cpu_backward", [&] {
    gated_backward_impl<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                                  a.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(),
                                  dout.data_ptr<scalar_t>(), ds_final.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(),
                                  dkk.data_ptr<scalar_t>(), dvv.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                                  ds0.data_ptr<scalar_t>(), m, n, c, dk, dv);
  });
  return {dq, dkk, dvv, dx, ds0};
}

// The delta rule. q, k: (M, N, C, Dk); v: (M, N, C, Dv); beta (M, N, C); x (M, N, C) log decays or
// empty (no decay); s0 (M, Dk, Dv) or empty. Returns o, the entering states S (M, N, Dk, Dv), S_final.
std::vector<torch::Tensor> delta_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor beta,
                                         torch::Tensor x, torch::Tensor s0) {
  for (auto* t : {&q, &k, &v, &beta}) check(*t, "q, k, v, beta");
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto o = torch::empty({m, n, c, dv}, q.options());
  auto starts = torch::empty({m, n, dk, dv}, q.options());
  auto s_final = torch::empty({m, dk, dv}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_chunk_cpu_forward", [&] {
    delta_forward_impl<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                                 beta.data_ptr<scalar_t>(), x.numel() ? x.contiguous().data_ptr<scalar_t>() : nullptr,
                                 s0.numel() ? s0.contiguous().data_ptr<scalar_t>() : nullptr, o.data_ptr<scalar_t>(),
                                 starts.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(), m, n, c, dk, dv);
  });
  return {o, starts, s_final};
}

// Gradients of delta_forward's (o, S_final): dq, dk, dv, dbeta, dx (the log decays' gradient, final
// state's term included; empty without decay) and dS0.
std::vector<torch::Tensor> delta_backward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor beta,
                                          torch::Tensor x, torch::Tensor starts, torch::Tensor s_final,
                                          torch::Tensor dout, torch::Tensor ds_final) {
  for (auto* t : {&q, &k, &v, &beta, &starts, &s_final}) check(*t, "saved tensors");
  dout = dout.contiguous();
  ds_final = ds_final.contiguous();
  const bool gated = x.numel() > 0;
  if (gated) x = x.contiguous();
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto dq = torch::empty_like(q), dkk = torch::empty_like(k), dvv = torch::empty_like(v);
  auto dbeta = torch::empty_like(beta), dx = gated ? torch::empty_like(x) : torch::empty({0}, q.options());
  auto ds0 = torch::empty({m, dk, dv}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_chunk_cpu_backward", [&] {
    delta_backward_impl<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                                  beta.data_ptr<scalar_t>(), gated ? x.data_ptr<scalar_t>() : nullptr,
                                  starts.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(),
                                  ds_final.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dkk.data_ptr<scalar_t>(),
                                  dvv.data_ptr<scalar_t>(), dbeta.data_ptr<scalar_t>(),
                                  gated ? dx.data_ptr<scalar_t>() : nullptr, ds0.data_ptr<scalar_t>(), m, n, c, dk, dv);
  });
  return {dq, dkk, dvv, dbeta, dx, ds0};
}

void register_conv(pybind11::module& m);  // csrc/conv_cpu.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused CPU chunk form of linear attention (forward)");
  m.def("backward", &backward, "fused CPU chunk form of linear attention (backward)");
  m.def("decay_forward", &decay_forward, "fused CPU chunk form of scalar-decayed attention (forward)");
  m.def("decay_backward", &decay_backward, "fused CPU chunk form of scalar-decayed attention (backward)");
  m.def("gated_forward", &gated_forward, "fused CPU chunk form of attention with per-dimension gates (forward)");
  m.def("gated_backward", &gated_backward, "fused CPU chunk form of attention with per-dimension gates (backward)");
  m.def("delta_forward", &delta_forward, "fused CPU chunk form of the (gated) delta rule (forward)");
  m.def("delta_backward", &delta_backward, "fused CPU chunk form of the (gated) delta rule (backward)");
  register_conv(m);
}
