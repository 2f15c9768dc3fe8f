// The CUDA backend of the kernel interface (kernels/ops.h, DESIGN.md §10): the same calls, for
// views on Device::CUDA. The dispatch (kernels/dispatch.h, ops*.cc) has checked the views (one
// device, dtypes, sizes) before it calls here, so these functions only launch work. Every kernel
// runs on the current device's compute stream (runtime.h) and returns without waiting for it;
// a value a call returns (sum_squares, check_tokens) is read back after the stream's work.
//
// Built when nvcc is found (STRATA_CUDA, top CMakeLists.txt); STRATA_HAVE_CUDA is 1 in the build
// then. Internal to kernels/: code above the interface calls ops.h only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/core/tensor.h"
#include "strata/kernels/ops.h"

namespace strata::ops::cuda {

// --- memory (runtime.cc) ----------------------------------------------------------------------
void fill_zero(Tensor t);
void copy(Tensor dst, Tensor src);  // dtype conversion on the device (elementwise.cu)
void copy_2d(Tensor dst, int64_t dst_ld, Tensor src, int64_t src_ld, int64_t rows,
             int64_t cols);  // runtime.cc
void copy_from_host(Tensor dst, const void* src);
void copy_to_host(void* dst, Tensor src);
void add_inplace(Tensor y, Tensor x);
void add_bias(Tensor y, Tensor b);
void scale_inplace(Tensor t, float s);
double sum_squares(Tensor t);
double sum(Tensor t);

// --- matmul (gemm.cc: cuBLASLt) -----------------------------------------------------------------
void gemm(Tensor c, Tensor a, Tensor b, const Gemm& g);
void linear_forward(Tensor y, Tensor x, Tensor w, Tensor b);
void linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate);
void linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x);
void linear_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w);

// --- normalisation (norm.cu) --------------------------------------------------------------------
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b,
                       float eps);
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, float w_offset);
void layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                        Tensor w, Tensor mean, Tensor rstd);
void rmsnorm_backward(Tensor dx, Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor w,
                      Tensor rstd, float w_offset);
void layernorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor mean, Tensor rstd);
void layernorm_backward_weight(Tensor dw, Tensor db, Tensor scratch, Tensor dy, Tensor x,
                               Tensor mean, Tensor rstd);
void rmsnorm_backward_input(Tensor dx, Tensor dy, Tensor x, Tensor w, Tensor rstd, float w_offset);
void rmsnorm_backward_weight(Tensor dw, Tensor scratch, Tensor dy, Tensor x, Tensor rstd);

// --- attention (attention.cu) and rotary embedding (rope.cu) ------------------------------------
void attention_forward(Tensor out, Tensor att, Tensor qkv, const AttentionShape& s);
void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att,
                        const AttentionShape& s);
void rope_forward(Tensor qkv, const AttentionShape& s, const Rope& rope);
void rope_backward(Tensor dqkv, const AttentionShape& s, const Rope& rope);

// --- q/k normalisation (qk_norm.cu) -----------------------------------------------------------
void qk_norm_sumsq(Tensor sumsq, Tensor qkv, const AttentionShape& s);
void qk_norm_forward(Tensor out, Tensor rstd, Tensor qkv, Tensor wq, Tensor wk, Tensor sumsq,
                     const AttentionShape& s, const QkNorm& n);
void qk_norm_backward_dot(Tensor dot, Tensor dout, Tensor qkv, Tensor wq, Tensor wk, Tensor rstd,
                          const AttentionShape& s, const QkNorm& n);
void qk_norm_backward(Tensor dqkv, Tensor dwq, Tensor dwk, Tensor dout, Tensor qkv, Tensor wq,
                      Tensor wk, Tensor rstd, Tensor dot, const AttentionShape& s, const QkNorm& n);

// --- activations (activation.cu) ----------------------------------------------------------------
void gelu_forward(Tensor out, Tensor x);
void gelu_backward(Tensor dx, Tensor x, Tensor dy);
void swiglu_forward(Tensor out, Tensor x);
void swiglu_backward(Tensor dx, Tensor dy, Tensor x);
void geglu_forward(Tensor out, Tensor x);
void geglu_backward(Tensor dx, Tensor dy, Tensor x);

// --- embeddings (embedding.cu) ------------------------------------------------------------------
void embedding_forward(Tensor out, Tensor tokens, Tensor rows, int64_t row_begin, int64_t row_end);
void embedding_backward(Tensor drows, Tensor dout, Tensor tokens, int64_t row_begin,
                        int64_t row_end);
void position_forward(Tensor out, Tensor wpe, int64_t T, int64_t pos0, const int32_t* doc_begin,
                      int64_t seq);
void position_backward(Tensor dwpe, Tensor dout, int64_t T, int64_t pos0, const int32_t* doc_begin,
                       int64_t seq);

// --- cross-entropy (cross_entropy.cu; the logits' soft cap: elementwise.cu) ----------------------
void softcap_inplace(Tensor t, float cap);
void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets);
void cross_entropy_stats(Tensor losses, Tensor stats, Tensor logits, Tensor targets);
void ce_dlogits(Tensor out, int64_t ldo, Tensor logits, Tensor targets, Tensor stats, int64_t c0,
                int64_t cols, int64_t v0, int64_t valid, float dloss, float softcap);
void vocab_ce_max(Tensor rowmax, Tensor logits, int64_t valid);
void vocab_ce_sums(Tensor sums, Tensor logits, Tensor targets, Tensor gmax, int64_t v0,
                   int64_t valid);
void vocab_ce_finish(Tensor losses, Tensor targets, Tensor gmax, Tensor sums);
void max_rows(Tensor out, Tensor in);

// --- optimizer (optimizer.cu) -------------------------------------------------------------------
void adam_step(Tensor master, Tensor param, Tensor grad, Tensor m, Tensor v, const AdamArgs& a);
void sgd_step(Tensor master, Tensor param, Tensor grad, Tensor buf, const SgdArgs& a);

// --- mixture of experts (moe.cu) -----------------------------------------------------------------
void moe_route_forward(Tensor probs, Tensor lse, Tensor top, Tensor gates, Tensor logits,
                       const MoeRoute& r, Tensor bias);
void moe_plan(Tensor counts, Tensor pos, Tensor rows, Tensor top, Tensor probs, int experts,
              const MoeCapacity& capacity);
void moe_balance_stats(Tensor stats, Tensor probs, Tensor top, int64_t T, bool normalized);
void moe_route_backward(Tensor dlogits, Tensor dgates, Tensor probs, Tensor lse, Tensor top,
                        Tensor gates, Tensor coef, int64_t T, float z, const MoeRoute& r);
void gather_rows(Tensor out, Tensor x, Tensor rows);
void moe_combine(Tensor out, Tensor y, Tensor pos, Tensor w);
void moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor pos, Tensor w);
void moe_gate_forward(Tensor out, Tensor s, Tensor g);
void moe_gate_backward(Tensor ds, Tensor dg, Tensor dout, Tensor s, Tensor g);

// --- tokens (elementwise.cu) --------------------------------------------------------------------
// The index of the first token of t (n int32) outside [lo, hi), or -1; and the count of t >= 0.
int64_t find_token_outside(const int32_t* t, int64_t n, int64_t lo, int64_t hi);
int64_t count_nonnegative(const int32_t* t, int64_t n);

}  // namespace strata::ops::cuda
