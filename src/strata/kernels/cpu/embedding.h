// Token and position embeddings. S: storage type of activations and parameters (float, bf16,
// f16); G: type parameter gradients accumulate in. Computation is in fp32.
#pragma once

#include <cstdint>

#include "strata/core/dtype.h"

namespace strata::kernels {

// Rows [row_begin, row_end) of the token embedding at a time, so that the (V, C) table can be
// held one piece at a time.
// out[b,t] (C) = rows[tokens[b,t] - row_begin] where that token lies in the range; other
// positions are untouched. rows (row_end - row_begin, C); tokens (B,T); out (B,T,C).
template <typename S>
void embedding_forward(S* out, const int32_t* tokens, const S* rows, int64_t row_begin,
                       int64_t row_end, int B, int T, int C);
// out (N,C) row n += wpe[pos[t]], t = (pos0 + n) % T (one rounding of the sum: out holds a token
// row exactly). pos0 >= 0 is the index of row 0 in its sequence: rows of a sequence shard start
// mid-sequence. pos (T): the position of each of a sequence's T rows (context parallelism holds
// parts of longer sequences); nullptr: t itself. doc_begin (B, seq), or nullptr: with documents
// (ops::AttentionShape's) row n of sequence b = (pos0 + n) / T at position p takes the table's
// row p − doc_begin[b·seq + p], its position in its document.
template <typename S>
void position_forward(S* out, const S* wpe, int64_t N, int T, int C, int64_t pos0,
                      const int32_t* pos = nullptr, const int32_t* doc_begin = nullptr,
                      int64_t seq = 0);

// drows (row_end - row_begin, C) += dout[b,t] at row tokens[b,t] - row_begin for tokens in the
// range; dout (B,T,C). Threads own channel ranges, so repeated tokens add in a fixed order.
template <typename S, typename G>
void embedding_backward(G* drows, int64_t row_begin, int64_t row_end, const S* dout,
                        const int32_t* tokens, int B, int T, int C);
// dwpe row r += Σ of the rows n of dout (N,C) that position_forward gave row r of the table,
// summed in fp32 in increasing n, then added once (only the rows some n reaches).
template <typename S, typename G>
void position_backward(G* dwpe, const S* dout, int64_t N, int T, int C, int64_t pos0,
                       const int32_t* pos = nullptr, const int32_t* doc_begin = nullptr,
                       int64_t seq = 0);

// The index of the first of tokens (n) outside [lo, hi), or -1 when there is none.
int64_t find_token_outside(const int32_t* tokens, int64_t n, int64_t lo, int64_t hi);
// How many of tokens (n) are >= 0 (targets < 0 are ignored rows).
int64_t count_nonnegative(const int32_t* tokens, int64_t n);

}  // namespace strata::kernels
