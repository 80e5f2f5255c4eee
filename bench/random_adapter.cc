// bench/random_adapter.cc: random LoRA adapters at any model's shapes for the benchmarks
// (random_adapter.h).
#include "random_adapter.h"

#include <vector>

namespace polylora::bench {

std::shared_ptr<LoraAdapter> random_adapter(const ModelConfig& c, const std::string& name, uint64_t seed,
                                            int64_t rank, bool experts) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto fill = [&](std::vector<float>& v, size_t n) {
    v.resize(n);
    for (float& x : v) {  // xorshift64*, uniform on [-0.0346, 0.0346] (standard deviation 0.02)
      state ^= state >> 12;
      state ^= state << 25;
      state ^= state >> 27;
      const uint64_t r = state * 0x2545F4914F6CDD1Dull;
      x = (static_cast<float>(r >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.0693f;
    }
  };
  auto matrix = [&](int64_t in, int64_t out) {
    LoraMatrix m;
    m.rank = rank;
    m.in = in;
    m.out = out;
    m.scale = 2.0f;
    fill(m.a, static_cast<size_t>(rank * in));
    fill(m.b, static_cast<size_t>(out * rank));
    return m;
  };
  auto a = std::make_shared<LoraAdapter>();
  a->name = name;
  a->max_rank = rank;
  a->layers.resize(static_cast<size_t>(c.num_layers));
  const int64_t H = c.hidden_size, q = c.q_size(), kv = c.kv_size();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LoraLayer& ll = a->layers[static_cast<size_t>(l)];
    ll.modules[static_cast<size_t>(LoraModule::kQ)] = matrix(H, q);
    ll.modules[static_cast<size_t>(LoraModule::kK)] = matrix(H, kv);
    ll.modules[static_cast<size_t>(LoraModule::kV)] = matrix(H, kv);
    ll.modules[static_cast<size_t>(LoraModule::kO)] = matrix(q, H);
    if (!experts || !c.is_moe() || !c.moe_layers[static_cast<size_t>(l)]) continue;
    const int64_t I = c.moe_intermediate_size;
    ll.experts.resize(static_cast<size_t>(c.num_experts));
    for (LoraExpert& e : ll.experts) {
      if (c.arch == Architecture::kGptOss) {
        e.gate_up = matrix(H, 2 * I);
      } else {
        e.gate = matrix(H, I);
        e.up = matrix(H, I);
      }
      e.down = matrix(I, H);
    }
    a->has_expert_lora = true;
  }
  return a;
}

}  // namespace polylora::bench
