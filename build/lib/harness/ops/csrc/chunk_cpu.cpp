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

// Row-major C (M x N) = op(A) op(B) + beta C. Column-major BLAS sees every row-major matrix
// transposed, so it is asked for C^T = op(B)^T op(A)^T.
template <typename T>
void mm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
        const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
  const T one = 1;
  blas(&tb, &ta, &n, &m, &k, &one, B, &lb, A, &la, &beta, C, &lc);
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused CPU chunk form of linear attention (forward)");
  m.def("backward", &backward, "fused CPU chunk form of linear attention (backward)");
  m.def("decay_forward", &decay_forward, "fused CPU chunk form of scalar-decayed attention (forward)");
  m.def("decay_backward", &decay_backward, "fused CPU chunk form of scalar-decayed attention (backward)");
}
