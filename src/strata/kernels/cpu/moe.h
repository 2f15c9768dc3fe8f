// A mixture of experts' routing, dispatch and combine (ops.h documents each). S: the storage type
// of activations; the router's values are fp32.
#pragma once

#include <cstdint>

namespace strata::kernels {

// The most expert groups the sigmoid router takes (config/model.cc refuses more).
inline constexpr int kMaxExpertGroups = 64;

template <typename S>
void gather_rows(S* out, const S* x, const int32_t* rows, int64_t R, int64_t C);

void moe_route_forward(float* probs, float* lse, int32_t* top, float* gates, const float* logits,
                       int64_t N, int E, int k, bool norm_topk);
// DeepSeek-V3's (ops::MoeRoute::sigmoid). bias: E, or nullptr.
void moe_route_sigmoid_forward(float* probs, float* lse, int32_t* top, float* gates,
                               const float* logits, const float* bias, int64_t N, int E, int k,
                               bool norm_topk, int groups, int topk_groups, float scale);
// coef (N/T, E), or nullptr: the balancing loss's gradient with respect to each row's normalised
// scores s_e / (Σ s + 1e-20), per sequence of T rows.
void moe_route_sigmoid_backward(float* dlogits, const float* dgates, const float* scores,
                                const int32_t* top, const float* coef, int64_t N, int E, int k,
                                bool norm_topk, float scale, int64_t T);
void moe_plan(int32_t* counts, int32_t* pos, int32_t* rows, const int32_t* top, const float* probs,
              int64_t N, int E, int k, int64_t capacity, int64_t group, bool by_probs);
// normalized: each row's probabilities over their sum (+1e-20) first (the sigmoid router's).
void moe_balance_stats(float* stats, const float* probs, const int32_t* top, int64_t N, int E,
                       int k, int64_t T, bool normalized);
void moe_route_backward(float* dlogits, const float* dgates, const float* probs, const float* lse,
                        const int32_t* top, const float* gates, const float* coef, int64_t N, int E,
                        int k, bool norm_topk, int64_t T, float z);

template <typename S>
void moe_combine(S* out, const S* y, const int32_t* pos, const float* w, int64_t N, int k,
                 int64_t C);
template <typename S>
void moe_combine_backward(S* dy, float* dw, const S* dout, const S* y, const int32_t* pos,
                          const float* w, int64_t N, int k, int64_t C);

template <typename S>
void moe_gate_forward(S* out, const S* s, float* g, int64_t N, int64_t C);
template <typename S>
void moe_gate_backward(S* ds, float* dg, const S* dout, const S* s, const float* g, int64_t N,
                       int64_t C);

}  // namespace strata::kernels
