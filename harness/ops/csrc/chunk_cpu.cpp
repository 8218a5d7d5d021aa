// The extension module of the fused CPU kernels: tensors in and out of every family's kernel
// (shapes checked, outputs allocated, float32/float64 dispatched) and their Python bindings,
// the functions harness.ops.fused_cpu.kernels() returns. The kernels themselves are in the
// family files (see chunk_cpu.h for the list and for why only this file includes
// <torch/extension.h>).
#include <ATen/EmptyTensor.h>
#include <torch/extension.h>

#include "chunk_cpu.h"

namespace {

void check(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, " must be a contiguous CPU tensor");
}

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
    using Kernel = harness_cpu::LinearKernel<scalar_t>;
    Kernel::forward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
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
    using Kernel = harness_cpu::LinearKernel<scalar_t>;
    Kernel::backward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                     o.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), z_starts.data_ptr<scalar_t>(),
                     den.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(), ds_final.data_ptr<scalar_t>(),
                     dz_final.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dkk.data_ptr<scalar_t>(),
                     dvv.data_ptr<scalar_t>(), ds0.data_ptr<scalar_t>(), dz0.data_ptr<scalar_t>(),
                     m, n, c, dk, dv, normalize, static_cast<scalar_t>(eps), exclusive);
  });
  return {dq, dkk, dvv, ds0, dz0};
}

// The chunks' decay masks a forward keeps for its backward pass, (M, N, C (C + 1) / 2), or an empty
// tensor. Every value is written by the kernel: allocated without the fill that deterministic mode
// gives torch::empty (a pass over memory as large as the masks).
torch::Tensor kept_masks(bool keep, int64_t m, int64_t n, int64_t c, const torch::Tensor& like) {
  if (!keep) return torch::empty({0}, like.options());
  return at::Tensor(
      at::detail::empty_cpu({m, n, harness_cpu::kept_row(c)}, like.scalar_type(), false, std::nullopt));
}

// q, k: (M, N, C, Dk); v: (M, N, C, Dv); x: (M, N, C) log decays; s0 (M, Dk, Dv) or empty.
// Returns o, the entering states S (M, N, Dk, Dv), S_final and, with keep_masks, the chunks' decay
// masks (M, N, C (C + 1) / 2, lower triangles) for decay_backward (else empty).
std::vector<torch::Tensor> decay_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor x,
                                         torch::Tensor s0, bool keep_masks) {
  for (auto* t : {&q, &k, &v, &x}) check(*t, "q, k, v, log decays");
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto o = torch::empty({m, n, c, dv}, q.options());
  auto starts = torch::empty({m, n, dk, dv}, q.options());
  auto s_final = torch::empty({m, dk, dv}, q.options());
  auto masks = kept_masks(keep_masks, m, n, c, q);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "decay_chunk_cpu_forward", [&] {
    using Kernel = harness_cpu::ScalarDecayKernel<scalar_t>;
    Kernel::forward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                    x.data_ptr<scalar_t>(), s0.numel() ? s0.contiguous().data_ptr<scalar_t>() : nullptr,
                    o.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(),
                    keep_masks ? masks.data_ptr<scalar_t>() : nullptr, m, n, c, dk, dv);
  });
  return {o, starts, s_final, masks};
}

