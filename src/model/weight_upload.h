// model/weight_upload.h: the staged weight loader's pipeline. Reader threads read byte ranges of the
// checkpoint files (pread, from the page cache or the disk) into the backend's staging buffers (a small
// ring, page-locked on CUDA), and one thread queues each filled buffer's upload (copied, and converted or
// transposed on the device where the stored layout differs), so reading, copying and converting overlap.
// Owns: splitting jobs into buffer-sized chunks, the reader threads, checking that the files still hold
// the bytes their headers promised. Must not: interpret tensor names (a job names its tensor only for
// messages), or touch the file mapping (a file truncated after its header was read is an error here,
// never a SIGBUS).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "runtime/safetensors.h"

namespace polylora {

// How weights reach the backend.
enum class UploadPath {
  kAuto,       // CPU backend: zero-copy views into the mapping; others: kStaged
  kPerTensor,  // one synchronous copy (and host-side transpose) per tensor, as before the staged loader
  kStaged,     // the pipeline below (also on the CPU, where it copies into backend memory: tests)
};

// Defaults measured on the H200 machine (16 cores, PCIe H2D 51 GB/s, page-cache reads up to 63 GB/s) with
// GPT-OSS-20B in bf16 (41.8 GB): 12 threads and 24 x 4 MiB load it in 0.87 s; 16 threads are slower (1.1 s:
// the cores are shared with the copies' host side), and so are larger buffers (8 threads, 12 x 32 MiB:
// 1.4 to 2.0 s).
struct WeightUploadOptions {
  UploadPath path = UploadPath::kAuto;
  int num_threads = 0;                    // reader threads; 0: 3/4 of the hardware threads, 1 to 12
  int num_buffers = 0;                    // staging buffers; 0: 2 per reader thread
  size_t buffer_bytes = size_t{4} << 20;  // per buffer (smaller when every tensor is smaller)
  // WeightLoader::finish() leaves the staged path's reads and copies running on a thread of their own
  // (start_uploads below) and returns; the model waits for them before its first step that runs kernels
  // (Model::wait_for_weights), so the engine's start-up (workspace sizing, KV cache, CUDA graph
  // recording) overlaps the load. Cold start: set by `serve` / `generate` (engine_flags.cc).
  bool background = false;
  // Called on the pipeline's thread before its first read (tests: a file changed while a background load
  // runs).
  std::function<void()> before_reads;
};

// One tensor (or part of one) to place in backend memory: rows x cols values of tensor->dtype, row-major
// and contiguous at byte `src_offset` of the tensor's data, stored at `dst` as `dst_dtype` with
// element (i, j) at dst[i * dst_ld + j], or at dst[j * dst_ld + i] when `transpose`.
struct UploadJob {
  const TensorInfo* tensor = nullptr;
  uint64_t src_offset = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  void* dst = nullptr;
  DType dst_dtype = DType::kBF16;
  int64_t dst_ld = 0;
  bool transpose = false;
};

struct UploadStats {
  uint64_t bytes_read = 0;   // checkpoint bytes read
  double seconds = 0;        // staging set-up, reads and uploads, until the last upload completed
  double setup_seconds = 0;  // of which: allocating the staging buffers
  int num_threads = 0;
  int num_buffers = 0;
  size_t buffer_bytes = 0;
  size_t num_chunks = 0;
};

// Runs every job; returns when all uploads are complete. Errors (polylora::Error) name the tensor and
// file: a file that cannot be opened or read, or that is shorter than the tensor's data (truncated or
// replaced after its header was read). Nothing is left queued when it throws.
UploadStats run_uploads(Backend& backend, std::span<const UploadJob> jobs,
                        const WeightUploadOptions& options);

// The same pipeline, left running: start_uploads() checks the jobs and the files and makes the staging
// buffers on the calling thread (its errors are thrown there, and the uploads are ordered after what the
// backend's queue holds at that point), then reads and copies on a thread of its own while the caller goes
// on with work that needs the weights' memory but not their values (sizing workspaces, recording CUDA
// graphs). wait() returns once every upload is complete on the device (what the backend queues later sees
// the weights), frees the staging buffers, and returns run_uploads' statistics or throws its error. The
// tensor records are copied: the checkpoint may be closed meanwhile. Destroying it unwaited waits (errors
// dropped).
class PendingUploads {
 public:
  struct Impl;
  ~PendingUploads();
  PendingUploads(const PendingUploads&) = delete;
  PendingUploads& operator=(const PendingUploads&) = delete;
  UploadStats wait();

 private:
  friend std::unique_ptr<PendingUploads> start_uploads(Backend&, std::vector<UploadJob>,
                                                       const WeightUploadOptions&);
  explicit PendingUploads(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};
std::unique_ptr<PendingUploads> start_uploads(Backend& backend, std::vector<UploadJob> jobs,
                                              const WeightUploadOptions& options);

}  // namespace polylora
