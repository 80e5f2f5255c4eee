// model/weight_upload.cc: the staged loader's pipeline (see weight_upload.h): chunking, reader threads
// filling the staging ring with pread, and the owner thread queuing each filled buffer's upload.
#include "model/weight_upload.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"

namespace polylora {
namespace {

// A buffer-sized piece of a job: `bytes` at file offset `offset` of file `file_idx`, uploaded as `block`.
struct Chunk {
  size_t job_idx = 0;
  size_t file_idx = 0;
  uint64_t offset = 0;
  size_t bytes = 0;
  UploadBlock block;
};

// Splits a job into chunks of at most `cap` bytes: whole source rows where a row fits, else pieces of
// one row. A job whose destination is contiguous (not transposed, dst_ld == cols) is one long row.
void split_job(const UploadJob& j, size_t job_idx, size_t file_idx, size_t cap, std::vector<Chunk>& out) {
  if (j.rows <= 0 || j.cols <= 0) return;
  const DType sdt = j.tensor->dtype;
  const auto es = static_cast<int64_t>(dtype_size(sdt)), ds = static_cast<int64_t>(dtype_size(j.dst_dtype));
  int64_t rows = j.rows, cols = j.cols, ld = j.dst_ld;
  if (!j.transpose && ld == cols) {
    cols = rows * cols;
    rows = 1;
    ld = cols;
  }
  const uint64_t base = j.tensor->file_offset + j.src_offset;
  auto* dst = static_cast<std::byte*>(j.dst);
  const int64_t row_bytes = cols * es;
  if (static_cast<size_t>(row_bytes) <= cap) {
    const int64_t per = static_cast<int64_t>(cap) / row_bytes;
    for (int64_t i0 = 0; i0 < rows; i0 += per) {
      const int64_t n = std::min(per, rows - i0);
      UploadBlock b{n, cols, sdt, dst + (j.transpose ? i0 : i0 * ld) * ds, j.dst_dtype, ld, j.transpose};
      out.push_back({job_idx, file_idx, base + static_cast<uint64_t>(i0 * row_bytes),
                     static_cast<size_t>(n * row_bytes), b});
    }
    return;
  }
  const int64_t per = static_cast<int64_t>(cap) / es;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j0 = 0; j0 < cols; j0 += per) {
      const int64_t n = std::min(per, cols - j0);
      UploadBlock b{1,           n,  sdt,        dst + (j.transpose ? j0 * ld + i : i * ld + j0) * ds,
                    j.dst_dtype, ld, j.transpose};
      out.push_back({job_idx, file_idx, base + static_cast<uint64_t>((i * cols + j0) * es),
                     static_cast<size_t>(n * es), b});
    }
  }
}

struct OpenFile {
  std::string path;
  int fd = -1;
  uint64_t size = 0;
};

class Files {
 public:
  ~Files() {
    for (OpenFile& f : files_)
      if (f.fd >= 0) ::close(f.fd);
  }
  size_t index_of(const std::string& path) {
    auto [it, inserted] = index_.emplace(path, files_.size());
    if (inserted) {
      OpenFile f;
      f.path = path;
      f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (f.fd < 0) {
        index_.erase(it);
        fail("cannot open checkpoint file {} to load its tensors: {}", path, std::strerror(errno));
      }
      struct stat st {};
      if (::fstat(f.fd, &st) != 0) {
        int err = errno;
        ::close(f.fd);
        index_.erase(it);
        fail("cannot stat checkpoint file {}: {}", path, std::strerror(err));
      }
      f.size = static_cast<uint64_t>(st.st_size);
      files_.push_back(f);
    }
    return it->second;
  }
  const OpenFile& at(size_t i) const { return files_[i]; }

 private:
  std::map<std::string, size_t> index_;
  std::vector<OpenFile> files_;
};