// Gradients of decay_forward's (o, S_final) except the final state's log-decay term: returns
// dq, dk, dv, db (M, N, C: q.dq - k.dk per position) and dS0. masks: decay_forward's, or empty
// (the kernel computes them again).
std::vector<torch::Tensor> decay_backward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor x,
                                          torch::Tensor starts, torch::Tensor dout, torch::Tensor ds_final,
                                          torch::Tensor masks) {
  for (auto* t : {&q, &k, &v, &x, &starts}) check(*t, "saved tensors");
  if (masks.numel()) check(masks, "saved decay masks");
  dout = dout.contiguous();
  ds_final = ds_final.contiguous();
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto dq = torch::empty_like(q), dkk = torch::empty_like(k), dvv = torch::empty_like(v);
  auto db = torch::empty({m, n, c}, q.options()), ds0 = torch::empty({m, dk, dv}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "decay_chunk_cpu_backward", [&] {
    using Kernel = harness_cpu::ScalarDecayKernel<scalar_t>;
    Kernel::backward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                     x.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(),
                     ds_final.data_ptr<scalar_t>(), masks.numel() ? masks.data_ptr<scalar_t>() : nullptr,
                     dq.data_ptr<scalar_t>(), dkk.data_ptr<scalar_t>(), dvv.data_ptr<scalar_t>(),
                     db.data_ptr<scalar_t>(), ds0.data_ptr<scalar_t>(), m, n, c, dk, dv);
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
    using Kernel = harness_cpu::GatedKernel<scalar_t>;
    Kernel::forward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
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
    using Kernel = harness_cpu::GatedKernel<scalar_t>;
    Kernel::backward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                     a.data_ptr<scalar_t>(), starts.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(),
                     dout.data_ptr<scalar_t>(), ds_final.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(),
                     dkk.data_ptr<scalar_t>(), dvv.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(),
                     ds0.data_ptr<scalar_t>(), m, n, c, dk, dv);
  });
  return {dq, dkk, dvv, dx, ds0};
}

// The delta rule. q, k: (M, N, C, Dk); v: (M, N, C, Dv); beta (M, N, C); x (M, N, C) log decays or
// empty (no decay); s0 (M, Dk, Dv) or empty. Returns o, the entering states S (M, N, Dk, Dv), S_final
// and, with keep_masks and a decay, the chunks' decay masks for delta_backward (else empty).
std::vector<torch::Tensor> delta_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor beta,
                                         torch::Tensor x, torch::Tensor s0, bool keep_masks) {
  for (auto* t : {&q, &k, &v, &beta}) check(*t, "q, k, v, beta");
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto o = torch::empty({m, n, c, dv}, q.options());
  auto starts = torch::empty({m, n, dk, dv}, q.options());
  auto s_final = torch::empty({m, dk, dv}, q.options());
  auto masks = kept_masks(keep_masks && x.numel(), m, n, c, q);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_chunk_cpu_forward", [&] {
    using Kernel = harness_cpu::DeltaKernel<scalar_t>;
    Kernel::forward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                    beta.data_ptr<scalar_t>(), x.numel() ? x.contiguous().data_ptr<scalar_t>() : nullptr,
                    s0.numel() ? s0.contiguous().data_ptr<scalar_t>() : nullptr, o.data_ptr<scalar_t>(),
                    starts.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(),
                    masks.numel() ? masks.data_ptr<scalar_t>() : nullptr, m, n, c, dk, dv);
  });
  return {o, starts, s_final, masks};
}

// Gradients of delta_forward's (o, S_final): dq, dk, dv, dbeta, dx (the log decays' gradient, final
// state's term included; empty without decay) and dS0.
std::vector<torch::Tensor> delta_backward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor beta,
                                          torch::Tensor x, torch::Tensor starts, torch::Tensor s_final,
                                          torch::Tensor dout, torch::Tensor ds_final, torch::Tensor masks) {
  for (auto* t : {&q, &k, &v, &beta, &starts, &s_final}) check(*t, "saved tensors");
  if (masks.numel()) check(masks, "saved decay masks");
  dout = dout.contiguous();
  ds_final = ds_final.contiguous();
  const bool gated = x.numel() > 0;
  if (gated) x = x.contiguous();
  const auto m = q.size(0), n = q.size(1), c = q.size(2), dk = q.size(3), dv = v.size(3);
  auto dq = torch::empty_like(q), dkk = torch::empty_like(k), dvv = torch::empty_like(v);
  auto dbeta = torch::empty_like(beta), dx = gated ? torch::empty_like(x) : torch::empty({0}, q.options());
  auto ds0 = torch::empty({m, dk, dv}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "delta_chunk_cpu_backward", [&] {
    using Kernel = harness_cpu::DeltaKernel<scalar_t>;
    Kernel::backward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                     beta.data_ptr<scalar_t>(), gated ? x.data_ptr<scalar_t>() : nullptr,
                     starts.data_ptr<scalar_t>(), s_final.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(),
                     ds_final.data_ptr<scalar_t>(), masks.numel() ? masks.data_ptr<scalar_t>() : nullptr,
                     dq.data_ptr<scalar_t>(), dkk.data_ptr<scalar_t>(), dvv.data_ptr<scalar_t>(),
                     dbeta.data_ptr<scalar_t>(),
                     gated ? dx.data_ptr<scalar_t>() : nullptr, ds0.data_ptr<scalar_t>(), m, n, c, dk, dv);
  });
  return {dq, dkk, dvv, dbeta, dx, ds0};
}

