// tests/unit/model/lora_stacks_test_util.h: the bytes of one slot of every LoraStacks tensor, in a fixed
// order, for comparing slots (the CPU test reads host memory, the GPU test copies device memory).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "common/dtype.h"
#include "config/model_config.h"
#include "model/lora_stacks.h"

namespace polylora::testing_util {

// read(dst, src, n): n bytes of the stacks' memory at src into dst.
inline std::vector<unsigned char> lora_slot_bytes(
    const LoraStacks& st, const ModelConfig& c, int32_t slot,
    const std::function<void(void*, const void*, size_t)>& read) {
  std::vector<unsigned char> out;
  const size_t es = dtype_size(st.dtype());
  auto take = [&](const void* base, size_t per_slot_elems) {
    const size_t n = per_slot_elems * es, at = out.size();
    out.resize(at + n);
    read(out.data() + at, static_cast<const unsigned char*>(base) + static_cast<size_t>(slot) * n, n);
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (size_t m = 0; m < kNumLoraModules; ++m) {
      const kernels::LoraStack d = st.dense(l, static_cast<LoraModule>(m));
      if (d.empty()) continue;
      take(d.a, static_cast<size_t>(d.rank * d.in));
      take(d.b, static_cast<size_t>(d.out * d.rank));
    }
    const kernels::MoeLoraStack x = st.experts(l);
    if (x.empty()) continue;
    const auto E = static_cast<size_t>(c.num_experts), R = static_cast<size_t>(x.rank),
               H = static_cast<size_t>(c.hidden_size), I = static_cast<size_t>(c.moe_intermediate_size),
               G = static_cast<size_t>(x.gu_slices);
    take(x.a_gu, E * G * R * H);
    take(x.b_gu, E * 2 * I * R);
    take(x.a_down, E * R * I);
    take(x.b_down, E * H * R);
  }
  return out;
}

}  // namespace polylora::testing_util
