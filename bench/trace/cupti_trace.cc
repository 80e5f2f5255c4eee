// bench/trace/cupti_trace.cc: a kernel timeline for any CUDA program, graphs and programmatic dependent
// launch included (the GPU machine has no Nsight Systems). Loaded by the CUDA driver through its injection
// hook, it records every kernel's start and end with CUPTI's concurrent-kernel activity (which keeps kernels
// concurrent, unlike CUPTI_ACTIVITY_KIND_KERNEL) and writes them as CSV when the program exits:
//
//   CUDA_INJECTION64_PATH=build-gpu/bench/libpolylora_cupti_trace.so POLYLORA_TRACE_OUT=trace.csv
//     build-gpu/bench/polylora_bench device ...   (one command line)
//   python3 scripts/trace_steps.py trace.csv          # per-kernel time and gaps of the decode steps
//
// Columns: start_ns, end_ns, stream, graph_id, graph_node, grid (x*y*z), block (x*y*z), name (demangled,
// without the parameter list); copies and memsets are rows named [memcpy HtoD] ... / [memset] with their
// bytes in the grid column and block 0. Timestamps are CUPTI's (ns, one clock for the whole trace). The
// program runs somewhat slower while traced (a record per kernel); compare its own timing with and without
// the hook. Must not: depend on anything of polylora (it is loaded into other programs too).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start, end, graph_node;
  uint32_t stream, graph_id, name;
  int64_t grid, block;
};

struct Trace {
  std::mutex mu;
  std::vector<KernelRecord> kernels;
  std::vector<std::string> names;
  std::unordered_map<std::string, uint32_t> name_ids;
  uint64_t dropped = 0;
};

Trace& trace() {
  static Trace* t = new Trace();  // never destroyed: CUPTI may deliver buffers during exit
  return *t;
}

std::string short_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  // Drop the parameter list (the last top-level parenthesis group) and "(anonymous namespace)::".
  int depth = 0;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == ')') ++depth;
    if (s[i] == '(' && --depth == 0) {
      s.resize(i);
      break;
    }
  }
  for (size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  for (char& c : s)
    if (c == ',') c = ';';  // CSV
  return s;
}

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Trace& t = trace();
  CUpti_Activity* rec = nullptr;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    auto name_id = [&](const std::string& name) {
      auto it = t.name_ids.find(name);
      if (it == t.name_ids.end()) {
        it = t.name_ids.emplace(name, static_cast<uint32_t>(t.names.size())).first;
        t.names.push_back(name);
      }
      return it->second;
    };
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {  // a row named [memcpy KIND], its bytes as the grid
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        static const char* const kKinds[] = {"?",    "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                             "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
        const char* kind = m->copyKind < 11 ? kKinds[m->copyKind] : "?";
        t.kernels.push_back({m->start, m->end, m->graphNodeId, m->streamId, m->graphId,
                             name_id(std::string("[memcpy ") + kind + "]"), static_cast<int64_t>(m->bytes),
                             0});
        continue;
      }
      if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        t.kernels.push_back({m->start, m->end, m->graphNodeId, m->streamId, m->graphId, name_id("[memset]"),
                             static_cast<int64_t>(m->bytes), 0});
        continue;
      }
      if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
        continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      t.kernels.push_back({k->start, k->end, k->graphNodeId, k->streamId, k->graphId,
                           name_id(short_name(k->name)), static_cast<int64_t>(k->gridX) * k->gridY * k->gridZ,
                           static_cast<int64_t>(k->blockX) * k->blockY * k->blockZ});
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) t.dropped += dropped;
  }
  std::free(buffer);
}

void write_trace() {
  cuptiActivityFlushAll(1);
  Trace& t = trace();
  std::lock_guard<std::mutex> lock(t.mu);
  const char* path = std::getenv("POLYLORA_TRACE_OUT");
  if (path == nullptr || path[0] == '\0') path = "polylora_trace.csv";
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cupti_trace: cannot write %s\n", path);
    return;
  }
  std::fprintf(f, "start_ns,end_ns,stream,graph_id,graph_node,grid,block,name\n");
  for (const KernelRecord& k : t.kernels)
    std::fprintf(f, "%llu,%llu,%u,%u,%llu,%lld,%lld,%s\n", static_cast<unsigned long long>(k.start),
                 static_cast<unsigned long long>(k.end), k.stream, k.graph_id,
                 static_cast<unsigned long long>(k.graph_node), static_cast<long long>(k.grid),
                 static_cast<long long>(k.block), t.names[k.name].c_str());
  std::fclose(f);
  std::fprintf(stderr, "cupti_trace: %zu kernels (%llu records dropped) written to %s\n", t.kernels.size(),
               static_cast<unsigned long long>(t.dropped), path);
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "cupti_trace: %s failed: %s\n", what, msg != nullptr ? msg : "?");
  return false;
}

}  // namespace

// Called by the CUDA driver at cuInit when CUDA_INJECTION64_PATH names this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "RegisterCallbacks"))
      return;
    if (!check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "Enable(CONCURRENT_KERNEL)"))
      return;
    // Copies and memsets too (host-to-device step inputs, device-to-host sampled tokens), unless
    // POLYLORA_TRACE_KERNELS_ONLY=1.
    const char* only = std::getenv("POLYLORA_TRACE_KERNELS_ONLY");
    if (only == nullptr || std::string(only) != "1") {
      check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "Enable(MEMCPY)");
      check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "Enable(MEMSET)");
    }
    std::atexit(write_trace);
  });
  return 1;
}