void read_chunk(const OpenFile& f, const Chunk& c, const TensorInfo& t, std::byte* dst) {
  size_t done = 0;
  while (done < c.bytes) {
    ssize_t n = ::pread(f.fd, dst + done, c.bytes - done, static_cast<off_t>(c.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read tensor '{}' from {}: {}", t.name, f.path, std::strerror(errno));
    if (n == 0)
      fail(
          "cannot read tensor '{}' from {}: the file ends at byte {}, inside the tensor's data (bytes {} to "
          "{}); "
          "was it truncated while loading?",
          t.name, f.path, c.offset + done, t.file_offset, t.file_offset + t.num_bytes);
    done += static_cast<size_t>(n);
  }
}

// One run of the pipeline: prepare() checks the files and makes the staging buffers on the calling
// thread (the only use of the backend's own queue: the uploads are ordered after what it holds), pump()
// reads and queues the uploads (on any thread), finish() waits for them and frees the staging buffers (on
// the thread that prepared, so that no buffer is freed while that thread records a CUDA graph).
class UploadRun {
 public:
  UploadRun(Backend& backend, const WeightUploadOptions& options) : backend_(backend), options_(options) {}

  // own_tensors: the jobs' tensor records are copied, so the checkpoint may be closed while this runs
  // (the reads go through file descriptors of their own).
  void prepare(std::vector<UploadJob> jobs, bool own_tensors) {
    t0_ = Clock::now();
    jobs_ = std::move(jobs);
    if (own_tensors) {
      std::map<const TensorInfo*, const TensorInfo*> copies;
      for (UploadJob& j : jobs_) {
        if (j.tensor == nullptr) continue;
        auto [it, inserted] = copies.emplace(j.tensor, nullptr);
        if (inserted) {
          tensors_.push_back(*j.tensor);
          tensors_.back().data = nullptr;  // the mapping may go; reads use pread
          it->second = &tensors_.back();
        }
        j.tensor = it->second;
      }
    }
    if (jobs_.empty()) return;
    // Files first: each must still hold every byte its header promised (a clear error now, before any read).
    std::vector<size_t> file_of(jobs_.size());
    size_t largest = 0;
    for (size_t i = 0; i < jobs_.size(); ++i) {
      const UploadJob& j = jobs_[i];
      CHECK(j.tensor != nullptr && j.rows >= 0 && j.cols >= 0);
      const uint64_t bytes = static_cast<uint64_t>(j.rows * j.cols) * dtype_size(j.tensor->dtype);
      CHECK_MSG(j.src_offset + bytes <= j.tensor->num_bytes, "upload job past the end of tensor '{}'",
                j.tensor->name);
      file_of[i] = files_.index_of(j.tensor->file);
      const OpenFile& f = files_.at(file_of[i]);
      const uint64_t end = j.tensor->file_offset + j.tensor->num_bytes;
      if (end > f.size)
        fail(
            "cannot load tensor '{}' from {}: the file has {} bytes, but the tensor's data ends at byte {} "
            "(was the file truncated or replaced after its header was read?)",
            j.tensor->name, f.path, f.size, end);
      largest = std::max<size_t>(largest, static_cast<size_t>(bytes));
      stats_.bytes_read += bytes;
    }

    // Buffers no larger than the largest job needs; chunks in file order (sequential reads).
    constexpr size_t kAlign = size_t{64} << 10;
    const size_t cap = std::max<size_t>(
        kAlign,
        std::min(options_.buffer_bytes > 0 ? options_.buffer_bytes : WeightUploadOptions{}.buffer_bytes,
                 (largest + kAlign - 1) / kAlign * kAlign));
    for (size_t i = 0; i < jobs_.size(); ++i) split_job(jobs_[i], i, file_of[i], cap, chunks_);
    std::stable_sort(chunks_.begin(), chunks_.end(), [](const Chunk& a, const Chunk& b) {
      return a.file_idx != b.file_idx ? a.file_idx < b.file_idx : a.offset < b.offset;
    });
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int num_threads = options_.num_threads > 0 ? options_.num_threads : std::clamp(hw * 3 / 4, 1, 12);
    num_threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(num_threads), chunks_.size()));
    int num_buffers = options_.num_buffers > 0 ? options_.num_buffers : 2 * num_threads;
    num_buffers = static_cast<int>(std::min<size_t>(static_cast<size_t>(num_buffers), chunks_.size()));
    num_threads = std::min(num_threads, num_buffers);
    stats_.num_threads = num_threads;
    stats_.num_buffers = num_buffers;
    stats_.buffer_bytes = cap;
    stats_.num_chunks = chunks_.size();
    if (chunks_.empty()) return;
    staging_ = backend_.make_upload_staging(num_buffers, cap);
    stats_.setup_seconds = std::chrono::duration<double>(Clock::now() - t0_).count();
  }

  // Reads every chunk and queues its upload; an error is kept for finish().
  void pump() {
    if (!staging_) return;
    if (options_.before_reads) {
      try {
        options_.before_reads();
      } catch (...) {
        error_ = std::current_exception();
        return;
      }
    }
    const int num_threads = stats_.num_threads, num_buffers = stats_.num_buffers;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<int> free_buffers;               // may be filled (after staging->wait())
    std::deque<std::pair<int, size_t>> filled;  // (buffer, chunk): read, to be uploaded
    size_t next_chunk = 0;
    int readers_running = num_threads;
    bool abort = false;
    for (int i = 0; i < num_buffers; ++i) free_buffers.push_back(i);
    auto record_error = [&](std::exception_ptr e) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error_) error_ = std::move(e);
      abort = true;
    };

    auto reader = [&] {
      for (;;) {
        int buf = -1;
        size_t c = 0;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return abort || next_chunk >= chunks_.size() || !free_buffers.empty(); });
          if (abort || next_chunk >= chunks_.size()) break;
          buf = free_buffers.front();
          free_buffers.pop_front();
          c = next_chunk++;
        }
        try {
          staging_->wait(buf);  // the previous upload out of this buffer has read it
          const Chunk& chunk = chunks_[c];
          read_chunk(files_.at(chunk.file_idx), chunk, *jobs_[chunk.job_idx].tensor, staging_->buffer(buf));
        } catch (...) {
          record_error(std::current_exception());
          break;
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          filled.emplace_back(buf, c);
        }
        cv.notify_all();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        --readers_running;
      }
      cv.notify_all();
    };

    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(num_threads));
    try {
      for (int i = 0; i < num_threads; ++i) threads.emplace_back(reader);
    } catch (...) {
      record_error(std::current_exception());
      cv.notify_all();
    }
    // This thread queues the uploads (one thread talks to the staging's streams).
    for (;;) {
      std::pair<int, size_t> item;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return abort || !filled.empty() || readers_running == 0; });
        if (abort || filled.empty()) break;
        item = filled.front();
        filled.pop_front();
      }
      try {
        staging_->upload(item.first, chunks_[item.second].block);
      } catch (...) {
        record_error(std::current_exception());
        cv.notify_all();
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        free_buffers.push_back(item.first);
      }
      cv.notify_all();
    }
    for (std::thread& t : threads) t.join();
    if (!error_) {
      try {
        staging_->finish();  // the uploads are complete on the device
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    stats_.seconds = std::chrono::duration<double>(Clock::now() - t0_).count();
  }

  // After pump(): frees the staging buffers (waiting for the uploads already queued) and returns the
  // statistics, or throws the error that stopped the pipeline.
  UploadStats finish() {
    staging_.reset();
    if (error_) std::rethrow_exception(error_);
    return stats_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  Backend& backend_;
  WeightUploadOptions options_;
  Clock::time_point t0_;
  std::vector<UploadJob> jobs_;
  std::deque<TensorInfo> tensors_;  // own_tensors: the jobs' tensor records
  Files files_;
  std::vector<Chunk> chunks_;
  std::unique_ptr<UploadStaging> staging_;
  UploadStats stats_;
  std::exception_ptr error_;
};

}  // namespace