// The taps' shape says how many members share the call: w (K, C), bias (C), or w (G, K, C),
// bias (G, C) for G members of B / G sequences each. Returns (K, C, members).
std::tuple<int64_t, int64_t, int64_t> conv_sizes(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 || w.dim() == 3, "conv: weight (K, C) or (members, K, C), got ", w.dim(), " dimensions");
  const int64_t members = w.dim() == 3 ? w.size(0) : 1;
  const int64_t K = w.size(-2), C = w.size(-1);
  TORCH_CHECK(x.size(2) == C, "conv: x has ", x.size(2), " channels, the weight ", C);
  TORCH_CHECK(x.size(0) % members == 0, "conv: ", x.size(0), " sequences do not divide among ", members, " members");
  return {K, C, members};
}

// x (B, T, C), w (K, C) or (G, K, C), bias (C) or (G, C) -> y (B, T, C).
torch::Tensor conv_forward(torch::Tensor x, torch::Tensor w, torch::Tensor bias) {
  for (auto* t : {&x, &w, &bias}) check(*t, "x, weight, bias");
  const auto [K, C, members] = conv_sizes(x, w);
  TORCH_CHECK(bias.numel() == members * C, "conv: bias has ", bias.numel(), " elements, not ", members * C);
  const auto B = x.size(0), L = x.size(1);
  auto y = torch::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_conv_cpu_forward", [&] {
    using Kernel = harness_cpu::ConvKernel<scalar_t>;
    Kernel::forward(x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(),
                    y.data_ptr<scalar_t>(), B, L, C, K, members);
  });
  return y;
}

// Returns dx (B, T, C), dw shaped as w, dbias (C) or (G, C).
std::vector<torch::Tensor> conv_backward(torch::Tensor x, torch::Tensor w, torch::Tensor dy) {
  for (auto* t : {&x, &w}) check(*t, "x, weight");
  dy = dy.contiguous();
  const auto [K, C, members] = conv_sizes(x, w);
  const auto B = x.size(0), L = x.size(1);
  auto dx = torch::empty_like(x), dw = torch::empty_like(w);
  auto dbias = w.dim() == 3 ? torch::empty({members, C}, x.options()) : torch::empty({C}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_conv_cpu_backward", [&] {
    using Kernel = harness_cpu::ConvKernel<scalar_t>;
    Kernel::backward(x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                     dx.data_ptr<scalar_t>(), dw.data_ptr<scalar_t>(), dbias.data_ptr<scalar_t>(),
                     B, L, C, K, members);
  });
  return {dx, dw, dbias};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused CPU chunk form of linear attention (forward)");
  m.def("backward", &backward, "fused CPU chunk form of linear attention (backward)");
  m.def("decay_forward", &decay_forward, "fused CPU chunk form of scalar-decayed attention (forward)");
  m.def("decay_backward", &decay_backward, "fused CPU chunk form of scalar-decayed attention (backward)");
  m.def("gated_forward", &gated_forward, "fused CPU chunk form of attention with per-dimension gates (forward)");
  m.def("gated_backward", &gated_backward, "fused CPU chunk form of attention with per-dimension gates (backward)");
  m.def("delta_forward", &delta_forward, "fused CPU chunk form of the (gated) delta rule (forward)");
  m.def("delta_backward", &delta_backward, "fused CPU chunk form of the (gated) delta rule (backward)");
  m.def("conv_forward", &conv_forward, "fused CPU short causal depthwise convolution (forward)");
  m.def("conv_backward", &conv_backward, "fused CPU short causal depthwise convolution (backward)");
}
