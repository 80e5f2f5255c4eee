// kernels/moe/moe_cuda.cu: CUDA routing and MoE experts, entirely on the device (no host sync, no
// per-expert host loop), in the manner of vLLM's fused MoE:
//   1. align: count token-expert pairs per expert, offsets padded to the GEMM tile (kTileM), a tile ->
//      expert map, and the pairs scattered into expert order (padding slots hold −1);
//   2. gate_up grouped GEMM over all experts in one launch (grid: worst-case tiles × column tiles; tiles
//      past the device-side count exit at once), bias in the epilogue;
//   3. expert LoRA on gate_up rows (per sorted row: its token's slot and the row's expert);
//   4. activation; 5. down grouped GEMM (bias in the epilogue) into per-pair rows; 6. down LoRA;
//   7. weighted combine per token in k order (deterministic).
// GEMMs: BF16/F16 weights run bf16 WMMA tensor cores (activations cast to bf16 as tiles are loaded, fp32
// accumulation); F32 weights run an fp32 FMA kernel. Intermediates are f32 in the workspace.
#include <mma.h>

#include "kernels/lora/lora_cuda.cuh"
#include "kernels/moe/moe.h"

namespace polylora::kernels::cuda {
namespace {

using cuda_util::load_as_bf16;
using cuda_util::load_as_f32;

constexpr int kTileM = 64;  // rows of a GEMM tile = the padding unit of the per-expert row ranges
constexpr int kTileN = 64;

int64_t round_up(int64_t v, int64_t a) {
  return (v + a - 1) / a * a;
}

// Workspace layout (each part 256-byte aligned).
struct MoeWorkspace {
  int64_t pairs = 0, max_tiles = 0, max_rows = 0;
  int32_t* counts = nullptr;       // [E] pairs per expert
  int32_t* fill = nullptr;         // [E] scatter cursors
  int32_t* offsets = nullptr;      // [E] first sorted row of each expert (padded)
  int32_t* num_tiles = nullptr;    // [1]
  int32_t* tile_expert = nullptr;  // [max_tiles]
  int32_t* sorted = nullptr;       // [max_rows] pair index t·top_k + k, or −1 (padding)
  float* gu = nullptr;             // [max_rows, 2I]
  float* act = nullptr;            // [max_rows, I]
  float* y = nullptr;              // [pairs, H]
  size_t bytes = 0;

