// What every fused CPU kernel of the extension shares: the BLAS calls, the chunk walk, and the
// declaration of each family's kernels.
//
// The extension is one module built from these files (under harness/ops; each family's beside
// its PyTorch forms, all copied into one folder to build, so they include this header by name):
//   csrc/chunk_cpu.h       this header
//   csrc/chunk_cpu.cpp     the module: tensors in and out of every kernel, and the Python bindings
//   linear/linear_cpu.cpp  linear attention (optionally normalised by q.z)
//   decay/decay_cpu.cpp    decayed attention with one scalar gate per position (RetNet, Mamba-2)
//   decay/gated_cpu.cpp    decayed attention with one gate per key dimension (GLA)
//   delta/delta_cpu.cpp    the delta rule, with or without a scalar decay (DeltaNet, Gated DeltaNet)
//   conv/conv_cpu.cpp      the short causal depthwise convolution of the mixers
// Only chunk_cpu.cpp includes <torch/extension.h> (pybind11 and all of ATen, most of a file's
// compile time): the family files work on raw pointers, include this header alone and
// instantiate their kernels for float and double, so the extension pays for that include once.
//
// Why one chunk walk: the batched PyTorch forms (chunk.py in harness/ops/linear, decay and
// delta) are bound by memory traffic, every product streaming a whole tensor through
// main memory. Here one thread walks one sequence chunk by chunk, carrying the state; a chunk's
// q, k, v (48 KB at C = Dk = Dv = 64) stay in cache through all of its products, which are
// single-threaded BLAS calls. The backward passes walk the chunks in reverse carrying G, the
// gradient of the state. Each family's mathematics is its batched form's, line for line (see
// their module docstrings); the batched forms are the oracles of the kernels' tests.
//
// Layouts (row-major, contiguous): q, k (M, N, C, Dk) and v, o (M, N, C, Dv) for M sequences of
// N chunks of C positions; states (M, Dk, Dv), the entering state of every chunk (M, N, Dk, Dv).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

