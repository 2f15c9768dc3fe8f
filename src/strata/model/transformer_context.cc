// The attention core of a block under context parallelism (transformer.h, ContextOptions; the
// plain core is transformer_layers.cc's): Ulysses' all-to-all exchanges between rows and heads,
// and ring attention's passes of keys and values around the context-parallel group.
#include "strata/comm/communicator.h"
#include "strata/model/transformer_impl.h"

namespace strata {

std::vector<int32_t> ContextOptions::positions(int T) const {
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, "context rank ", rank, " of ", size);
  std::vector<int32_t> pos;
  if (impl == Impl::Ulysses || size == 1) {
    STRATA_CHECK(T % size == 0, "a sequence of ", T, " over ", size, " context ranks");
    const int n = T / size;
    for (int t = 0; t < n; ++t) pos.push_back(int32_t(rank * n + t));
    return pos;
  }
  STRATA_CHECK(T % (2 * size) == 0, "ring attention splits a sequence of ", T, " into ", 2 * size,
               " chunks");
  const int c = T / (2 * size);
  for (int chunk : {rank, 2 * size - 1 - rank}) {
    for (int t = 0; t < c; ++t) pos.push_back(int32_t(chunk * c + t));
  }
  return pos;
}

namespace model_detail {

void TransformerImpl::context_attention_forward(const BlockActs& a, void* out) {
  if (ring()) return ring_forward(a, out);
  // Ulysses: a.qkv holds every row of this rank's groups (attn_forward exchanged it); the output
  // comes back in that layout and goes back to this rank's rows.
  const Tensor qkv = mat(a.qkv, pt_, N_, QKVl_);
  ops::attention_forward(out != nullptr ? mat(out, pt_, N_, Hl_) : Tensor(), att_view(a.att), qkv,
                         core_att_shape_);
  if (out != nullptr) ulysses_to_rows(out, core_att_shape_.rep * core_att_shape_.hd);
}

void TransformerImpl::context_attention_backward(const BlockActs& a, Tensor dout, Tensor dqkv) {
  if (ring()) return ring_backward(a, dout, dqkv);
  ulysses_to_heads(dout.data, core_att_shape_.rep * core_att_shape_.hd);
  const int64_t scratch =
      int64_t(ops::attention_backward_scratch_floats(dev_, pt_, core_att_shape_));
  ops::attention_backward(dqkv, f32(att_scratch_, scratch), dout, mat(a.qkv, pt_, N_, QKVl_),
                          att_view(a.att), core_att_shape_);
  ulysses_to_rows(dqkv.data, (core_att_shape_.rep + 2) * core_att_shape_.hd);
}

// Rows (B, Tl) of G groups of `width` elements ↔ rows (B, P·Tl) of G/P groups: block j of the
// all-to-all carries rank j's share of the groups (to_heads) or rank j's rows (to_rows); rank
// i's rows are positions [i·Tl, (i+1)·Tl) of every sequence (ContextOptions::positions).
void TransformerImpl::ulysses_to_heads(void* p, int64_t width) {
  if (ops::dry_run()) return;
  const ContextOptions& cx = chunk_.context;
  const int P = cx.size;
  const int64_t B = B_, Tl = T_, row = tp_layout_.groups * width, share = row / P;
  const int64_t block = B * Tl * share;  // elements per rank
  const Tensor x = vec(p, pt_, B * Tl * row), send = vec(ulysses_send_, pt_, P * block),
               recv = vec(ulysses_recv_, pt_, P * block);
  // send[j][b][t] = x[b][t][j's groups]
  for (int j = 0; j < P; ++j) {
    ops::copy_2d(send.slice0(j * block, (j + 1) * block), share, x.slice0(j * share, x.numel()),
                 row, B * Tl, share);
  }
  cx.comm->all_to_all(send.data, recv.data, size_t(block), pt_);
  // x[b][i·Tl + t] (now rows of `share`) = recv[i][b][t]: Tl whole rows at a time.
  for (int i = 0; i < P; ++i) {
    ops::copy_2d(x.slice0(i * Tl * share, x.numel()), P * Tl * share,
                 recv.slice0(i * block, (i + 1) * block), Tl * share, B, Tl * share);
  }
}

void TransformerImpl::ulysses_to_rows(void* p, int64_t width) {
  if (ops::dry_run()) return;
  const ContextOptions& cx = chunk_.context;
  const int P = cx.size;
  const int64_t B = B_, Tl = T_, row = tp_layout_.groups * width, share = row / P;
  const int64_t block = B * Tl * share;
  const Tensor y = vec(p, pt_, B * Tl * row), send = vec(ulysses_send_, pt_, P * block),
               recv = vec(ulysses_recv_, pt_, P * block);
  // send[i][b][t] = y[b][i·Tl + t]
  for (int i = 0; i < P; ++i) {
    ops::copy_2d(send.slice0(i * block, (i + 1) * block), Tl * share,
                 y.slice0(i * Tl * share, y.numel()), P * Tl * share, B, Tl * share);
  }
  cx.comm->all_to_all(send.data, recv.data, size_t(block), pt_);
  // y[b][t][j's groups] (rows of `row` again) = recv[j][b][t]
  for (int j = 0; j < P; ++j) {
    ops::copy_2d(y.slice0(j * share, y.numel()), row, recv.slice0(j * block, (j + 1) * block),
                 share, B * Tl, share);
  }
}

namespace {

// Tags of the ring's two exchanges on the context-parallel group.
constexpr int kRingKv = 1, kRingDkv = 2;

// Step s of the ring on rank r of P: the keys and values in hand are rank (r − s)'s. f(q0, k0,
// causal) for each pair of a query chunk and a key chunk (two each, `rows` rows, ContextOptions::
// positions) that attention connects: an earlier key chunk in full, the same chunk causally.
template <typename F>
void ring_blocks(int s, int r, int P, int rows, F&& f) {
  const int src = (r - s + P) % P;
  for (int qi = 0; qi < 2; ++qi) {
    const int qc = qi == 0 ? r : 2 * P - 1 - r;
    for (int ki = 0; ki < 2; ++ki) {
      const int kc = ki == 0 ? src : 2 * P - 1 - src;
      if (kc <= qc) f(qi * rows, ki * rows, kc == qc);
    }
  }
}

}  // namespace

// Step s of the ring (of P): unless it is the last, the keys and values in kv_[cur] start for the
// next rank while the previous rank's arrive in kv_[1 - cur], on the communication thread.
comm::Handle TransformerImpl::pass_kv(int s, int cur, int64_t kvn) {
  const ContextOptions& cx = chunk_.context;
  if (s + 1 == cx.size) return {};
  return cx.comm->send_recv_async(kv_[cur], (cx.rank + 1) % cx.size, kv_[1 - cur],
                                  (cx.rank + cx.size - 1) % cx.size, size_t(kvn), pt_, kRingKv);
}

// Step s's shape: the keys and values in hand are rank (r − s)'s, at its positions.
ops::AttentionShape TransformerImpl::ring_shape(int s) const {
  const ContextOptions& cx = chunk_.context;
  ops::AttentionShape shape = att_shape_;
  shape.kv_pos = ring_pos_[size_t((cx.rank - s + cx.size) % cx.size)].data();
  return shape;
}

// Forward: this rank's queries against every rank's keys and values, which travel the ring
// (rank r sends to r + 1) while the blocks in hand are computed; the blocks merge into o and the
// lse, which is the saved state.
void TransformerImpl::ring_forward(const BlockActs& a, void* out) {
  if (ops::dry_run()) return;
  const ContextOptions& cx = chunk_.context;
  const int P = cx.size, r = cx.rank, c = T_ / 2;
  const int64_t kvn = N_ * tp_layout_.groups * 2 * att_shape_.hd;
  const Tensor qkv = mat(a.qkv, pt_, N_, QKVl_), o = f32(o32_, N_ * Hl_), lse = att_view(a.att);
  ops::attention_lse_clear(lse);
  ops::attention_pack_kv(vec(kv_[0], pt_, kvn), qkv, att_shape_);
  int cur = 0;
  for (int s = 0; s < P; ++s) {
    comm::Handle h = pass_kv(s, cur, kvn);
    const Tensor kv = vec(kv_[cur], pt_, kvn);
    const ops::AttentionShape shape = ring_shape(s);
    ring_blocks(s, r, P, c, [&](int q0, int k0, bool causal) {
      ops::attention_block_forward(o, lse, qkv, q0, c, kv, k0, c, shape, causal);
    });
    h.wait();
    cur = 1 - cur;
  }
  if (out != nullptr) ops::copy(mat(out, pt_, N_, Hl_), mat(o32_, DType::F32, N_, Hl_));
}

// Backward: the keys and values go around again, each with the fp32 gradient of them that the
// ranks passed so far added to; after the last step each gradient makes one more hop, home.
void TransformerImpl::ring_backward(const BlockActs& a, Tensor dout, Tensor dqkv) {
  if (ops::dry_run()) return;
  const ContextOptions& cx = chunk_.context;
  const int P = cx.size, r = cx.rank, next = (r + 1) % P, prev = (r + P - 1) % P, c = T_ / 2;
  const int64_t kvn = N_ * tp_layout_.groups * 2 * att_shape_.hd;
  const Tensor qkv = mat(a.qkv, pt_, N_, QKVl_), lse = att_view(a.att);
  const Tensor dq = f32(dq32_, N_ * Hl_), delta = f32(delta_, int64_t(B_) * tp_layout_.heads * T_);
  ops::attention_delta(delta, dout, mat(a.atty, pt_, N_, Hl_), att_shape_);
  ops::fill_zero(dq);
  ops::fill_zero(f32(dkv_[0], kvn));
  ops::attention_pack_kv(vec(kv_[0], pt_, kvn), qkv, att_shape_);
  int cur = 0;
  for (int s = 0; s < P; ++s) {
    comm::Handle h = pass_kv(s, cur, kvn);
    const Tensor kv = vec(kv_[cur], pt_, kvn), dkv = f32(dkv_[cur], kvn);
    const ops::AttentionShape shape = ring_shape(s);
    ring_blocks(s, r, P, c, [&](int q0, int k0, bool causal) {
      ops::attention_block_backward(dq, dkv, dout, qkv, lse, delta, q0, c, kv, k0, c, shape,
                                    causal);
    });
    cx.comm->send_recv(dkv_[cur], next, dkv_[1 - cur], prev, size_t(kvn), DType::F32, kRingDkv);
    h.wait();
    cur = 1 - cur;
  }
  ops::attention_unpack_dqkv(dqkv, dq, f32(dkv_[cur], kvn), att_shape_);
}

}  // namespace model_detail

}  // namespace strata