  MoeWorkspace(const MoeExpertsArgs& a, void* base) {
    pairs = a.m * a.top_k;
    max_tiles = (pairs + kTileM - 1) / kTileM + a.num_experts;
    max_rows = max_tiles * kTileM;
    auto* p = static_cast<char*>(base);
    auto take = [&](size_t n) {
      char* r = p ? p + bytes : nullptr;
      bytes += static_cast<size_t>(round_up(static_cast<int64_t>(n), 256));
      return r;
    };
    counts = reinterpret_cast<int32_t*>(take(4 * a.num_experts));
    fill = reinterpret_cast<int32_t*>(take(4 * a.num_experts));
    offsets = reinterpret_cast<int32_t*>(take(4 * a.num_experts));
    num_tiles = reinterpret_cast<int32_t*>(take(4));
    tile_expert = reinterpret_cast<int32_t*>(take(4 * max_tiles));
    sorted = reinterpret_cast<int32_t*>(take(4 * max_rows));
    gu = reinterpret_cast<float*>(take(4 * max_rows * 2 * a.inter));
    act = reinterpret_cast<float*>(take(4 * max_rows * a.inter));
    y = reinterpret_cast<float*>(take(4 * pairs * a.hidden));
  }
};

// ---- routing ----

// Is (v1, i1) ahead of (v2, i2)? Larger value first, lower index on ties; index −1 is "none".
__device__ __forceinline__ bool ahead(float v1, int i1, float v2, int i2) {
  return i2 < 0 || (i1 >= 0 && (v1 > v2 || (v1 == v2 && i1 < i2)));
}

constexpr int kRouteWarps = 4;

__global__ void route_kernel(RouteArgs a) {
  extern __shared__ float route_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  const int64_t E = a.num_experts;
  float* vals = route_smem + warp * E;
  unsigned char* taken = reinterpret_cast<unsigned char*>(route_smem + kRouteWarps * E) + warp * E;
  if (t >= a.m) return;
  const float* logits = a.logits + t * E;
  const bool softmax_first = a.scoring == RouterScoring::kSoftmaxTopK;
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) mx = fmaxf(mx, logits[e]);
  mx = cuda_util::warp_max(mx);
  float sum = 0.0f;
  for (int64_t e = lane; e < E; e += 32) {
    float v = logits[e];
    if (softmax_first) {
      v = expf(v - mx);
      sum += v;
    }
    vals[e] = v;
    taken[e] = 0;
  }
  if (softmax_first) {
    sum = cuda_util::warp_sum(sum);
    for (int64_t e = lane; e < E; e += 32) vals[e] /= sum;
  }
  __syncwarp();
  int32_t* ids = a.ids + t * a.top_k;
  float* w = a.weights + t * a.top_k;
  for (int64_t k = 0; k < a.top_k; ++k) {
    float bv = -INFINITY;
    int bi = -1;
    for (int64_t e = lane; e < E; e += 32) {
      if (!taken[e] && ahead(vals[e], static_cast<int>(e), bv, bi)) {
        bv = vals[e];
        bi = static_cast<int>(e);
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ahead(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      ids[k] = bi;
      w[k] = bv;
      taken[bi] = 1;
    }
    __syncwarp();
  }
  if (lane != 0) return;
  if (softmax_first) {
    if (!a.renormalize) return;
    float total = 0.0f;
    for (int64_t k = 0; k < a.top_k; ++k) total += w[k];
    for (int64_t k = 0; k < a.top_k; ++k) w[k] /= total;
  } else {
    float top = w[0], total = 0.0f;
    for (int64_t k = 0; k < a.top_k; ++k) total += w[k] = expf(w[k] - top);
    for (int64_t k = 0; k < a.top_k; ++k) w[k] /= total;
  }
}

// ---- align ----

__global__ void count_kernel(const int32_t* ids, int64_t pairs, int64_t E, int32_t* counts) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int32_t e = ids[p];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
}

__global__ void offsets_kernel(const int32_t* counts, int64_t E, int32_t* offsets, int32_t* tile_expert,
                               int32_t* num_tiles) {
  if (threadIdx.x != 0) return;
  int32_t tile = 0;
  for (int64_t e = 0; e < E; ++e) {
    offsets[e] = tile * kTileM;
    int32_t n = (counts[e] + kTileM - 1) / kTileM;
    for (int32_t i = 0; i < n; ++i) tile_expert[tile + i] = static_cast<int32_t>(e);
    tile += n;
  }
  *num_tiles = tile;
}

__global__ void scatter_kernel(const int32_t* ids, int64_t pairs, int64_t E, const int32_t* offsets,
                               int32_t* fill, int32_t* sorted) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int32_t e = ids[p];
    if (e >= 0 && e < E) sorted[offsets[e] + atomicAdd(&fill[e], 1)] = static_cast<int32_t>(p);
  }
}

// ---- grouped GEMM ----

enum class Phase { kGateUp, kDown };

struct GemmParams {
  const float* x = nullptr;  // kGateUp: token rows [m, H] (stride ldx); kDown: act rows [max_rows, I]
  int64_t ldx = 0;
  const ExpertView* experts = nullptr;
  const int32_t* sorted = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* num_tiles = nullptr;
  int64_t top_k = 0, hidden = 0, inter = 0;
  float* out = nullptr;  // kGateUp: gu [max_rows, 2I]; kDown: y [pairs, H]
};

// Per-tile setup shared by both GEMM kernels: row pointers of A (nullptr: padding), weight row pointers
// of B (nullptr: past N), the pair of each row; returns false when the tile is past the device count.
template <Phase P>
__device__ bool setup_tile(const GemmParams& p, int64_t K, int64_t N, int64_t n0, const float** arow,
                           const char** brow, int32_t* pair, DType* bdtype, const float** bias) {
  const int tile = blockIdx.x;
  if (tile >= *p.num_tiles || n0 >= N) return false;
  const ExpertView& ex = p.experts[p.tile_expert[tile]];
  for (int i = threadIdx.x; i < kTileM; i += blockDim.x) {
    int64_t r = static_cast<int64_t>(tile) * kTileM + i;
    int32_t pr = p.sorted[r];
    pair[i] = pr;
    if (pr < 0) {
      arow[i] = nullptr;
    } else if (P == Phase::kGateUp) {
      arow[i] = p.x + (pr / p.top_k) * p.ldx;
    } else {
      arow[i] = p.x + r * p.inter;
    }
  }
  for (int j = threadIdx.x; j < kTileN; j += blockDim.x) {
    int64_t n = n0 + j;
    const char* ptr = nullptr;
    if (n < N) {
      if (P == Phase::kDown) {
        ptr = static_cast<const char*>(ex.down.data) + n * K * dtype_size(ex.down.dtype);
      } else if (ex.gate_up.data != nullptr) {
        ptr = static_cast<const char*>(ex.gate_up.data) + n * K * dtype_size(ex.gate_up.dtype);
      } else if (n < p.inter) {
        ptr = static_cast<const char*>(ex.gate.data) + n * K * dtype_size(ex.gate.dtype);
      } else {
        ptr = static_cast<const char*>(ex.up.data) + (n - p.inter) * K * dtype_size(ex.up.dtype);
      }
    }
    brow[j] = ptr;
  }
  if (threadIdx.x == 0) {
    *bdtype =
        P == Phase::kDown ? ex.down.dtype : (ex.gate_up.data != nullptr ? ex.gate_up.dtype : ex.gate.dtype);
    *bias = P == Phase::kDown ? ex.down_bias : (ex.gate_up.data != nullptr ? ex.gate_up_bias : nullptr);
  }
  __syncthreads();
  return true;
}

