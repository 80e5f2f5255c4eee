// kernels/attention/attention_cuda.cu: CUDA KV-cache write and paged attention.
// attention: one block of 4 warps per (query token, head); the token finds its sequence by binary search
// over query_start; the warps take interleaved keys of the visible range [first, pos] through the block
// table and keep an online softmax (running max, sum, f32 accumulator; each lane owns head_dim/32
// elements), then the warps' partial states merge in shared memory with the sink logit joining the
// denominator. The same kernel serves prefill (many rows per sequence) and decode (one row).
#include "kernels/attention/attention.h"
#include "kernels/cuda_util.cuh"

namespace polylora::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;

__global__ void write_kv_kernel(KvWriteArgs a) {
  int64_t t = blockIdx.x;
  int64_t slot = a.slot_mapping[t];
  if (slot < 0) return;
  int64_t row = a.cache.num_kv_heads * a.cache.head_dim;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    a.cache.k[slot * row + i] = a.k[t * a.ldk + i];
    a.cache.v[slot * row + i] = a.v[t * a.ldv + i];
  }
}

// R = ceil(head_dim / 32) elements per lane.
template <int R>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionArgs a) {
  const KvCacheView& c = a.cache;
  const int64_t d = c.head_dim, t = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // Sequence of row t: the last s with query_start[s] <= t.
  int lo = 0, hi = static_cast<int>(a.num_seqs) - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (a.query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int s = lo;
  const int64_t q_begin = a.query_start[s], q_len = a.query_start[s + 1] - q_begin, ctx = a.context_lens[s];
  const int64_t pos = ctx - q_len + (t - q_begin);
  const int64_t first = a.window > 0 ? max(static_cast<int64_t>(0), pos - a.window + 1) : 0;
  const int64_t group = a.num_heads / c.num_kv_heads, kvh = h / group, kv_row = c.num_kv_heads * d;
  const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;

  float qv[R], acc[R];
  const float* q = a.q + t * a.ldq + h * d;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    int64_t i = lane + 32 * r;
    qv[r] = i < d ? q[i] : 0.0f;
    acc[r] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = first + warp; j <= pos; j += kWarps) {
    int64_t off =
        (static_cast<int64_t>(table[j / c.block_size]) * c.block_size + j % c.block_size) * kv_row + kvh * d;
    const float* k = c.k + off;
    const float* v = c.v + off;
    float kr[R], vr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      int64_t i = lane + 32 * r;
      kr[r] = i < d ? k[i] : 0.0f;
      vr[r] = i < d ? v[i] : 0.0f;
    }
    float dot = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) dot += qv[r] * kr[r];
    float score = cuda_util::warp_sum(dot) * a.scale;
    float m_new = fmaxf(m, score);
    float corr = expf(m - m_new), p = expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = acc[r] * corr + p * vr[r];
    m = m_new;
  }

  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxHeadDim];
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    int i = lane + 32 * r;
    if (i < d) s_acc[warp][i] = acc[r];
  }
  __syncthreads();
  float mx = a.sinks ? a.sinks[h] : -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w]);
  float denom = a.sinks ? expf(a.sinks[h] - mx) : 0.0f;
  float scale_w[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    scale_w[w] = s_l[w] > 0.0f ? expf(s_m[w] - mx) : 0.0f;
    denom += s_l[w] * scale_w[w];
  }
  float inv = 1.0f / denom;
  float* o = a.out + t * a.ldo + h * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += s_acc[w][i] * scale_w[w];
    o[i] = sum * inv;
  }
}

}  // namespace

void write_kv(const KvWriteArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  write_kv_kernel<<<static_cast<unsigned>(a.m), 128, 0, cuda_util::stream(ctx)>>>(a);
  CUDA_CHECK_LAUNCH();
}

void attention(const AttentionArgs& a, const CudaContext& ctx) {
  if (a.num_seqs == 0) return;
  KERNEL_CHECK(a.num_tokens > 0, "attention: AttentionArgs::num_tokens (query_start[num_seqs]) must be set");
  KERNEL_CHECK(a.cache.head_dim >= 1 && a.cache.head_dim <= kMaxHeadDim,
               "attention: head_dim must be in 1..256");
  KERNEL_CHECK(a.num_heads % a.cache.num_kv_heads == 0,
               "attention: num_heads must be a multiple of num_kv_heads");
  KERNEL_CHECK(a.num_heads <= 65535, "attention: too many heads");
  dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_heads));
  cudaStream_t st = cuda_util::stream(ctx);
  switch ((a.cache.head_dim + 31) / 32) {
    case 1:
      attention_kernel<1><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 2:
      attention_kernel<2><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 3:
      attention_kernel<3><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 4:
      attention_kernel<4><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 5:
      attention_kernel<5><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 6:
      attention_kernel<6><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 7:
      attention_kernel<7><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 8:
      attention_kernel<8><<<grid, kWarps * 32, 0, st>>>(a);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