namespace harness_cpu {

inline void blas(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* alpha,
                 const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
                 const int* ldc) {
  SGEMM(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void blas(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* alpha,
                 const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
                 const int* ldc) {
  DGEMM(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void trsm(const char* side, const char* uplo, const char* ta, const char* diag, const int* m, const int* n,
                 const float* alpha, const float* a, const int* lda, float* b, const int* ldb) {
  STRSM(side, uplo, ta, diag, m, n, alpha, a, lda, b, ldb);
}

inline void trsm(const char* side, const char* uplo, const char* ta, const char* diag, const int* m, const int* n,
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

// A sequence's running state starts as its slice of `init` (size elements), or zeros without one.
template <typename T>
void start_state(T* state, const T* init, int64_t s, int64_t size) {
  if (init) std::copy(init + s * size, init + (s + 1) * size, state); else std::fill(state, state + size, T(0));
}

// A chunk's (c x c) decay mask as a forward pass keeps it for its backward pass (learned decays):
// the lower triangle row by row, kept_row(c) values, row i from kept_row(i).
inline int64_t kept_row(int64_t i) { return i * (i + 1) / 2; }

// A kept mask back to (c x c), zeros above the diagonal.
template <typename T>
void unpack_kept(const T* kept, int64_t c, T* mask) {
  for (int64_t i = 0; i < c; ++i) {
    std::copy(kept + kept_row(i), kept + kept_row(i) + i + 1, mask + i * c);
    std::fill(mask + i * c + i + 1, mask + (i + 1) * c, T(0));
  }
}

// One BLAS thread inside each task: the tasks already use every core.
struct SerialBlas {
  int previous;
  SerialBlas() : previous(MKL_Set_Num_Threads_Local(1)) {}
  ~SerialBlas() { MKL_Set_Num_Threads_Local(previous); }
};

// The chunk walk of every kernel: the M sequences split among the threads, task(first, last)
// walking its sequences one after another (each one's chunks in order, or in reverse for a
// backward pass) with its own scratch and a single BLAS thread.
template <typename Task>
void parallel_sequences(int64_t m, const Task& task) {
  at::parallel_for(0, m, 1, [&](int64_t first, int64_t last) {
    SerialBlas serial;
    task(first, last);
  });
}

// ---- each family's kernels (instantiated for float and double in the family's file) -----------
// Inputs may be null where marked optional; outputs are preallocated by chunk_cpu.cpp.

template <typename T>
struct LinearKernel {  // linear_cpu.cpp
  // Optional s0 (M, Dk, Dv), z0 (M, Dk). Writes o, the entering states S (M, N, Dk, Dv) and
  // z (M, N, Dk), den (M, N, C; only when normalize), S_final, z_final.
  static void forward(const T* q, const T* k, const T* v, const T* s0, const T* z0, T* o, T* starts,
                      T* z_starts, T* den, T* s_final, T* z_final, int64_t m, int64_t n, int64_t c,
                      int64_t dk, int64_t dv, bool normalize, T eps, bool exclusive);
  // Gradients of forward's (o, S_final, z_final): writes dq, dk, dv, dS0, dz0.
  static void backward(const T* q, const T* k, const T* v, const T* o, const T* starts, const T* z_starts,
                       const T* den, const T* dout, const T* ds_final, const T* dz_final, T* dq, T* dk_,
                       T* dv_, T* ds0, T* dz0, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv,
                       bool normalize, T eps, bool exclusive);
};

template <typename T>
struct ScalarDecayKernel {  // decay_cpu.cpp
  // x (M, N, C) log decays; optional s0. Writes o, the entering states S and S_final, and, where
  // masks is not null, every chunk's decay mask for the backward pass (M, N, C (C + 1) / 2: the
  // lower triangle row by row).
  static void forward(const T* q, const T* k, const T* v, const T* x, const T* s0, T* o, T* starts,
                      T* s_final, T* masks, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv);
  // Gradients of forward's (o, S_final) except the final state's log-decay term: writes dq, dk,
  // dv, db (M, N, C: q.dq - k.dk per position) and dS0. masks: the forward's, or null (recomputed).
  static void backward(const T* q, const T* k, const T* v, const T* x, const T* starts, const T* dout,
                       const T* ds_final, const T* masks, T* dq, T* dk_, T* dv_, T* db, T* ds0, int64_t m,
                       int64_t n, int64_t c, int64_t dk, int64_t dv);
};

template <typename T>
struct GatedKernel {  // gated_cpu.cpp
  // ga (M, N, C, Dk) the gates e^{log decay}; optional s0. Writes o, the entering states S, S_final.
  static void forward(const T* q, const T* k, const T* v, const T* ga, const T* s0, T* o, T* starts,
                      T* s_final, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv);
  // Gradients of forward's (o, S_final): writes dq, dk, dv, dx (M, N, C, Dk: the log decays'
  // gradient, the final state's term included) and dS0.
  static void backward(const T* q, const T* k, const T* v, const T* ga, const T* starts, const T* s_fin,
                       const T* dout, const T* ds_final, T* dq, T* dk_, T* dv_, T* dx, T* ds0, int64_t m,
                       int64_t n, int64_t c, int64_t dk, int64_t dv);
};

template <typename T>
struct DeltaKernel {  // delta_cpu.cpp
  // beta (M, N, C); optional x (M, N, C) log decays (none: the plain delta rule) and s0. Writes o,
  // the entering states S and S_final, and, where masks is not null (only with x), every chunk's
  // decay mask for the backward pass (M, N, C (C + 1) / 2: the lower triangle row by row).
  static void forward(const T* q, const T* k, const T* v, const T* beta, const T* x, const T* s0, T* o,
                      T* starts, T* s_final, T* masks, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv);
  // Gradients of forward's (o, S_final): writes dq, dk, dv, dbeta, dx (only with x: the log
  // decays' gradient, the final state's term included) and dS0. masks: the forward's, or null.
  static void backward(const T* q, const T* k, const T* v, const T* beta, const T* x, const T* starts,
                       const T* s_fin, const T* dout, const T* ds_final, const T* masks, T* dq, T* dk_, T* dv_,
                       T* dbeta, T* dx, T* ds0, int64_t m, int64_t n, int64_t c, int64_t dk, int64_t dv);
};

template <typename T>
struct ConvKernel {  // conv_cpu.cpp; x, y (B, L, C), w (members, K, C), bias (members, C); members divides B
  static void forward(const T* x, const T* w, const T* bias, T* y, int64_t B, int64_t L, int64_t C, int64_t K,
                      int64_t members);
  // Writes dx (B, L, C), dw (members, K, C), dbias (members, C).
  static void backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* dbias, int64_t B, int64_t L,
                       int64_t C, int64_t K, int64_t members);
};

}  // namespace harness_cpu
