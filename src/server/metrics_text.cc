// server/metrics_text.cc: the Prometheus text exposition of the engine's state, with vLLM's metric names
// (so existing dashboards work) plus per-adapter counters.
#include <cstdio>
#include <sstream>

#include "server/http_server.h"

namespace polylora::server {
namespace {

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string fmt_fixed(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

void header(std::ostringstream& o, const std::string& name, const char* type, const char* help) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

void histogram(std::ostringstream& o, const std::string& name, const char* help, const HistogramSnapshot& h,
               const std::string& labels) {
  header(o, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.bucket_counts[i];
    o << name << "_bucket{" << labels << ",le=\"" << h.bounds[i] << "\"} " << cumulative << "\n";
  }
  cumulative += h.bucket_counts.back();
  o << name << "_bucket{" << labels << ",le=\"+Inf\"} " << cumulative << "\n";
  o << name << "_sum{" << labels << "} " << h.sum << "\n";
  o << name << "_count{" << labels << "} " << h.count << "\n";
}

}  // namespace

std::string prometheus_text(const EngineSnapshot& snap, const std::string& model_name) {
  std::ostringstream o;
  o.precision(10);
  const std::string labels = "model_name=\"" + escape_label(model_name) + "\"";
  const EngineStats& s = snap.stats;
  auto gauge = [&](const std::string& name, const char* help, double v) {
    header(o, name, "gauge", help);
    o << name << "{" << labels << "} " << v << "\n";
  };
  auto counter = [&](const std::string& name, const char* help, double v) {
    header(o, name, "counter", help);
    o << name << "{" << labels << "} " << v << "\n";
  };
  gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
        static_cast<double>(s.num_running));
  gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
        static_cast<double>(s.num_waiting));
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage);
  gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (legacy name). 1 means 100 percent usage.", s.kv_usage);
  gauge("polylora:kv_cache_blocks", "KV-cache blocks in total.", static_cast<double>(s.num_kv_blocks));
  counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
          static_cast<double>(s.prefix_queries));
  counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
          static_cast<double>(s.prefix_hits));
  counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
          static_cast<double>(s.num_preemptions));
  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
          static_cast<double>(s.prompt_tokens_total));
  counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
          static_cast<double>(s.generation_tokens));
  header(o, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const char* reason : {"stop", "length", "abort"}) {
    auto it = snap.metrics.finished_by_reason.find(reason);
    o << "vllm:request_success_total{" << labels << ",finished_reason=\"" << reason << "\"} "
      << (it == snap.metrics.finished_by_reason.end() ? 0 : it->second) << "\n";
  }
  const MetricsSnapshot& m = snap.metrics;
  histogram(o, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", m.ttft,
            labels);
  histogram(o, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", m.itl,
            labels);
  histogram(o, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", m.itl,
            labels);
  histogram(o, "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
            m.e2e, labels);
  histogram(o, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", m.prompt_tokens, labels);
  histogram(o, "vllm:request_generation_tokens", "Number of generation tokens processed.",
            m.generation_tokens, labels);
  histogram(o, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
            m.queue_time, labels);
  histogram(o, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
            m.prefill_time, labels);
  histogram(o, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
            m.decode_time, labels);
  histogram(o, "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
            m.inference_time, labels);
  histogram(o, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
            m.iteration_tokens, labels);
  histogram(o, "vllm:request_params_n", "Histogram of the n request parameter.", m.params_n, labels);
  histogram(o, "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
            m.params_max_tokens, labels);
  // The cache configuration as labels of a constant gauge (vLLM's cache_config_info).
  header(o, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
  o << "vllm:cache_config_info{";
  for (const auto& [k, v] : snap.cache_config) o << k << "=\"" << escape_label(v) << "\",";
  o << labels << "} 1\n";
  // vLLM's lora_requests_info, with its labels only (LoRA-aware routers read them): the adapters of running
  // and waiting requests, comma-separated, and --max-loras; the value is the time the engine last
  // recorded them (vLLM's set_to_current_time), in Unix seconds.
  header(o, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
  auto joined = [](const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
    return out;
  };
  o << "vllm:lora_requests_info{max_lora=\"" << s.max_loras << "\",waiting_lora_adapters=\""
    << escape_label(joined(s.waiting_adapters)) << "\",running_lora_adapters=\""
    << escape_label(joined(s.running_adapters)) << "\"} " << fmt_fixed(snap.lora_info_time) << "\n";
  // The adapter tiers (lora/adapter_registry.h).
  const AdapterRegistryStats& t = s.adapter_tiers;
  header(o, "polylora:adapter_loads_total", "counter",
         "Adapter loads by the tier read from: disk (files read into host memory) or host (host copy "
         "uploaded into a device slot).");
  o << "polylora:adapter_loads_total{" << labels << ",tier=\"disk\"} " << t.loads_host << "\n";
  o << "polylora:adapter_loads_total{" << labels << ",tier=\"host\"} " << t.loads_device << "\n";
  header(o, "polylora:adapter_evictions_total", "counter",
         "Adapters evicted from a tier: gpu (a device slot given to another adapter or freed), cpu (a host "
         "copy dropped; read again from disk on its next use).");
  o << "polylora:adapter_evictions_total{" << labels << ",tier=\"gpu\"} " << t.evictions_device << "\n";
  o << "polylora:adapter_evictions_total{" << labels << ",tier=\"cpu\"} " << t.evictions_host << "\n";
  header(o, "polylora:adapters_resident", "gauge",
         "Adapters held by each tier: gpu (device slots in use, at most --max-loras), cpu (copies in host "
         "memory, --max-cpu-loras; an adapter in a slot may keep one too), disk (registered, in neither).");
  o << "polylora:adapters_resident{" << labels << ",tier=\"gpu\"} " << t.resident_device << "\n";
  o << "polylora:adapters_resident{" << labels << ",tier=\"cpu\"} " << t.resident_host << "\n";
  o << "polylora:adapters_resident{" << labels << ",tier=\"disk\"} " << t.on_disk << "\n";
  gauge("polylora:adapters_registered", "Adapters registered (any tier).", static_cast<double>(t.registered));
  counter("polylora:adapter_load_failures_total", "Adapter loads from disk that failed (their requests failed).",
          static_cast<double>(t.load_failures));
  header(o, "polylora:adapter_load_seconds", "histogram",
         "Time to read an adapter from disk into host memory, on the loader thread.");
  for (size_t i = 0; i < AdapterRegistryStats::kLatencyBounds.size(); ++i)
    o << "polylora:adapter_load_seconds_bucket{" << labels << ",le=\"" << AdapterRegistryStats::kLatencyBounds[i]
      << "\"} " << t.latency_buckets[i] << "\n";
  o << "polylora:adapter_load_seconds_bucket{" << labels << ",le=\"+Inf\"} " << t.latency_count << "\n";
  o << "polylora:adapter_load_seconds_sum{" << labels << "} " << t.latency_sum << "\n";
  o << "polylora:adapter_load_seconds_count{" << labels << "} " << t.latency_count << "\n";
  // Host -> device slot copies made on the upload thread while steps run (a summary: sum and count).
  header(o, "polylora:adapter_upload_seconds", "summary",
         "Time to copy an adapter from host memory into a device slot, on the upload thread (copies made "
         "while steps run; the CPU and synchronous uploads are not counted).");
  o << "polylora:adapter_upload_seconds_sum{" << labels << "} " << t.upload_seconds << "\n";
  o << "polylora:adapter_upload_seconds_count{" << labels << "} " << t.upload_count << "\n";
  counter("polylora:adapter_upload_bytes_total", "Bytes written into device slots by those copies.",
          t.upload_bytes);
  counter(
      "polylora:adapter_uploads_from_host_image_total",
      "Those copies made out of the adapter's host image (converted once when it left a slot) rather than "
      "converted through the staging buffers.",
      static_cast<double>(t.uploads_from_image));
  gauge("polylora:adapters_uploading", "Device slots whose copy is under way.",
        static_cast<double>(t.uploading_device));
  // Per-adapter request and token counters ("base" for the base model).
  const char* names[] = {"polylora:adapter_requests_total", "polylora:adapter_prompt_tokens_total",
                         "polylora:adapter_generation_tokens_total"};
  const char* helps[] = {"Requests received per adapter.", "Prompt tokens computed per adapter.",
                         "Tokens generated per adapter."};
  for (int k = 0; k < 3; ++k) {
    header(o, names[k], "counter", helps[k]);
    for (const auto& [adapter, c] : s.adapters) {
      int64_t v = k == 0 ? c.requests : k == 1 ? c.prompt_tokens : c.generation_tokens;
      o << names[k] << "{" << labels << ",adapter=\"" << escape_label(adapter.empty() ? "base" : adapter)
        << "\"} " << v << "\n";
    }
  }
  return o.str();
}

}  // namespace polylora::server