template <Phase P>
__device__ void store_tile_value(const GemmParams& p, int32_t pair, int64_t r, int64_t n, int64_t N,
                                 float v) {
  if (P == Phase::kGateUp) {
    p.out[r * N + n] = v;
  } else {
    p.out[static_cast<int64_t>(pair) * N + n] = v;
  }
}

// bf16 tensor cores: 4 warps, each a 32×32 quarter of the 64×64 tile as 2×2 WMMA 16×16×16 fragments.
constexpr int kTcK = 32;
constexpr int kTcPad = 8;

template <Phase P>
__global__ void __launch_bounds__(128) moe_gemm_tc(GemmParams p) {
  using namespace nvcuda;
  __shared__ __align__(32) __nv_bfloat16 As[kTileM][kTcK + kTcPad];
  __shared__ __align__(32) __nv_bfloat16 Bs[kTileN][kTcK + kTcPad];
  __shared__ __align__(32) float Cs[kTileM][kTileN + 4];
  __shared__ const float* arow[kTileM];
  __shared__ const char* brow[kTileN];
  __shared__ int32_t pair[kTileM];
  __shared__ DType bdtype;
  __shared__ const float* bias;
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  if (!setup_tile<P>(p, K, N, n0, arow, brow, pair, &bdtype, &bias)) return;
  const int warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  const DType dt = bdtype;
  for (int64_t k0 = 0; k0 < K; k0 += kTcK) {
    for (int idx = threadIdx.x; idx < kTileM * kTcK; idx += blockDim.x) {
      int r = idx / kTcK, kk = idx % kTcK;
      int64_t k = k0 + kk;
      const float* ar = arow[r];
      As[r][kk] = __float2bfloat16_rn(ar && k < K ? ar[k] : 0.0f);
      const char* br = brow[r];  // kTileN == kTileM
      Bs[r][kk] = br && k < K ? load_as_bf16(br, dt, k) : __float2bfloat16_rn(0.0f);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTcK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &As[wm * 32 + i * 16][kk], kTcK + kTcPad);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &Bs[wn * 32 + j * 16][kk], kTcK + kTcPad);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], kTileN + 4,
                              wmma::mem_row_major);
  __syncthreads();
  for (int idx = threadIdx.x; idx < kTileM * kTileN; idx += blockDim.x) {
    int r = idx / kTileN, c = idx % kTileN;
    int64_t n = n0 + c;
    if (n >= N || pair[r] < 0) continue;
    float v = Cs[r][c] + (bias ? bias[n] : 0.0f);
    store_tile_value<P>(p, pair[r], static_cast<int64_t>(blockIdx.x) * kTileM + r, n, N, v);
  }
}

// fp32 FMA: 256 threads, each 4×4 outputs (rows ty + 16i, columns tx + 16j).
constexpr int kF32K = 16;

