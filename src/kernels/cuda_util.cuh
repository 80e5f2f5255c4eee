// kernels/cuda_util.cuh: helpers shared by the kernels' *_cuda.cu files: CUDA_CHECK (file, line,
// expression), the stream of a CudaContext, weight-element loads in any float dtype, warp reductions.
// Only included from .cu files (it includes CUDA headers). Must not: depend on anything above common/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "common/dtype.h"
#include "kernels/cuda_context.h"

namespace polylora {
// Defined in common/error.cc (declared here because common/error.h's fmt does not compile under nvcc).
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& message);
}  // namespace polylora

#define CUDA_CHECK(expr)                                                                        \
  do {                                                                                          \
    cudaError_t cuda_check_err_ = (expr);                                                       \
    if (cuda_check_err_ != cudaSuccess)                                                         \
      ::polylora::check_failed(__FILE__, __LINE__, #expr, cudaGetErrorString(cuda_check_err_)); \
  } while (0)
// After a kernel launch: reports bad launch configurations at once (execution errors surface later).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
#define KERNEL_CHECK(cond, msg)                                              \
  do {                                                                       \
    if (!(cond)) ::polylora::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

namespace polylora::kernels::cuda_util {

inline cudaStream_t stream(const CudaContext& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// Whether ctx has a side stream (CudaContext::side_stream) to run work beside its own.
inline bool has_side_stream(const CudaContext& ctx) {
  return ctx.side_stream != nullptr && ctx.side_fork != nullptr && ctx.side_join != nullptr;
}

// side(c) and then main() queued so that they run concurrently: side's launches on ctx's side stream,
// forked from ctx's stream where the call is (an event recorded there, waited for by the side stream) and
// joined back after main's launches (ctx's stream waits for the side stream's event), so what follows on
// ctx's stream sees both. c is ctx on the side stream, without ctx's workspace (main's launches use it) and
// with programmatic dependent launch off (a side launch's predecessor is the fork, not a kernel). Inside a
// graph capture the side stream joins the capture at the fork and leaves it at the join: two branches of
// the graph. Without a side stream, side then main on ctx's stream.
template <typename Side, typename Main>
void run_beside(const CudaContext& ctx, Side&& side, Main&& main) {
  if (!has_side_stream(ctx)) {
    side(ctx);
    main();
    return;
  }
  const cudaStream_t st = stream(ctx), ss = static_cast<cudaStream_t>(ctx.side_stream);
  const auto fork = static_cast<cudaEvent_t>(ctx.side_fork), join = static_cast<cudaEvent_t>(ctx.side_join);
  CUDA_CHECK(cudaEventRecord(fork, st));
  CUDA_CHECK(cudaStreamWaitEvent(ss, fork, 0));
  CudaContext c = ctx;
  c.stream = ss;
  c.cublas = nullptr;
  c.workspace = nullptr;
  c.workspace_bytes = 0;
  c.side_stream = c.side_fork = c.side_join = nullptr;
  {
    struct Off {
      bool saved = programmatic_launch_off();
      Off() { programmatic_launch_off() = true; }
      ~Off() { programmatic_launch_off() = saved; }
    } off;
    side(c);
  }
  CUDA_CHECK(cudaEventRecord(join, ss));
  main();
  CUDA_CHECK(cudaStreamWaitEvent(st, join, 0));
}

// Multiprocessors of the current device (read once; 132, an H100/H200's, if the query fails).
inline int num_sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
      return 132;
    return v;
  }();
  return n;
}

// Programmatic dependent launch (Hopper and later; docs/pdl.md). A kernel launched by launch_pdl may start
// while the kernel before it in the stream is still running: its CTAs become resident as soon as every CTA
// of that kernel has called pdl_trigger() (or exited), and wait in pdl_wait() until it has completed and its
// writes are visible. The launch latency and the kernel's prologue (what it does before pdl_wait: index math,
// shared-memory set-up, L2 prefetches of weights, never reads of activations nor any write) overlap the
// previous kernel's last wave. Rule: a kernel launched by launch_pdl calls pdl_wait() in every CTA before it
// reads or writes any buffer another kernel touches (activations, workspaces, outputs), and before any
// early exit; pdl_wait() and pdl_trigger() are no-ops when the kernel was launched plainly. On by default on
// compute capability 9.0+; POLYLORA_PDL=0 turns it off (plain launches, for A/B timing). Off as well while
// the thread queues a step with LoRA kernels (kernels::programmatic_launch_off(), Backend::set_lora_step).
inline bool pdl_enabled() {
  static const bool v = [] {
    const char* e = std::getenv("POLYLORA_PDL");
    if (e != nullptr && e[0] == '0' && e[1] == '\0') return false;
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           major >= 9;
  }();
  return v;
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel (if launched by launch_pdl) launch once every CTA of this one has passed here. Called
// after pdl_wait(): the next kernel's CTAs then fill the SMs as this kernel's last wave runs.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Both, at the top of a kernel that has nothing to do before its inputs are ready.
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}
// The line of global memory at p into L2 (weights, before pdl_wait).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Whether launches queued now get the PDL attribute (launch_pdl and launches with other attributes too).
inline bool pdl_launch_on() {
  return pdl_enabled() && !programmatic_launch_off();
}

// launch_pdl when pdl, else a plain launch (a kernel whose PDL is a tuning switch).
template <typename... Params, typename... Args>
void launch_pdl_if(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                   Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && pdl_launch_on() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                Args&&... args) {
  launch_pdl_if(true, kernel, grid, block, smem, st, std::forward<Args>(args)...);
}

// launch_pdl with thread-block clusters of `cluster_x` CTAs along x (grid.x a multiple of it).
template <typename... Params, typename... Args>
void launch_pdl_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, unsigned cluster_x,
                        cudaStream_t st, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_launch_on() ? 2 : 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Whether p is 16-byte aligned (the vectorized loads' condition, with the sizes' own).
inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

inline unsigned blocks_for(int64_t n, int threads, int64_t cap = 65535LL * 16) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < cap ? b : cap);
}

// Element i of a weight array in `dtype` (F32, BF16 or F16), as f32; of an INT8 array (--quantization
// int8) the code, exactly (the caller applies the row's scale).
__device__ __forceinline__ float load_as_f32(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kI32:
    case DType::kI64:
    case DType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(p)[i]);
    case DType::kU8:
      break;
  }
  return 0.0f;
}

// Element i as bf16 (exact for BF16 and INT8 codes; round-to-nearest-even from F32/F16).
__device__ __forceinline__ __nv_bfloat16 load_as_bf16(const void* p, DType dtype, int64_t i) {
  if (dtype == DType::kBF16) return static_cast<const __nv_bfloat16*>(p)[i];
  return __float2bfloat16_rn(load_as_f32(p, dtype, i));
}

// v as the pair of bf16 the split products multiply (CudaContext::bf16_split_max_rows): hi = bf16(v) and
// lo = bf16(v − hi), so hi + lo carries ~16 of v's mantissa bits.
struct Bf16Pair {
  __nv_bfloat16 hi, lo;
};
__device__ __forceinline__ Bf16Pair split_bf16(float v) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(v);
  return {hi, __float2bfloat16_rn(v - __bfloat162float(hi))};
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float r = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(r);
}

}  // namespace polylora::kernels::cuda_util
