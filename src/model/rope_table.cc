// model/rope_table.cc: RoPE inverse frequencies for default, linear, llama3 and YaRN scaling, following
// transformers' rope initialisation functions.
#include <algorithm>
#include <cmath>

#include "model/model.h"

namespace polylora {

RopeTable RopeTable::from_config(const ModelConfig& cfg) {
  const RopeConfig& r = cfg.rope;
  int64_t dim = static_cast<int64_t>(static_cast<double>(cfg.head_dim) * r.partial_rotary_factor);
  int64_t half = dim / 2;
  RopeTable t;
  t.inv_freq.resize(static_cast<size_t>(half));
  std::vector<double> base(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    base[i] = 1.0 / std::pow(r.theta, static_cast<double>(2 * i) / static_cast<double>(dim));
  switch (r.type) {
    case RopeType::kDefault:
      for (int64_t i = 0; i < half; ++i) t.inv_freq[i] = static_cast<float>(base[i]);
      break;
    case RopeType::kLinear:
      for (int64_t i = 0; i < half; ++i) t.inv_freq[i] = static_cast<float>(base[i] / r.factor);
      break;
    case RopeType::kLlama3: {
      double old_len = r.original_max_position_embeddings;
      double low_wavelen = old_len / r.low_freq_factor;
      double high_wavelen = old_len / r.high_freq_factor;
      for (int64_t i = 0; i < half; ++i) {
        double wavelen = 2 * M_PI / base[i];
        double f = base[i];
        if (wavelen > low_wavelen) {
          f = base[i] / r.factor;
        } else if (wavelen >= high_wavelen) {
          double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          f = (1 - smooth) * base[i] / r.factor + smooth * base[i];
        }
        t.inv_freq[i] = static_cast<float>(f);
      }
      break;
    }
    case RopeType::kYarn: {
      auto get_mscale = [](double scale, double mscale) {
        return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
      };
      double factor = r.factor;
      double attention = r.attention_factor;
      if (attention == 0.0) {
        attention = (r.mscale != 0.0 && r.mscale_all_dim != 0.0)
                        ? get_mscale(factor, r.mscale) / get_mscale(factor, r.mscale_all_dim)
                        : get_mscale(factor, 1.0);
      }
      double orig = r.original_max_position_embeddings;
      auto correction_dim = [&](double rotations) {
        return (static_cast<double>(dim) * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(r.theta));
      };
      double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        // As transformers computes it in f32: pos_freqs = theta^(2i/dim).
        float pos_freq =
            static_cast<float>(std::pow(r.theta, static_cast<double>(2 * i) / static_cast<double>(dim)));
        float extrapolation = 1.0f / pos_freq;
        float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
        float ramp = static_cast<float>(std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0));
        float extrapolation_factor = 1.0f - ramp;
        t.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
      }
      t.attention_scaling = static_cast<float>(attention);
      break;
    }
  }
  return t;
}

}  // namespace polylora
