// lora/peft_loader.cc: reads PEFT LoRA adapters (three layouts) and validates them against the model.
// Layouts: per-module targets (self_attn.q_proj, mlp.gate_proj, ...), per-expert modules
// (mlp.experts.{e}.gate_proj, Mixtral block_sparse_moe.experts.{e}.w1/w2/w3), and PEFT
// target_parameters on fused 3-D expert tensors (mlp.experts.gate_up_proj / down_proj), whose A is
// (E, r, in) expert-major and whose B is (out, r, E) expert-minor (see the fixtures README).
// Trusted (startup) and confined (run-time) loads share one reader working on an open directory, so the
// same regular-file checks and size caps apply to both. Tensor names are parsed by hand with bounded
// integers (no regex, no std::stoll).
#include <atomic>
#include <charconv>
#include <cmath>
#include <map>

#include "common/error.h"
#include "common/utf8.h"
#include "lora/adapter.h"
#include "lora/adapter_files.h"
#include "lora/peft_config.h"
#include "runtime/safetensors.h"

namespace polylora {
namespace {

constexpr std::string_view kConfigFile = "adapter_config.json";
constexpr std::string_view kWeightsFile = "adapter_model.safetensors";

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string in_dir(const std::string& dir, std::string_view file) {
  return dir.empty() || dir.back() == '/' ? dir + std::string(file) : dir + "/" + std::string(file);
}

// A run of decimal digits at the start of `s` (at least one), or nullopt; `*value` is UINT64_MAX when the
// number does not fit, so a bounds check against the model rejects it with the digits quoted.
std::optional<std::string_view> leading_digits(std::string_view s, uint64_t* value) {
  size_t n = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
  if (n == 0) return std::nullopt;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + n, *value);
  if (ec != std::errc() || ptr != s.data() + n) *value = UINT64_MAX;
  return s.substr(0, n);
}

// "model.layers.<L>.<rest>"
struct LayerName {
  uint64_t layer = 0;
  std::string_view layer_digits;
  std::string_view rest;
};
std::optional<LayerName> parse_layer_name(std::string_view module) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!starts_with(module, kPrefix)) return std::nullopt;
  LayerName out;
  std::string_view tail = module.substr(kPrefix.size());
  auto digits = leading_digits(tail, &out.layer);
  if (!digits || digits->size() + 1 >= tail.size() || tail[digits->size()] != '.') return std::nullopt;
  out.layer_digits = *digits;
  out.rest = tail.substr(digits->size() + 1);
  return out;
}