template <Phase P>
__global__ void __launch_bounds__(256) moe_gemm_f32(GemmParams p) {
  __shared__ float As[kTileM][kF32K + 1];
  __shared__ float Bs[kTileN][kF32K + 1];
  __shared__ const float* arow[kTileM];
  __shared__ const char* brow[kTileN];
  __shared__ int32_t pair[kTileM];
  __shared__ DType bdtype;
  __shared__ const float* bias;
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  if (!setup_tile<P>(p, K, N, n0, arow, brow, pair, &bdtype, &bias)) return;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  const DType dt = bdtype;
  for (int64_t k0 = 0; k0 < K; k0 += kF32K) {
    for (int idx = threadIdx.x; idx < kTileM * kF32K; idx += blockDim.x) {
      int r = idx / kF32K, kk = idx % kF32K;
      int64_t k = k0 + kk;
      const float* ar = arow[r];
      As[r][kk] = ar && k < K ? ar[k] : 0.0f;
      const char* br = brow[r];
      Bs[r][kk] = br && k < K ? load_as_f32(br, dt, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kF32K; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[ty + 16 * i][kk];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[tx + 16 * j][kk];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int r = ty + 16 * i;
    if (pair[r] < 0) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int64_t n = n0 + tx + 16 * j;
      if (n >= N) continue;
      store_tile_value<P>(p, pair[r], static_cast<int64_t>(blockIdx.x) * kTileM + r, n, N,
                          acc[i][j] + (bias ? bias[n] : 0.0f));
    }
  }
}

// ---- LoRA, activation, combine ----

// One block per sorted row: the LoRA of (its token's slot, its expert), on gate_up (down == false, input
// the token's x, output the gu row) or on down (input the act row, output the pair's y row).
__global__ void moe_lora_kernel(MoeExpertsArgs a, const int32_t* sorted, const int32_t* num_tiles,
                                const float* gu_in, float* gu, const float* act, float* y, bool down) {
  __shared__ float s_mid[cuda_util::kLoraRankChunk];
  const int64_t r = blockIdx.x;
  if (r >= static_cast<int64_t>(*num_tiles) * kTileM) return;
  const int32_t pr = sorted[r];
  if (pr < 0) return;
  const int64_t t = pr / a.top_k;
  const int32_t slot = a.token_slots[t];
  if (slot < 0 || slot >= a.num_slots) return;
  const ExpertLoraView& lv = a.lora[slot * a.num_experts + a.ids[pr]];
  const int64_t I = a.inter;
  if (down) {
    if (lv.down.a != nullptr)
      cuda_util::lora_row(lv.down, act + r * I, y + static_cast<int64_t>(pr) * a.hidden, s_mid);
    return;
  }
  const float* x = a.x + t * a.ldx;
  float* g = gu + r * 2 * I;
  if (lv.gate_up.a != nullptr) cuda_util::lora_row(lv.gate_up, x, g, s_mid);
  if (lv.gate.a != nullptr) cuda_util::lora_row(lv.gate, x, g, s_mid);
  if (lv.up.a != nullptr) cuda_util::lora_row(lv.up, x, g + I, s_mid);
}

__global__ void moe_act_kernel(const int32_t* sorted, const int32_t* num_tiles, const float* gu, float* act,
                               int64_t max_rows, int64_t I, ExpertAct kind, float alpha, float limit) {
  const int64_t rows = static_cast<int64_t>(*num_tiles) * kTileM;
  const int64_t total = (rows < max_rows ? rows : max_rows) * I;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = idx / I, j = idx % I;
    if (sorted[r] < 0) continue;
    const float* g = gu + r * 2 * I;
    float v;
    switch (kind) {
      case ExpertAct::kSiluGate: {
        float x = g[j];
        v = x / (1.0f + expf(-x)) * g[I + j];
        break;
      }
      case ExpertAct::kGptOssSwiglu: {
        float x = fminf(g[2 * j], limit);
        float u = fminf(fmaxf(g[2 * j + 1], -limit), limit);
        v = (u + 1.0f) * (x * (1.0f / (1.0f + expf(-x * alpha))));
        break;
      }
    }
    act[idx] = v;
  }
}

__global__ void moe_combine_kernel(const float* y, const int32_t* ids, const float* weights, int64_t top_k,
                                   int64_t H, int64_t E, float* out, int64_t ldo) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = 0; k < top_k; ++k) {
      int64_t p = t * top_k + k;
      int32_t e = ids[p];
      if (e < 0 || e >= E) continue;
      sum += weights[p] * y[p * H + i];
    }
    out[t * ldo + i] = sum;
  }
}

}  // namespace

void route(const RouteArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  KERNEL_CHECK(a.top_k >= 1 && a.top_k <= a.num_experts, "route: top_k must be in 1..num_experts");
  size_t smem = static_cast<size_t>(kRouteWarps * a.num_experts) * (sizeof(float) + 1);
  KERNEL_CHECK(smem <= 48 * 1024, "route: too many experts for one block's shared memory");
  unsigned blocks = static_cast<unsigned>((a.m + kRouteWarps - 1) / kRouteWarps);
  route_kernel<<<blocks, kRouteWarps * 32, smem, cuda_util::stream(ctx)>>>(a);
  CUDA_CHECK_LAUNCH();
}

size_t moe_experts_workspace_bytes(const MoeExpertsArgs& a) {
  return MoeWorkspace(a, nullptr).bytes;
}

