// model/quantize.cc: see quantize.h.
#include "model/quantize.h"

#include <chrono>

#include "common/error.h"
#include "common/log.h"

namespace polylora {

void check_quantization(WeightQuantization q, const ModelConfig& cfg, const std::string& source) {
  switch (q) {
    case WeightQuantization::kNone:
      return;
    case WeightQuantization::kInt8:
      break;
  }
  switch (cfg.quant_method) {
    case QuantMethod::kNone:
      return;
    case QuantMethod::kMxfp4:
      fail(
          "--quantization int8: {} is an MXFP4 checkpoint (config.json quantization_config.quant_method "
          "mxfp4): "
          "its experts are already 4-bit and INT8 applies to bf16/f32 checkpoints only; serve it without "
          "--quantization (or with --quantization mxfp4)",
          source);
  }
}

void quantize_weights_int8(ModelWeights& w, WeightLoader& loader, Backend& backend) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t before = w.num_bytes;
  int64_t matrices = 0;
  auto quantize = [&](kernels::WeightView& v) {
    if (v.empty()) return;
    loader.quantize_int8(v);
    ++matrices;
  };
  for (LayerWeights& lw : w.layers) {
    for (LinearWeights* l : {&lw.attn.q, &lw.attn.k, &lw.attn.v, &lw.attn.o}) quantize(l->w);
    if (!lw.is_moe) {
      for (LinearWeights* l : {&lw.mlp.gate, &lw.mlp.up, &lw.mlp.down}) quantize(l->w);
      continue;
    }
    for (kernels::ExpertView& ex : lw.moe.experts) {
      CHECK_MSG(!ex.down.mxfp4(), "--quantization int8 on MXFP4 experts (refused by check_quantization)");
      quantize(ex.gate_up);
      quantize(ex.gate);
      quantize(ex.up);
      quantize(ex.down);
    }
    // The device array of expert views (read by the CUDA kernels) now describes the INT8 copies.
    if (lw.moe.experts_on_device != nullptr) {
      backend.synchronize();
      backend.free(const_cast<kernels::ExpertView*>(lw.moe.experts_on_device));
      lw.moe.experts_on_device = loader.experts_to_device(lw.moe.experts);
    }
  }
  backend.synchronize();
  spdlog::info(
      "--quantization int8: {} weight matrices quantized to INT8 (per-output-channel scales) in {:.2f} s; "
      "parameters {:.1f} MB -> {:.1f} MB",
      matrices, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
      static_cast<double>(before) / 1e6, static_cast<double>(w.num_bytes) / 1e6);
}

}  // namespace polylora