// "(mlp|block_sparse_moe).experts.<E>.(gate_proj|up_proj|down_proj|w1|w2|w3)"
struct ExpertName {
  bool mixtral_names = false;
  uint64_t expert = 0;
  std::string_view expert_digits;
  std::string_view proj;
};
std::optional<ExpertName> parse_expert_name(std::string_view rest) {
  ExpertName out;
  if (starts_with(rest, "mlp.experts.")) {
    rest.remove_prefix(std::string_view("mlp.experts.").size());
  } else if (starts_with(rest, "block_sparse_moe.experts.")) {
    out.mixtral_names = true;
    rest.remove_prefix(std::string_view("block_sparse_moe.experts.").size());
  } else {
    return std::nullopt;
  }
  auto digits = leading_digits(rest, &out.expert);
  if (!digits || digits->size() >= rest.size() || rest[digits->size()] != '.') return std::nullopt;
  out.expert_digits = *digits;
  out.proj = rest.substr(digits->size() + 1);
  for (std::string_view p : {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"})
    if (out.proj == p) return out;
  return std::nullopt;
}

// "(mlp|block_sparse_moe).experts(.base_layer)*"; the number of ".base_layer" wrappers.
struct FusedName {
  bool mixtral_names = false;
  int64_t depth = 0;
};
std::optional<FusedName> parse_fused_name(std::string_view rest) {
  FusedName out;
  if (starts_with(rest, "mlp.experts")) {
    rest.remove_prefix(std::string_view("mlp.experts").size());
  } else if (starts_with(rest, "block_sparse_moe.experts")) {
    out.mixtral_names = true;
    rest.remove_prefix(std::string_view("block_sparse_moe.experts").size());
  } else {
    return std::nullopt;
  }
  constexpr std::string_view kWrapper = ".base_layer";
  while (!rest.empty()) {
    if (!starts_with(rest, kWrapper)) return std::nullopt;
    rest.remove_prefix(kWrapper.size());
    ++out.depth;
  }
  return out;
}

struct Pair {
  const TensorInfo* a = nullptr;
  const TensorInfo* b = nullptr;
  const TensorInfo& any() const { return a != nullptr ? *a : *b; }
};

std::vector<float> to_f32(const TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert_to_f32(t.data, t.dtype, v.size(), v.data());
  return v;
}

enum class ExpertPart { kGateUp, kDown };

}  // namespace

const char* lora_module_name(LoraModule module) {
  switch (module) {
    case LoraModule::kQ:
      return "q_proj";
    case LoraModule::kK:
      return "k_proj";
    case LoraModule::kV:
      return "v_proj";
    case LoraModule::kO:
      return "o_proj";
    case LoraModule::kGate:
      return "gate_proj";
    case LoraModule::kUp:
      return "up_proj";
    case LoraModule::kDown:
      return "down_proj";
  }
  return "?";
}

size_t LoraAdapter::num_bytes() const {
  size_t total = 0;
  auto add = [&](const std::optional<LoraMatrix>& m) {
    if (m) total += (m->a.size() + m->b.size()) * sizeof(float);
  };
  for (const auto& layer : layers) {
    for (const auto& m : layer.modules) add(m);
    for (const auto& e : layer.experts) {
      add(e.gate_up);
      add(e.gate);
      add(e.up);
      add(e.down);
    }
  }
  return total;
}

namespace {

// Both entry points: reads the adapter through the already-open directory `dir`.
std::shared_ptr<LoraAdapter> load_from_dir(const AdapterDir& dir, const std::string& name,
                                           const ModelConfig& cfg, const LoraLimits& limits) {
  std::optional<AdapterFile> config_file =
      open_adapter_file(dir, std::string(kConfigFile), kMaxPeftConfigBytes, name);
  if (!config_file) fail("adapter '{}': {} is missing", name, in_dir(dir.display, kConfigFile));
  PeftConfig pc = parse_peft_config(read_adapter_file(*config_file, name),
                                    fmt::format("adapter '{}': {}", name, config_file->display));
  std::optional<AdapterFile> weights =
      open_adapter_file(dir, std::string(kWeightsFile), limits.max_adapter_bytes, name);
  if (!weights) {
    if (adapter_file_exists(dir, "adapter_model.bin"))
      fail(
          "adapter '{}': only adapter_model.bin found in {}; PyTorch pickle adapters are not supported, "
          "save the adapter with safetensors",
          name, dir.display);
    fail("adapter '{}': {} is missing", name, in_dir(dir.display, kWeightsFile));
  }
  std::string file = weights->display;
  Checkpoint ckpt = Checkpoint::open_fd(weights->fd.get(), file, limits.max_adapter_bytes);

  // Group lora_A / lora_B tensors by module path.
  std::map<std::string, Pair> modules;
  for (const std::string& key : ckpt.names()) {
    std::string path = key;
    const std::string prefix = "base_model.model.";
    if (path.rfind(prefix, 0) == 0) path = path.substr(prefix.size());
    bool is_a = false;
    if (ends_with(path, ".lora_A.weight")) {
      is_a = true;
      path.resize(path.size() - std::string(".lora_A.weight").size());
    } else if (ends_with(path, ".lora_B.weight")) {
      path.resize(path.size() - std::string(".lora_B.weight").size());
    } else if (key.find("lora_embedding") != std::string::npos) {
      fail("adapter '{}': {}: tensor '{}': LoRA on embeddings is not supported", name, file, key);
    } else if (key.find("lora_magnitude_vector") != std::string::npos) {
      fail("adapter '{}': {}: tensor '{}': DoRA adapters are not supported", name, file, key);
    } else {
      fail(
          "adapter '{}': {}: tensor '{}' is not a LoRA weight (expected ...lora_A.weight or "
          "...lora_B.weight)",
          name, file, key);
    }
    (is_a ? modules[path].a : modules[path].b) = &ckpt.get(key);
  }
  if (modules.empty()) fail("adapter '{}': {} holds no LoRA tensors", name, file);

  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = name;
  adapter->path = dir.display;
  adapter->layers.resize(static_cast<size_t>(cfg.num_layers));

  auto scale_for = [&](const std::string& module, int64_t rank) {
    double alpha = pc.alpha_for(module);
    return static_cast<float>(pc.use_rslora ? alpha / std::sqrt(static_cast<double>(rank))
                                            : alpha / static_cast<double>(rank));
  };
  auto check_rank = [&](const std::string& module, int64_t rank) {
    int64_t expected = pc.rank_for(module);
    if (rank != expected)
      fail("adapter '{}': module '{}' has rank {} in {}, but adapter_config.json says r = {}", name, module,
           rank, file, expected);
    if (rank > limits.max_lora_rank)
      fail("adapter '{}': module '{}': LoRA rank {} is greater than max_lora_rank {} (raise --max-lora-rank)",
           name, module, rank, limits.max_lora_rank);
  };
  // A dense-style matrix: A [r, in], B [out, r].
  auto make_matrix = [&](const std::string& module, const Pair& p, int64_t in, int64_t out) {
    const TensorInfo& a = *p.a;
    const TensorInfo& b = *p.b;
    if (a.shape.size() != 2 || b.shape.size() != 2)
      fail("adapter '{}': module '{}': lora_A and lora_B must be 2-D (got {} and {})", name, module,
           a.shape_string(), b.shape_string());
    int64_t rank = a.shape[0];
    check_rank(module, rank);
    if (a.shape[1] != in || b.shape[0] != out || b.shape[1] != rank)
      fail(
          "adapter '{}': module '{}' does not fit the model: lora_A is {} and lora_B is {}, expected [r, {}] "
          "and [{}, r]",
          name, module, a.shape_string(), b.shape_string(), in, out);
    LoraMatrix m;
    m.rank = rank;
    m.in = in;
    m.out = out;
    m.scale = scale_for(module, rank);
    m.a = to_f32(a);
    m.b = to_f32(b);
    adapter->max_rank = std::max(adapter->max_rank, rank);
    return m;
  };

  const int64_t H = cfg.hidden_size;
  const int64_t E = cfg.num_experts;
  const int64_t moe_i = cfg.moe_intermediate_size;
  // target_parameters that address the fused expert tensors, outermost wrapper last.
  std::vector<ExpertPart> fused_order;
  for (const std::string& t : pc.target_parameters) {
    if (ends_with(t, "experts.gate_up_proj"))
      fused_order.push_back(ExpertPart::kGateUp);
    else if (ends_with(t, "experts.down_proj"))
      fused_order.push_back(ExpertPart::kDown);
    else
      fail(
          "adapter '{}': target_parameters entry '{}' is not supported (supported: mlp.experts.gate_up_proj, "
          "mlp.experts.down_proj)",
          name, t);
  }

  for (const auto& [module, pair] : modules) {
    if (!pair.a || !pair.b)
      fail("adapter '{}': {}: module '{}' has {} but no {}", name, file, module, pair.a ? "lora_A" : "lora_B",
           pair.a ? "lora_B" : "lora_A");
    std::optional<LayerName> ln = parse_layer_name(module);
    if (!ln)
      fail(
          "adapter '{}': target '{}' is not supported by polylora (LoRA applies to attention, MLP and expert "
          "layers)",
          name, module);
    if (ln->layer >= static_cast<uint64_t>(cfg.num_layers))
      fail("adapter '{}': target '{}' (tensor '{}') names layer {}, but the model has {} layers", name,
           module, pair.any().name, ln->layer_digits, cfg.num_layers);
    auto layer = static_cast<int64_t>(ln->layer);
    std::string rest(ln->rest);
    LoraLayer& ll = adapter->layers[static_cast<size_t>(layer)];
    bool moe_layer = cfg.moe_layers[static_cast<size_t>(layer)];
    auto set_dense = [&](LoraModule which, int64_t in, int64_t out) {
      ll.modules[static_cast<size_t>(which)] = make_matrix(module, pair, in, out);
    };
    if (rest == "self_attn.q_proj")
      set_dense(LoraModule::kQ, H, cfg.q_size());
    else if (rest == "self_attn.k_proj")
      set_dense(LoraModule::kK, H, cfg.kv_size());
    else if (rest == "self_attn.v_proj")
      set_dense(LoraModule::kV, H, cfg.kv_size());
    else if (rest == "self_attn.o_proj")
      set_dense(LoraModule::kO, cfg.q_size(), H);
    else if (!moe_layer && rest == "mlp.gate_proj")
      set_dense(LoraModule::kGate, H, cfg.intermediate_size);
    else if (!moe_layer && rest == "mlp.up_proj")
      set_dense(LoraModule::kUp, H, cfg.intermediate_size);
    else if (!moe_layer && rest == "mlp.down_proj")
      set_dense(LoraModule::kDown, cfg.intermediate_size, H);
    else if (std::optional<ExpertName> en = moe_layer ? parse_expert_name(rest) : std::nullopt) {
      if (en->mixtral_names != (cfg.arch == Architecture::kMixtral))
        fail("adapter '{}': target '{}' is not a module of this {} model", name, module, cfg.model_type);
      if (cfg.expert_activation == ExpertActivation::kGptOssClampedSwiglu)
        fail("adapter '{}': target '{}': GPT-OSS experts are fused; use target_parameters", name, module);
      if (en->expert >= static_cast<uint64_t>(E))
        fail("adapter '{}': target '{}' (tensor '{}') names expert {}, but the model has {} experts", name,
             module, pair.any().name, en->expert_digits, E);
      if (ll.experts.empty()) ll.experts.resize(static_cast<size_t>(E));
      LoraExpert& le = ll.experts[static_cast<size_t>(en->expert)];
      std::string_view proj = en->proj;
      if (proj == "gate_proj" || proj == "w1")
        le.gate = make_matrix(module, pair, H, moe_i);
      else if (proj == "up_proj" || proj == "w3")
        le.up = make_matrix(module, pair, H, moe_i);
      else
        le.down = make_matrix(module, pair, moe_i, H);
      adapter->has_expert_lora = true;
    } else if (std::optional<FusedName> fn = moe_layer ? parse_fused_name(rest) : std::nullopt) {
      if (fn->mixtral_names != (cfg.arch == Architecture::kMixtral))
        fail("adapter '{}': target '{}' is not a module of this {} model", name, module, cfg.model_type);
      int64_t depth = fn->depth;
      const TensorInfo& a = *pair.a;
      const TensorInfo& b = *pair.b;
      if (a.shape.size() != 2 || b.shape.size() != 2 || a.shape[0] % E != 0 || b.shape[1] != a.shape[0])
        fail(
            "adapter '{}': fused expert LoRA '{}' has lora_A {} and lora_B {}; expected [r·{}, in] and "
            "[out, r·{}]",
            name, module, a.shape_string(), b.shape_string(), E, E);
      int64_t rank = a.shape[0] / E;
      auto fits = [&](ExpertPart part) {
        int64_t in = part == ExpertPart::kGateUp ? H : moe_i;
        int64_t out = part == ExpertPart::kGateUp ? 2 * moe_i : H;
        return a.shape[1] == in && b.shape[0] == out;
      };
      ExpertPart part;
      bool gu = fits(ExpertPart::kGateUp), dn = fits(ExpertPart::kDown);
      if (gu != dn) {
        part = gu ? ExpertPart::kGateUp : ExpertPart::kDown;
      } else if (gu && depth < static_cast<int64_t>(fused_order.size())) {
        part = fused_order[fused_order.size() - 1 - static_cast<size_t>(depth)];  // PEFT nests in list order
      } else {
        fail(
            "adapter '{}': fused expert LoRA '{}' (lora_A {}, lora_B {}) fits neither gate_up_proj "
            "([r·E, {}] / [{}, r·E]) nor down_proj ([r·E, {}] / [{}, r·E])",
            name, module, a.shape_string(), b.shape_string(), H, 2 * moe_i, moe_i, H);
      }
      check_rank(module, rank);
      int64_t in = a.shape[1], out = b.shape[0];
      std::vector<float> fa = to_f32(a), fb = to_f32(b);
      if (ll.experts.empty()) ll.experts.resize(static_cast<size_t>(E));
      std::string param = part == ExpertPart::kGateUp ? "experts.gate_up_proj" : "experts.down_proj";
      for (int64_t e = 0; e < E; ++e) {
        LoraMatrix mat;
        mat.rank = rank;
        mat.in = in;
        mat.out = out;
        mat.scale = scale_for(module.substr(0, module.find(".experts")) + "." + param, rank);
        mat.a.assign(fa.begin() + e * rank * in, fa.begin() + (e + 1) * rank * in);  // rows e·r .. e·r+r
        mat.b.resize(static_cast<size_t>(out * rank));
        for (int64_t o = 0; o < out; ++o)
          for (int64_t k = 0; k < rank; ++k)
            mat.b[o * rank + k] = fb[o * rank * E + k * E + e];  // column k·E+e
        LoraExpert& le = ll.experts[static_cast<size_t>(e)];
        (part == ExpertPart::kGateUp ? le.gate_up : le.down) = std::move(mat);
      }
      adapter->max_rank = std::max(adapter->max_rank, rank);
      adapter->has_expert_lora = true;
    } else {
      fail("adapter '{}': target '{}' is not a module of this {} model{}", name, module, cfg.model_type,
           moe_layer && rest.rfind("mlp.", 0) == 0 ? " (layer " + std::to_string(layer) + " is a MoE layer)"
                                                   : "");
    }
  }
  return adapter;
}

// Every message leaves here valid UTF-8: paths and names may hold any bytes, and the server puts the
// message into a JSON body.
template <typename Open>
std::shared_ptr<LoraAdapter> load_sanitised(const std::string& name, Open&& open_dir, const ModelConfig& cfg,
                                            const LoraLimits& limits) {
  try {
    AdapterDir dir = open_dir();
    return load_from_dir(dir, name, cfg, limits);
  } catch (const Error& e) {
    throw Error(sanitize_utf8(e.what()), e.kind());
  }
}

}  // namespace

std::shared_ptr<LoraAdapter> load_peft_adapter(const std::string& dir, const std::string& name,
                                               const ModelConfig& cfg, const LoraLimits& limits) {
  return load_sanitised(
      name, [&] { return open_adapter_dir(dir, name); }, cfg, limits);
}

std::shared_ptr<LoraAdapter> load_peft_adapter_confined(const std::vector<std::string>& allowed_dirs,
                                                        const std::string& path, const std::string& name,
                                                        const ModelConfig& cfg, const LoraLimits& limits) {
  return load_sanitised(
      name, [&] { return open_adapter_dir_confined(allowed_dirs, path, name); }, cfg, limits);
}

}  // namespace polylora
