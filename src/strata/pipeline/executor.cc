#include "strata/pipeline/executor.h"

#include <algorithm>
#include <chrono>

#include "strata/comm/communicator.h"
#include "strata/comm/flight_recorder.h"
#include "strata/comm/peer_exchange.h"
#include "strata/core/check.h"
#include "strata/kernels/ops.h"

namespace strata::pipeline {

ChunkSlots chunk_slots(const std::vector<Action>& stage_schedule, int virtual_stages) {
  // Activation slots per chunk: the most micro-batches whose forward ran and whose weight
  // gradients did not, in this stage's list.
  // Input slots: the most whose forward ran and whose input gradient did not.
  const size_t v = size_t(virtual_stages);
  ChunkSlots r;
  r.slots.assign(v, 1), r.input_slots.assign(v, 1);
  std::vector<int> in_flight(v, 0), awaiting(v, 0);
  for (const Action& a : stage_schedule) {
    const size_t k = size_t(a.chunk);
    if (a.op == Op::Forward) {
      r.slots[k] = std::max(r.slots[k], ++in_flight[k]);
      r.input_slots[k] = std::max(r.input_slots[k], ++awaiting[k]);
    }
    if (a.op == Op::Backward || a.op == Op::BackwardInput) --awaiting[k];
    if (a.op == Op::Backward || a.op == Op::BackwardWeight) --in_flight[k];
    if (a.op == Op::BackwardInput) r.defer_weight = true;
  }
  return r;
}

int send_ring_slots(const ChunkSlots& s) {
  // Sends a peer has not yet received: a chunk's activation sends are received before its
  // micro-batch's gradient comes back (at most its slots), its gradient sends before the
  // upstream chunk frees that micro-batch (at most as many).
  int ring = 2;
  for (int n : s.slots) ring += 2 * n;
  return ring;
}

size_t pipeline_message_bytes(const ExecutorOptions& o, int tp, bool sequence_parallel) {
  // Hidden states between chunks: (rows, C), rows = B·T or B·T/tp under sequence parallelism.
  const int64_t rows = int64_t(o.micro_batch) * o.seq_len / (sequence_parallel && tp > 1 ? tp : 1);
  return size_t(rows) * size_t(o.hidden) * dtype_size(o.param_dtype);
}

namespace {

std::vector<Action> stage_schedule(const ExecutorOptions& o) {
  ScheduleSpec sched;
  sched.kind = o.schedule;
  sched.stages = o.stages, sched.micro = o.micro_batches, sched.virtual_stages = o.virtual_stages;
  return generate(sched)[size_t(o.stage)];
}

// Local chunk k of the stage: its units, slots and recompute.
ChunkOptions chunk_options(const ExecutorOptions& o, const StagePlan& plan, const ChunkSlots& cs,
                           int k) {
  const int g = global_chunk(k, o.stage, o.stages);
  ChunkOptions c;
  c.unit_begin = plan.chunks[size_t(g)].first, c.unit_end = plan.chunks[size_t(g)].second;
  c.slots = cs.slots[size_t(k)];
  c.input_slots = cs.input_slots[size_t(k)];
  c.defer_weight = cs.defer_weight;
  c.recompute = o.recompute;
  c.context = o.context;
  c.experts = o.experts;
  return c;
}

}  // namespace

void dry_run_stage(const ExecutorOptions& o, const StagePlan& plan, const ModelSpec& spec,
                   UnitHook& hook, bool train) {
  const ops::DryRun dry;
  // Whole experts route sequence-parallel rows: the shape says so, with a sequence of one token
  // for each tensor-parallel rank (the units' order depends on neither).
  tp::Group shape(spec.tp.size, spec.tp.rank, spec.ep.whole);
  const int tokens = spec.ep.whole ? spec.tp.size : 1;
  const std::vector<Action> schedule = stage_schedule(o);
  const ChunkSlots cs = chunk_slots(schedule, o.virtual_stages);
  const int last = o.stages * o.virtual_stages - 1;
  std::vector<std::unique_ptr<Transformer>> chunks;
  for (int k = 0; k < o.virtual_stages; ++k) {
    ChunkOptions c = chunk_options(o, plan, cs, k);
    c.recompute.partition = false, c.recompute.host = false;  // no communicator, no host pool
    c.context = {};       // the units' order does not depend on the sequence's split
    c.experts = nullptr;  // nor on where the experts' rows go
    chunks.push_back(
        make_transformer(spec, DType::F32, DType::F32, nullptr, nullptr, tokens, 1, c, &shape));
  }
  const std::vector<int32_t> token(size_t(tokens), 0);
  alignas(64) char nowhere[64] = {};  // hidden states no dry pass reads
  const auto forward = [&](int micro, int k, bool training) {
    const int g = global_chunk(k, o.stage, o.stages);
    Transformer& c = *chunks[size_t(k)];
    c.forward(micro, g == 0 ? token.data() : nullptr, g == 0 ? Tensor() : c.hidden_view(nowhere),
              g == last ? token.data() : nullptr, 1.0f, training, &hook);
  };
  if (!train) {
    for (int k = 0; k < o.virtual_stages; ++k) forward(0, k, false);
    return;
  }
  for (const Action& a : schedule) {
    const int g = global_chunk(a.chunk, o.stage, o.stages);
    Transformer& c = *chunks[size_t(a.chunk)];
    switch (a.op) {
      case Op::Forward:
        forward(a.micro, a.chunk, true);
        break;
      case Op::Backward:
      case Op::BackwardInput:
        c.backward_input(a.micro, g == last ? Tensor() : c.hidden_view(nowhere), &hook);
        break;
      case Op::BackwardWeight:
        c.backward_weight(a.micro, &hook);
        break;
      default:
        break;  // transfers acquire nothing
    }
  }
}

// The stage's model chunks and its actions. Without a pipeline: one chunk of every unit and
// F0 B0 F1 B1 …; with one, the units of global chunks g ≡ stage (mod stages), the schedule's
// actions for this stage, and the buffers its transfers use (bounded and allocated here).
Executor::Executor(const ExecutorOptions& o, const StagePlan& plan, const ModelSpec& spec,
                   void* params, void* grads, tp::Group& tp, comm::Communicator* pp,
                   const FaultInjector& faults)
    : o_(o), tp_(tp), pp_(pp), faults_(faults) {
  const int v = o_.virtual_stages, stages = o_.stages, stage = o_.stage;
  schedule_ = stage_schedule(o_);
  const ChunkSlots cs = chunk_slots(schedule_, v);
  const int B = o_.micro_batch;
  const DType pt = o_.param_dtype;
  for (int k = 0; k < v; ++k) {
    chunk_global_.push_back(global_chunk(k, stage, stages));
    chunks_.push_back(make_transformer(spec, pt, o_.grad_dtype, params, grads, B, int(o_.seq_len),
                                       chunk_options(o_, plan, cs, k), &tp_));
  }
  // One receive buffer and one input gradient per chunk: a receive must come right before the
  // compute that consumes it, a send right after the compute that made it (as every generator
  // places them; the checker alone would accept other orders).
  for (size_t i = 0; i < schedule_.size(); ++i) {
    const Action& a = schedule_[i];
    const bool recv = a.op == Op::RecvActivation || a.op == Op::RecvGradient;
    const bool send = a.op == Op::SendActivation || a.op == Op::SendGradient;
    if (!recv && !send) continue;
    const bool act = a.op == Op::RecvActivation || a.op == Op::SendActivation;
    const size_t j = recv ? i + 1 : i - 1;
    const bool ok = (recv || i > 0) && j < schedule_.size() && schedule_[j].micro == a.micro &&
                    schedule_[j].chunk == a.chunk &&
                    (act ? schedule_[j].op == Op::Forward
                         : schedule_[j].op == Op::Backward || schedule_[j].op == Op::BackwardInput);
    STRATA_CHECK(ok, "pipeline stage ", stage, ": ", action_name(a), " must be adjacent to the ",
                 "compute that ", recv ? "consumes" : "produces", " it");
  }
  last_dx_.assign(chunks_.size(), Tensor());
  trace_.reserve(schedule_.size());
  // With tensor parallelism and no sequence parallelism every tp rank holds the same hidden
  // states: each sends and receives only its block of rows, re-gathered over tp on arrival.
  split_ = tp_.size() > 1 && !tp_.sequence_parallel() &&
           int64_t(o_.micro_batch) * o_.seq_len % tp_.size() == 0;
  if (stages == 1) return;
  const size_t msg = pipeline_message_bytes(o_, tp_.size(), tp_.sequence_parallel());
  const int ring = send_ring_slots(cs);
  peers_ =
      std::make_unique<comm::PeerExchange>(*pp_, std::chrono::seconds(o_.timeout_s), ring, msg);
  pipe_ = Buffer(MemCategory::CommBuffers, 2 * size_t(v) * msg);
  char* at = static_cast<char*>(pipe_.data());
  for (int k = 0; k < v; ++k) {
    recv_act_.push_back(at), at += msg;
    recv_grad_.push_back(at), at += msg;
  }
  if (o_.tied_embeddings) {
    const bool ends = stage == 0 || stage == stages - 1;
    embed_comm_ = pp_->split(ends ? 0 : 1, stage, "pp-embedding");
    embed_comm_->set_timeout(pp_->timeout());
    if (ends) {
      for (int u : spec.units_of(UnitKind::Vocab)) tied_numel_ += spec.units[size_t(u)].numel;
    }
  }
}

Executor::~Executor() = default;

int Executor::last_chunk() const {
  return o_.stages * o_.virtual_stages - 1;
}

Tensor Executor::tp_part(const Tensor& t) const {
  if (!split_) return t;
  const int64_t rows = t.dim(0) / tp_.size();
  return t.slice0(tp_.rank() * rows, (tp_.rank() + 1) * rows);
}

Executor::Pass Executor::run(const int32_t* inputs, const int32_t* targets, float dloss,
                             UnitHook* hook, int64_t step, const int32_t* doc_begin) {
  using clock = std::chrono::steady_clock;
  const int64_t mb = o_.micro_batch, T = o_.seq_len;
  const int gas = o_.micro_batches, last = last_chunk();
  const DType pt = o_.param_dtype;
  Pass out;
  trace_.clear();
  for (const Action& a : schedule_) {
    char label[64];
    comm::flight::set_activity(step, format_action(label, sizeof label, a));
    faults_.before_action(step, size_t(&a - schedule_.data()), a, o_.stage);
    const int k = a.chunk, g = chunk_global_[size_t(k)];
    Transformer& c = *chunks_[size_t(k)];
    const int64_t at = a.micro * mb * T;
    const int32_t* docs = doc_begin != nullptr ? doc_begin + at * o_.context.size : nullptr;
    const auto t0 = clock::now();
    faults_.delay(step, a);
    switch (a.op) {
      case Op::RecvActivation:
      case Op::RecvGradient: {
        const bool act = a.op == Op::RecvActivation;
        const Tensor in = c.hidden_view(act ? recv_act_[size_t(k)] : recv_grad_[size_t(k)]);
        const Tensor part = tp_part(in);
        ops::wait(ops::compute_stream(),
                  peers_->recv(part.data, size_t(part.numel()), pt, a.peer,
                               tag(a.micro, g, act ? 0 : 1), act ? "an activation" : "a gradient"));
        if (part.data != in.data || part.numel() != in.numel()) tp_.all_gather(in, part);
        out.recv_wait_s += std::chrono::duration<double>(clock::now() - t0).count();
        break;
      }
      case Op::SendActivation:
      case Op::SendGradient: {
        const bool act = a.op == Op::SendActivation;
        const Tensor out_t = tp_part(act ? c.output(a.micro) : last_dx_[size_t(k)]);
        peers_->send(out_t.data, size_t(out_t.numel()), pt, a.peer,
                     tag(a.micro, act ? g + 1 : g - 1, act ? 0 : 1),
                     act ? "an activation" : "a gradient", ops::record(ops::compute_stream()));
        break;
      }
      case Op::Forward:
        out.loss_sum += c.forward(a.micro, g == 0 ? inputs + at : nullptr,
                                  g == 0 ? Tensor() : c.hidden_view(recv_act_[size_t(k)]),
                                  g == last ? targets + at : nullptr, dloss, true, hook, docs);
        out.forward_s += std::chrono::duration<double>(clock::now() - t0).count();
        break;
      case Op::Backward:
      case Op::BackwardInput:
      case Op::BackwardWeight:
        if (hook != nullptr) hook->begin_micro(a.micro == gas - 1);
        if (a.op == Op::BackwardWeight) {
          c.backward_weight(a.micro, hook);
        } else {
          last_dx_[size_t(k)] = c.backward_input(
              a.micro, g == last ? Tensor() : c.hidden_view(recv_grad_[size_t(k)]), hook);
        }
        out.backward_s += std::chrono::duration<double>(clock::now() - t0).count();
        break;
    }
    if (tracing_) {
      trace_.push_back({a, std::chrono::duration<double>(t0.time_since_epoch()).count(),
                        std::chrono::duration<double>(clock::now().time_since_epoch()).count()});
    }
  }
  if (peers_) peers_->wait_sends();
  return out;
}

double Executor::forward_only(const int32_t* inputs, const int32_t* targets, UnitHook* hook,
                              const std::function<void()>& after_forward,
                              const int32_t* doc_begin) {
  const int64_t mb = o_.micro_batch, T = o_.seq_len;
  const int v = int(chunks_.size()), last = last_chunk();
  const DType pt = o_.param_dtype;
  double loss_sum = 0.0;
  for (int micro = 0; micro < o_.micro_batches; ++micro) {
    const int64_t at = micro * mb * T;
    const int32_t* docs = doc_begin != nullptr ? doc_begin + at * o_.context.size : nullptr;
    for (int k = 0; k < v; ++k) {
      const int g = global_chunk(k, o_.stage, o_.stages);
      Transformer& c = *chunks_[size_t(k)];
      Tensor in;
      if (g > 0) {
        in = c.hidden_view(recv_act_[size_t(k)]);
        const Tensor part = tp_part(in);
        ops::wait(ops::compute_stream(),
                  peers_->recv(part.data, size_t(part.numel()), pt, stage_of(g - 1, o_.stages),
                               tag(micro, g, 0), "an evaluation activation"));
        if (part.data != in.data || part.numel() != in.numel()) tp_.all_gather(in, part);
      }
      loss_sum += c.forward(micro, g == 0 ? inputs + at : nullptr, in,
                            g == last ? targets + at : nullptr, 0.0f, false, hook, docs);
      if (after_forward) after_forward();
      if (g < last) {
        const Tensor out = tp_part(c.output(micro));
        peers_->send(out.data, size_t(out.numel()), pt, stage_of(g + 1, o_.stages),
                     tag(micro, g + 1, 0), "an evaluation activation",
                     ops::record(ops::compute_stream()));
      }
    }
  }
  if (peers_) peers_->wait_sends();
  return loss_sum;
}

void Executor::sum_tied_grads(void* grads, int64_t n) {
  embed_comm_->all_reduce(grads, size_t(n), o_.grad_dtype, o_.grad_dtype);
}

}  // namespace strata::pipeline