UploadStats run_uploads(Backend& backend, std::span<const UploadJob> jobs,
                        const WeightUploadOptions& options) {
  UploadRun run(backend, options);
  run.prepare(std::vector<UploadJob>(jobs.begin(), jobs.end()), false);
  run.pump();
  return run.finish();
}

struct PendingUploads::Impl {
  explicit Impl(Backend& backend, const WeightUploadOptions& options) : run(backend, options) {}
  UploadRun run;
  std::thread thread;
  bool waited = false;
};

PendingUploads::PendingUploads(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PendingUploads::~PendingUploads() {
  if (!impl_ || impl_->waited) return;
  try {
    wait();
  } catch (...) {  // an error nobody asked for: the staging buffers are freed all the same
  }
}

UploadStats PendingUploads::wait() {
  CHECK_MSG(!impl_->waited, "PendingUploads::wait() called twice");
  impl_->waited = true;
  if (impl_->thread.joinable()) impl_->thread.join();
  return impl_->run.finish();
}

std::unique_ptr<PendingUploads> start_uploads(Backend& backend, std::vector<UploadJob> jobs,
                                              const WeightUploadOptions& options) {
  auto impl = std::make_unique<PendingUploads::Impl>(backend, options);
  impl->run.prepare(std::move(jobs), true);
  UploadRun* run = &impl->run;
  impl->thread = std::thread([run] { run->pump(); });
  return std::unique_ptr<PendingUploads>(new PendingUploads(std::move(impl)));
}

}  // namespace polylora
