// model/expert_parallel.cc: expert parallelism of the MoE layers on the CPU backend
// (--enable-expert-parallel, docs/tensor-parallel.md): Model::moe_expert_parallel dispatches the
// token-expert pairs of this rank's block of tokens to the ranks that own their experts, runs the local
// experts on the pairs it receives, and combines the results back with the router's weights.
// Must not: split experts (tp_shard.cc gives each rank whole ones) or touch the layers around the MoE.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "model/model.h"
#include "runtime/communicator.h"

namespace polylora {

namespace k = kernels;

// Every rank has every token (the hidden states are replicated after the attention's all_reduce) and the
// same routes (the router is replicated). Rank r is the source of tokens [r·⌈T/N⌉, (r+1)·⌈T/N⌉): it sends
// each of their (token, k) pairs' hidden row to the owner of the routed expert (all_to_all_v, segments
// in rank order, each ordered by token then k), and gets the expert's output row back in the same order
// (all_to_all_v the other way). The owner knows which pairs arrive without being told: it derives them
// from the replicated routes (the receive counts, and each row's local expert and adapter slot), so only
// the rows travel. The source then sums its tokens' rows in k order with the router's weights; the other
// tokens' rows stay zero and the caller's all_reduce makes the sum whole on every rank.
void Model::moe_expert_parallel(const k::MoeExpertsArgs& moe, std::span<const int32_t> token_slots) {
  CHECK(comm_ && tp_.expert_parallel && backend_->kind() == DeviceKind::kCpu);
  ExpertParallelScratch& s = ep_;
  const int N = tp_.size, me = tp_.rank;
  const int64_t T = moe.m, K = moe.top_k, H = moe.hidden, local = tp_.num_local_experts;
  const int64_t E = local * N, chunk = (T + N - 1) / N;
  const int64_t first = std::min<int64_t>(T, me * chunk), last = std::min<int64_t>(T, first + chunk);
  CHECK(moe.num_experts == local && (token_slots.empty() || static_cast<int64_t>(token_slots.size()) == T));
  auto owner = [&](int64_t pair) {
    const int32_t e = moe.ids[pair];
    CHECK_MSG(e >= 0 && e < E, "expert id {} outside the model's {} experts", e, E);
    return static_cast<int>(e / local);
  };

  // Pairs per (source, owner), and this rank's pairs in send order.
  s.pairs.assign(static_cast<size_t>(N * N), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t kk = 0; kk < K; ++kk) ++s.pairs[static_cast<size_t>((t / chunk) * N + owner(t * K + kk))];
  s.sent.clear();
  for (int dst = 0; dst < N; ++dst)
    for (int64_t p = first * K; p < last * K; ++p)
      if (owner(p) == dst) s.sent.push_back(p);
  s.send_counts.resize(static_cast<size_t>(N));
  s.recv_counts.resize(static_cast<size_t>(N));
  size_t received = 0;
  for (int j = 0; j < N; ++j) {
    s.send_counts[static_cast<size_t>(j)] = s.pairs[static_cast<size_t>(me * N + j)] * static_cast<size_t>(H);
    s.recv_counts[static_cast<size_t>(j)] = s.pairs[static_cast<size_t>(j * N + me)] * static_cast<size_t>(H);
    received += s.pairs[static_cast<size_t>(j * N + me)];
  }

  // Dispatch: the hidden rows of this rank's pairs to the experts' owners.
  s.send.resize(std::max<size_t>(1, s.sent.size() * static_cast<size_t>(H)));
  for (size_t i = 0; i < s.sent.size(); ++i)
    std::memcpy(s.send.data() + i * static_cast<size_t>(H), moe.x + (s.sent[i] / K) * moe.ldx,
                static_cast<size_t>(H) * sizeof(float));
  s.recv.resize(std::max<size_t>(1, received * static_cast<size_t>(H)));
  comm_->all_to_all_v(s.send.data(), s.send_counts, s.recv.data(), s.recv_counts, DType::kF32);

  // What arrived, in the senders' order: rank j's tokens' pairs routed here, by token then k.
  s.ids.clear();
  s.slots.clear();
  for (int j = 0; j < N; ++j)
    for (int64_t p = std::min<int64_t>(T, j * chunk) * K; p < std::min<int64_t>(T, (j + 1) * chunk) * K; ++p)
      if (owner(p) == me) {
        s.ids.push_back(moe.ids[p] - static_cast<int32_t>(me * local));
        s.slots.push_back(token_slots.empty() ? -1 : token_slots[static_cast<size_t>(p / K)]);
      }
  CHECK(s.ids.size() == received);
  s.expert_out.resize(std::max<size_t>(1, received * static_cast<size_t>(H)));
  if (received > 0) {
    s.ones.assign(received, 1.0f);
    k::MoeExpertsArgs a = moe;
    a.x = s.recv.data();
    a.ldx = H;
    a.m = static_cast<int64_t>(received);
    a.top_k = 1;
    a.ids = s.ids.data();
    a.weights = s.ones.data();
    a.token_slots = moe.token_slots ? s.slots.data() : nullptr;
    a.out = s.expert_out.data();
    a.ldo = H;
    backend_->moe_experts(a);
  }

  // Combine: each output row back to its token's rank, which weighs and sums them in k order.
  s.back.resize(std::max<size_t>(1, s.sent.size() * static_cast<size_t>(H)));
  comm_->all_to_all_v(s.expert_out.data(), s.recv_counts, s.back.data(), s.send_counts, DType::kF32);
  s.back_row.assign(static_cast<size_t>((last - first) * K), -1);
  for (size_t i = 0; i < s.sent.size(); ++i)
    s.back_row[static_cast<size_t>(s.sent[i] - first * K)] = static_cast<int64_t>(i);
  for (int64_t t = 0; t < T; ++t) {
    float* y = moe.out + t * moe.ldo;
    std::fill(y, y + H, 0.0f);
    if (t < first || t >= last) continue;
    for (int64_t kk = 0; kk < K; ++kk) {
      const float w = moe.weights[t * K + kk];
      const float* r = s.back.data() + s.back_row[static_cast<size_t>((t - first) * K + kk)] * H;
      for (int64_t i = 0; i < H; ++i) y[i] += w * r[i];
    }
  }
}

}  // namespace polylora