void moe_experts(const MoeExpertsArgs& a, bool tensor_cores, const CudaContext& ctx) {
  if (a.m == 0) return;
  MoeWorkspace ws(a, ctx.workspace);
  KERNEL_CHECK(ws.bytes <= ctx.workspace_bytes, "moe_experts: workspace too small");
  KERNEL_CHECK(ws.max_tiles < (1LL << 31) && (2 * a.inter + kTileN - 1) / kTileN <= 65535 &&
                   (a.hidden + kTileN - 1) / kTileN <= 65535,
               "moe_experts: shape too large for the grid");
  cudaStream_t st = cuda_util::stream(ctx);
  const int64_t E = a.num_experts, I = a.inter, H = a.hidden;
  // 1. align
  CUDA_CHECK(cudaMemsetAsync(ws.counts, 0, static_cast<size_t>(4 * E), st));
  CUDA_CHECK(cudaMemsetAsync(ws.fill, 0, static_cast<size_t>(4 * E), st));
  CUDA_CHECK(cudaMemsetAsync(ws.sorted, 0xff, static_cast<size_t>(4 * ws.max_rows), st));
  unsigned pair_blocks = cuda_util::blocks_for(ws.pairs, 256, 4096);
  count_kernel<<<pair_blocks, 256, 0, st>>>(a.ids, ws.pairs, E, ws.counts);
  CUDA_CHECK_LAUNCH();
  offsets_kernel<<<1, 32, 0, st>>>(ws.counts, E, ws.offsets, ws.tile_expert, ws.num_tiles);
  CUDA_CHECK_LAUNCH();
  scatter_kernel<<<pair_blocks, 256, 0, st>>>(a.ids, ws.pairs, E, ws.offsets, ws.fill, ws.sorted);
  CUDA_CHECK_LAUNCH();

  GemmParams gp;
  gp.experts = a.experts;
  gp.sorted = ws.sorted;
  gp.tile_expert = ws.tile_expert;
  gp.num_tiles = ws.num_tiles;
  gp.top_k = a.top_k;
  gp.hidden = H;
  gp.inter = I;
  // 2. gate_up
  gp.x = a.x;
  gp.ldx = a.ldx;
  gp.out = ws.gu;
  dim3 grid_gu(static_cast<unsigned>(ws.max_tiles), static_cast<unsigned>((2 * I + kTileN - 1) / kTileN));
  if (tensor_cores) {
    moe_gemm_tc<Phase::kGateUp><<<grid_gu, 128, 0, st>>>(gp);
  } else {
    moe_gemm_f32<Phase::kGateUp><<<grid_gu, 256, 0, st>>>(gp);
  }
  CUDA_CHECK_LAUNCH();
  const bool lora = a.token_slots && a.lora && a.num_slots > 0;
  // 3. gate_up LoRA
  if (lora) {
    moe_lora_kernel<<<static_cast<unsigned>(ws.max_rows), 256, 0, st>>>(a, ws.sorted, ws.num_tiles, ws.gu,
                                                                        ws.gu, ws.act, ws.y, false);
    CUDA_CHECK_LAUNCH();
  }
  // 4. activation
  moe_act_kernel<<<cuda_util::blocks_for(ws.max_rows * I, 256, 8192), 256, 0, st>>>(
      ws.sorted, ws.num_tiles, ws.gu, ws.act, ws.max_rows, I, a.act, a.swiglu_alpha, a.swiglu_limit);
  CUDA_CHECK_LAUNCH();
  // 5. down
  gp.x = ws.act;
  gp.ldx = I;
  gp.out = ws.y;
  dim3 grid_down(static_cast<unsigned>(ws.max_tiles), static_cast<unsigned>((H + kTileN - 1) / kTileN));
  if (tensor_cores) {
    moe_gemm_tc<Phase::kDown><<<grid_down, 128, 0, st>>>(gp);
  } else {
    moe_gemm_f32<Phase::kDown><<<grid_down, 256, 0, st>>>(gp);
  }
  CUDA_CHECK_LAUNCH();
  // 6. down LoRA
  if (lora) {
    moe_lora_kernel<<<static_cast<unsigned>(ws.max_rows), 256, 0, st>>>(a, ws.sorted, ws.num_tiles, ws.gu,
                                                                        ws.gu, ws.act, ws.y, true);
    CUDA_CHECK_LAUNCH();
  }
  // 7. combine
  moe_combine_kernel<<<static_cast<unsigned>(a.m), 256, 0, st>>>(ws.y, a.ids, a.weights, a.top_k, H, E, a.out,
                                                                 a.ldo);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
