// kernels/tuning.h: tuned kernel parameters (DESIGN.md §4): the CUDA MoE and LoRA kernels' path bounds,
// per device name and expert shape, kept as data. Files (JSON, below) are compiled in from
// src/kernels/tuning/*.json (H200 shipped) and read at first use from the folder POLYLORA_TUNED_CONFIG_FOLDER
// names (as vLLM's VLLM_TUNED_CONFIG_FOLDER), whose entries win over the compiled-in ones;
// `polylora_bench tune` measures and writes them. The CUDA backend names its device (set_tuning_device)
// before its first kernel; kernels' host code asks for the values of their call's shape
// (kernel_tuning). The POLYLORA_* variables named per field still override single values for A/B runs.
// A file:
//   {"device": "NVIDIA H200", "source": "how the values were obtained",
//    "entries": [{"hidden": 2880, "inter": 2880, "experts": 32, "mxfp4_mma_per_expert": 8, ...}, ...]}
// An entry with hidden/inter/experts 0 (or absent) matches every shape; the most specific matching entry
// of the device's files applies, field by field over the defaults (unknown fields are an error, so a typo
// cannot silently leave a default in place). Must not: depend on anything above common/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace polylora::kernels {

struct KernelTuning {
  // MoE experts (kernels/moe/moe_cuda.cu): token-expert pairs up to which the weight-streaming paths run
  // (−1: max(512, moe_tc_max_per_expert · E) with tensor cores, 512 without); env POLYLORA_MOE_SMALL_PAIRS.
  int64_t moe_small_pairs = -1;
  // Pairs per expert (on average) from which BF16/F16 experts take the tensor-core weight-streaming kernel
  // instead of the fp32 GEMV; env POLYLORA_MOE_TC_MIN_PER_EXPERT.
  int64_t moe_tc_min_per_expert = 1;
  // ... up to which they stay on it (above, the grouped GEMM); env POLYLORA_MOE_TC_MAX_PER_EXPERT.
  int64_t moe_tc_max_per_expert = 16;
  // MXFP4 experts with tensor cores: pairs per expert from which the tensor-core weight-streaming kernel
  // (moe_gemv_mxfp4.cuh) replaces the fp32 GEMV; env POLYLORA_MXFP4_TC_MIN_PER_EXPERT.
  int64_t mxfp4_tc_min_per_expert = 0;
  // ... and from which the tensor-core grouped GEMM replaces the weight-streaming kernels; env
  // POLYLORA_MXFP4_MMA_PER_EXPERT.
  int64_t mxfp4_mma_per_expert = 64;
  // MXFP4 experts on the tensor-core weight-streaming kernel (moe_gemv_mxfp4.cuh), calls of up to 8 tokens
  // (the decode sizes): stages of its per-warp cp.async pipeline, 2 to 4 (shared memory per CTA 48 / 72 / 96
  // KiB, 3 / 3 / 2 CTAs per multiprocessor). Each warp streams its K quarter of 64 rows (GPT-OSS-20B: 6
  // super-blocks of 128 values) with stages − 1 in flight, so 2 waits a memory latency per super-block
  // (batch 1 gate/up at 1.5 TB/s, session 40's timeline). 3 and 4 pass their tests but gain nothing (session
  // 42, H100, with the fused activation below: moe-lora MXFP4 M = 1 / 4 / 8 53.6 / 127.2 / 175.1 us with 2
  // stages, 53.4 / 120.2 / 174.0 with 3, 58.1 / 135.7 / 197.6 with 4; batch-1 decode 3.091 / 3.085 / 2.954
  // ms per step, batch 8 6.542 / 6.466 / 6.941); env POLYLORA_MOE_GEMV_MXFP4_STAGES.
  int64_t moe_gemv_mxfp4_stages = 2;
  // 1: the tensor-core weight-streaming paths (BF16 and MXFP4 experts) write GPT-OSS's activation in the
  // gate/up product's epilogue (the gate and up sums of a pair meet by a warp shuffle; bit-identical to the
  // activation kernel, which no longer runs: one launch fewer per layer, 2.8 us at batch 1 in session 40's
  // MXFP4 timeline) when no expert LoRA reads gu. Its tests pass (session 42, H100) but it measured slower:
  // GPT-OSS-20B MXFP4, 2 stages, moe-lora M = 1 53.6 vs 47.8 us, batch-1 decode 3.091 vs 2.765 ms per step
  // (batch 8 6.542 vs 6.627): off; env POLYLORA_MOE_GEMV_FUSED_ACT.
  int64_t moe_gemv_fused_act = 0;
  // Tokens up to which moe_experts with its routing (MoeExpertsArgs::route) routes them, sorts the pairs by
  // expert and casts the activations to bf16 in one launch on the weight-streaming paths (one CTA routes
  // and sorts, the others cast); larger batches take route_kernel's CTAs and the separate sort. 0: never;
  // env POLYLORA_MOE_ROUTE_FUSED_MAX_TOKENS. H100, GPT-OSS-20B MXFP4, `polylora_bench device` (session 50,
  // two runs each): batch 1 375.3 / 375.4 tok/s with 1 against 369.3 / 370.1 with 0; with 16 (and the
  // combine-norm launch) batches 4 / 16 lost 2-4%, so 1.
  int64_t moe_route_fused_max_tokens = 1;
  // 1: moe_experts given the residual add and norm after it (MoeExpertsArgs::then_norm) runs them in the
  // plain combine's launch (cuda::add_rms_norm_combined; bit-identical); 0: the combine, then add_rms_norm.
  // env POLYLORA_MOE_COMBINE_NORM. H100, MXFP4 (session 50): alone it lost 0.8% at batch 1 (366.7 vs 369.3 /
  // 370.1 tok/s) and 3% at batch 4 (810.0 / 812.1 vs 836.0 / 836.9): off.
  int64_t moe_combine_norm = 0;
  // BF16/F16 experts on the grouped-GEMM path without the LoRA epilogue, on compute capability 9.0: pairs
  // per expert (on average) from which the Hopper warpgroup-MMA GEMM (moe_gemm_wgmma.cuh: 128-row tiles,
  // wgmma from 128-byte-swizzled cp.async stages) replaces the mma.sync one; 0: never. H200, GPT-OSS-20B
  // bf16 experts (session 40, `polylora_bench moe-lora`): M = 1,024 / 4,096 / 8,192 tokens 1,542 / 2,600 /
  // 4,914 us against 3,000 / 5,820 / 11,126 with mma.sync (332 TFLOP/s at 8k, 0.48 of the GEMM peak
  // measured in the run), with 8 adapters 2,622 / 4,742 / 8,872 against 3,504 / 7,037 / 13,394; env
  // POLYLORA_MOE_WGMMA_PER_EXPERT. Its output
  // columns per CTA (128 or 256; env POLYLORA_MOE_WGMMA_BN) and row tiles per CTA group of its CTA swizzle
  // (env POLYLORA_MOE_WGMMA_GROUP).
  int64_t moe_wgmma_per_expert = 64;
  int64_t moe_wgmma_bn = 256;
  int64_t moe_wgmma_group = 8;
  // 1: with it, GPT-OSS's activation (interleaved gate/up) fused into the gate/up epilogue when nothing else
  // reads the f32 gate/up outputs (no LoRA, or BF16 stacks on tensor cores): M = 8,192 4,833 vs 4,914 us
  // (session 40); env POLYLORA_MOE_WGMMA_FUSED_ACT.
  int64_t moe_wgmma_fused_act = 1;
  // 1: with BF16 stacks on tensor cores (moe_lora_mma_per_expert) and ranks that are multiples of 8, the
  // warpgroup-MMA GEMM takes the LoRA expand as extra K slices of its own pipeline (one of 64 per run of rows
  // of one adapter in a 128-row tile: [hi | lo] of the shrink's sums times the scale against [B | B]) instead
  // of mma.sync steps in its epilogue. Written after session 51's trace: H200, GPT-OSS-20B MXFP4, 8 adapters,
  // `polylora_bench moe-lora` M = 8,192 under the CUPTI tracer, the LoRA variants of the GEMM took 6,937 /
  // 2,958 us (gate/up / down) against 4,953 / 2,399 without LoRA, the two shrinks 130 us each: the
  // epilogue variant is ~2 ms of the 2.8 ms the adapters cost per layer. Session 52, H100 (with
  // moe_lora_mma_per_expert 64), `polylora_bench moe-lora` 8 adapters, LoRA cost per layer at M = 1,024 /
  // 4,096 / 8,192: MXFP4 experts 251 / 505 / 912 us against 382 / 762 / 1,559 in the epilogue, bf16 361 /
  // 749 / 1,400 against 676 / 1,651 / 3,175, each validated against the CPU reference with the same errors
  // as the epilogue's; `polylora_bench device` MXFP4 prefill with 8 adapters 27,643 / 26,698 tok/s (16 / 64
  // x 512 tokens) against 27,241 / 26,312: on; env POLYLORA_MOE_WGMMA_LORA_EXT.
  int64_t moe_wgmma_lora_ext = 1;
  // 1: with it, MXFP4 experts take the warpgroup-MMA GEMM too (their codes decoded into its B tiles; 128
  // columns per CTA). Its GPU test failed in session 40 (the grid counted column tiles in the tuning's BN
  // 256, half of every row unwritten); fixed in session 41, passing in session 42 on an H100, where
  // `polylora_bench moe-lora --dtype mxfp4` (GPT-OSS-20B experts) took M = 1,024 / 4,096 / 8,192 1,386 /
  // 3,975 / 7,468 us against 1,985 / 6,808 / 13,043 with the mma.sync GEMM (218 vs 125 TFLOP/s at 8k; with
  // 8 adapters 2,089 / 5,478 / 10,297 against 2,379 / 8,008 / 15,305): on; env POLYLORA_MOE_WGMMA_MXFP4.
  int64_t moe_wgmma_mxfp4 = 1;
  // BF16 slot-stacked expert LoRA on the grouped GEMM: pairs per expert from which the shrinks run on
  // tensor cores and the expands in the GEMMs' epilogues; env POLYLORA_MOE_LORA_MMA_PER_EXPERT.
  int64_t moe_lora_mma_per_expert = 64;
  // Sorted rows up to which the expert LoRA shrinks run as weight-streaming items; env
  // POLYLORA_LORA_GEMV_SHRINK_ROWS.
  int64_t lora_gemv_shrink_rows = 256;
  // Tensor-core weight-streaming MoE paths (BF16 and MXFP4 experts): sorted rows (token-expert pairs) up to
  // which the expert LoRA runs in delta mode (each phase's shrink and expand as one kernel beside the base
  // product, moe_lora_delta_kernel) instead of the expand-fused activation and combine; 0: never; env
  // POLYLORA_MOE_LORA_DELTA_ROWS.
  int64_t moe_lora_delta_rows = 16;
  // ... and from which (sorted rows; 0: every call up to moe_lora_delta_rows). At batch 1 (4 rows) the
  // delta kernel beside the MXFP4 gate/up product slowed the product by 7.6 us per layer (it is bound by
  // instruction issue there, and the two share the multiprocessors), more than the expand-fused activation
  // costs: H100, GPT-OSS-20B MXFP4, 8 adapters (session 47, `polylora_bench device --loras 8`, two runs
  // each) batch 1 3.131 / 3.138 ms per step from 5 rows against 3.192 / 3.180 from 1; batch 4 (16 rows, delta
  // mode either way) 5.086 / 5.088; env POLYLORA_MOE_LORA_DELTA_MIN_ROWS.
  int64_t moe_lora_delta_min_rows = 5;
  // Delta mode's kernel: 0, one CTA per (row, column part), each computing the row's shrink; 2..8, a
  // cluster of that many CTAs per group of rows splitting the shrink's K and the expand's columns
  // (moe_lora_delta_cluster_kernel), for calls of up to moe_lora_delta_cluster_rows sorted rows. H200,
  // GPT-OSS-20B MXFP4 with 8 adapters (session 37): moe-lora M = 1 LoRA cost 8.5 vs 24.7 us per layer,
  // batch-1 decode 3.057 vs 3.175 ms per step; batch 4 (16 rows) 5.085 vs 4.964 ms, so 8 rows; env
  // POLYLORA_MOE_LORA_DELTA_CLUSTER and POLYLORA_MOE_LORA_DELTA_CLUSTER_ROWS.
  int64_t moe_lora_delta_cluster = 8;
  int64_t moe_lora_delta_cluster_rows = 8;
  // Tensor-core and CUDA-core weight-streaming MoE paths (sorted rows are single pairs): calls of up to this
  // many sorted rows run the expert LoRA shrinks that are not items of the products and the expand-fused
  // activation one CTA per sorted row (moe_lora_shrink_rows_kernel, moe_act_lora_rows_kernel); larger ones
  // (and all with 0) the tiled shrink / item shrinks and the tiled activation (8 rows per CTA). H200,
  // GPT-OSS-20B MXFP4, 8 adapters (session 37): M = 16 / 64 / 256 tokens 12.7 / 40.4 / 141 us per layer
  // against 25.3 / 58.0 / 181, and the serving run used them at every size (the default: no bound). Each row
  // CTA reads its key's A and B again (from L2), so prefill chunks of one sequence (an expert's rows all one
  // key) may favour the tiled kernels: not measured yet. Env POLYLORA_MOE_LORA_BY_ROW.
  int64_t moe_lora_by_row = int64_t{1} << 40;
  // With moe_lora_by_row: G > 0 runs those shrinks by group of up to G (<= 8) same-key sorted rows through a
  // cp.async pipeline (moe_lora_shrink_group_kernel). H200, GPT-OSS-20B MXFP4, 8 adapters (session 40,
  // with moe_lora_expand_batched): LoRA cost at M = 16 / 64 / 256 12.3 / 31.5 / 97.3 us per layer against
  // 12.9 / 36.8 / 126.4 without either; env POLYLORA_MOE_LORA_SHRINK_GROUP.
  int64_t moe_lora_shrink_group = 8;
  // 1: that kernel's products split by k (each warp 4 rank rows, each lane 8 of a stage's 256 inputs)
  // instead of by rank row (each thread one rank row, every group row's inputs read again per rank row:
  // ncu on the H100, M = 256, 7.2-way shared-memory bank conflicts, 67 us per call; session 44). Default 1
  // (H100, session 45, MXFP4 experts, 8 adapters: LoRA cost at M = 16 / 64 / 256 11.4 / 35.7 / 93.6 us vs
  // 13.6 / 35.8 / 105.1); env POLYLORA_MOE_LORA_SHRINK_GROUP_KMAJOR.
  int64_t moe_lora_shrink_group_kmajor = 1;
  // 1: on the grouped-GEMM path without the tensor-core LoRA (BF16 experts from 16 to moe_lora_mma_per_expert
  // pairs per expert, e.g. moe-lora M = 256) the expert LoRA shrinks run by group of same-key rows
  // (moe_lora_shrink_group_kernel, as the weight-streaming paths) instead of the tiled split-K shrink, and
  // the expand-fused activation picks its groups by the step's pairs rather than its padded rows. Written in
  // session 56 after an H100 trace of moe-lora M = 256 on BF16 experts (harness layout): LoRA cost 215.5 us
  // per layer, the tiled shrinks 63.7 us x 2 and the group activation 91.1 us (the plain one 19.6) where
  // MXFP4 experts at the same size (weight-streaming path, group shrink, by-row activation) cost 97.7 in all
  // (default 0 until measured); env POLYLORA_MOE_LORA_GEMM_GROUP_SHRINK.
  int64_t moe_lora_gemm_group_shrink = 0;
  // 1: the by-row activation and the combine with the expert LoRA expands issue all of a row's / token's B
  // loads before their sums for ranks up to 16 (with the group shrink above: M = 256 97.3 vs 108.7 us);
  // env POLYLORA_MOE_LORA_EXPAND_BATCHED.
  int64_t moe_lora_expand_batched = 1;
  // G > 0 (<= 8): the by-row activation by groups of up to G same-key sorted rows, each column's B rows
  // loaded once per group (moe_act_lora_group_kernel; compiled, not yet measured on a GPU, session 37); env
  // POLYLORA_MOE_LORA_ACT_GROUP. Measured slower (session 40: M = 64 / 256 43.3 / 113.6 us with it, 31.5 /
  // 97.3 without): off.
  int64_t moe_lora_act_group = 0;
  // With moe_lora_act_group 0: the act-group kernel with groups of 8 when the step has at least this many
  // sorted rows (prefill: ~128 rows per slot and expert at 8,192 tokens over 8 adapters, where the by-row
  // kernel reads each row's 2·I·R B values again: 28.6 of a 330 ms prefill step, H100 session 50); env
  // POLYLORA_MOE_LORA_ACT_GROUP_MIN_ROWS. H100, MXFP4, 8 adapters, 512-token prompts (session 50): prefill
  // 24,942 / 25,057 tok/s at batch 16 with groups against 24,541 / 24,380 (batch 64: 24,686 / 24,767 vs
  // 24,246 / 24,245); at decode sizes groups are slower (batch 64 4,610 vs 4,703 tok/s), hence the bound:
  // 4,096 rows (1,024 tokens of top-4 routing), which no decode step of --max-num-seqs 256 reaches.
  int64_t moe_lora_act_group_min_rows = 4096;
  // 1: the expand-fused MoE activation by row and by group (moe_act_lora_rows_kernel,
  // moe_act_lora_group_kernel) launched with programmatic dependent launch like the kernels around them
  // (launch_pdl; both wait first thing), 0: plainly. H100, session 55, MXFP4, batch-1 decode with 8
  // adapters (scripts/device_b1_ab.sh): 3.090 ms per step with PDL against 3.160 / 3.215 plainly (ratio to
  // the base 0.874 vs 0.857 / 0.842); env POLYLORA_MOE_ACT_LORA_PDL.
  int64_t moe_act_lora_pdl = 1;
  // 1: on a BF16 backend, prefill attention (head_dim 64 or 128) on bf16 tensor cores
  // (kernels/attention/attention_mma_cuda.cu). H200, GPT-OSS-20B bf16, 8 x 2,048-token prompts (session 40):
  // prefill 23,491 vs 20,573 tok/s with the f32 kernel; the bf16 golden tests pass with it; env
  // POLYLORA_ATTENTION_PREFILL_MMA.
  int64_t attention_prefill_mma = 1;
  // N > 0: decode attention (head_dim 64 or 128, GQA groups of 2+ heads) of calls with at least N query rows
  // (tokens) with the query heads of a KV head sharing each K/V read (attention_decode_gqa_kernel); 0: never.
  // H200, GPT-OSS-20B MXFP4, 1,024-token prompts (session 40): batch 64 11.05 vs 12.68 ms per step, batch 1
  // 2.887 vs 2.598 (fewer CTAs), hence a bound; env POLYLORA_ATTENTION_DECODE_GQA.
  int64_t attention_decode_gqa = 32;
  // Decode attention's split-KV grid: CTAs aimed at per multiprocessor (the splits of each (token, head)
  // CTA row fill them) and the fewest keys of the longest context one split takes. The decode kernels load
  // each key group and then use it (no prefetch), so a CTA with many keys waits on memory once per
  // iteration: at batch 1 more, shorter splits hide that latency (measured against the combine's cost);
  // env POLYLORA_ATTENTION_DECODE_CTAS_PER_SM / POLYLORA_ATTENTION_DECODE_SPLIT_KEYS.
  // 1: the split that finishes last merges the splits of its (token, head) itself (counters in
  // CudaContext::counters) instead of a combine kernel after them: one launch fewer per layer where decode
  // splits (the combine took 5 us per layer at batch 1, session 40's timeline). Its test passes (session 42,
  // H100) but it measured slower: GPT-OSS-20B MXFP4 after 1,024-token prompts, batch 1 2.809 vs 2.792 ms per
  // step, batch 16 8.532 vs 8.463: off; env POLYLORA_ATTENTION_DECODE_FUSED_COMBINE.
  int64_t attention_decode_fused_combine = 0;
  // H200 batch 1 (session 40): 8 CTAs per SM and 32 keys 2.598 ms per step against 2.620 with 2 and 64.
  int64_t attention_decode_ctas_per_sm = 8;
  int64_t attention_decode_split_keys = 32;
  // Steps with LoRA kernels of up to this many tokens keep programmatic dependent launch (Backend::
  // set_lora_step; larger ones launch plainly); env POLYLORA_LORA_PDL_MAX_TOKENS.
  // Every size since session 47 (H100, GPT-OSS-20B MXFP4, 8 adapters, with moe_lora_delta_min_rows 5:
  // batch 16 8.664 / 8.668 ms per step against 8.736 / 8.746 with 4, batch 1 / 4 / 64 within the spread;
  // the expand-fused activation, which PDL made slower, is launched plainly in any case).
  int64_t lora_pdl_max_tokens = int64_t{1} << 40;
  // 1: rope_kv_write's dense q/k/v LoRA expands read each lane's B rows into registers before pdl_wait (head
  // dims that are multiples of 64, bf16 stacks, rank · head_dim / 256 <= 8 pieces), so only the shrink sums
  // wait on the q/k/v product; bit-identical. Written in session 47 with the device time spent: not yet
  // measured, so off; env POLYLORA_ROPE_LORA_B_REGS.
  int64_t rope_lora_b_regs = 0;
  // rope_kv_write (kernels/rope/rope_cuda.cu): steps of from this many tokens (0: never) take one CTA of 8
  // warps per token, each warp looping over the token's heads, instead of a CTA per 4 heads (the cos/sin
  // table computed once per token; 8,192-token prefill: 8,192 CTAs instead of 147,456). Written after
  // session 54's H100 trace (16 x 512-token prefill, GPT-OSS-20B: 0.6 ms per layer for ~0.1 ms of q/k/v
  // traffic). Same session: 14.4 -> 7.5 ms per 8,192-token step, base prefill +2.6%; env
  // POLYLORA_ROPE_KV_WRITE_LOOP_MIN_ROWS.
  int64_t rope_kv_write_loop_min_rows = 256;
  // add_rms_norm with the o_proj LoRA term (kernels/norm/rms_norm_cuda.cu): rows (tokens) up to which a
  // cluster of 8 CTAs takes each row (each adding the term for its slice of the columns) instead of one CTA
  // (which reads every B row on one SM: 4.9 us per layer at batch 1 with 8 adapters, session 40's timeline).
  // Session 42, H100, GPT-OSS-20B MXFP4 with 8 adapters (`polylora_bench device --loras 8`): batch 1 3.268
  // vs 3.321 ms per step (base 2.780 / 2.783), batch 4 5.175 vs 5.155 (base 4.859 / 4.813: within the
  // spread between runs); env POLYLORA_ADD_NORM_LORA_CLUSTER_ROWS.
  int64_t add_norm_lora_cluster_rows = 8;
  // Dense LoRA (kernels/lora/lora_cuda.cu): tokens up to which the shrink runs per token instead of tiled;
  // env POLYLORA_LORA_GEMV_SHRINK_ROWS too.
  int64_t lora_dense_gemv_shrink_rows = 64;
  // Dense LoRA shrinks of from this many tokens (up to 256; 0: never) by adapter slot instead of per token
  // (lora_cuda.cu dense_shrink_slot_kernel: each slot's A rows read once per 8 of its tokens, the input
  // split over 8 warps per block). Written after session 51's H200 timeline of batch-64 decode with 8
  // adapters, where the per-token q/k/v and o shrinks took 8.2 and 8.1 us per layer (17.7 MB of A read for
  // 2.2 MB of distinct rows). H100, session 52 (`polylora_bench device --loras 8`, MXFP4, two rounds): from
  // 16 rows batch-64 decode with 8 adapters 13.46 against 13.60 ms per step (ratio 0.906-0.907 against
  // 0.897), batch 16 within the spread; batch 1 never takes it (one row): 16 since session 56; env
  // POLYLORA_LORA_SLOT_SHRINK_MIN_ROWS.
  int64_t lora_dense_slot_shrink_min_rows = 16;
  // BF16 dense LoRA shrinks of from this many tokens (0: never) on tensor cores (lora_cuda.cu
  // dense_shrink_mma_kernel: 64-token tiles, the f32 input split exactly into three bf16 parts, one pass of
  // the K loop per distinct adapter among a tile's tokens) instead of the CUDA-core tiled shrink. Written
  // after session 52's H100 trace of a 16 x 512-token prefill with 8 adapters (GPT-OSS-20B MXFP4), where the
  // dense shrink and expand kernels took ~1.1 ms per layer of the ~2.7 ms the adapters added. Session 53,
  // H200, `polylora_bench device --prompt-len 512 --batches 16 --loras 8` (MXFP4 config): prefill with 8
  // adapters 27,063 tok/s without it (base 33,763: ratio 0.802), 28,108 from 256 tokens (base 33,762:
  // 0.833); env POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS.
  int64_t lora_dense_shrink_mma_min_rows = 256;
  // Dense LoRA expands of 256 tokens and more (prefill): tiles of 8 tokens per block, 1 or 4 (fewer, longer
  // blocks: the y read-modify-write of 256 outputs x 32 tokens each, the thread's B row re-read from L1 per
  // tile). Session 53, H200, the run above with the tensor-core shrink: 27,741 tok/s with 4 (ratio 0.821)
  // against 28,108 with 1; env POLYLORA_LORA_DENSE_EXPAND_TILES.
  int64_t lora_dense_expand_tiles = 1;
  // BF16 dense LoRA expands of from this many tokens (0: never) on tensor cores (lora_cuda.cu
  // dense_expand_mma_kernel: 64 tokens x 128 outputs per CTA, tmp split exactly into three bf16 parts, one
  // pass per distinct adapter among a tile's tokens) instead of the CUDA-core expand. Written after session
  // 54's H100 trace of a 16 x 512-token prefill with 8 adapters (MXFP4 config), where dense_expand_kernel
  // took 18.8 ms of the ~45 ms of kernel time the adapters added per step (0.39 ms per launch for ~0.1 ms
  // of y traffic). Same session, H100, `polylora_bench device --prompt-len 512 --batches 16 --loras 8`
  // (MXFP4): prefill ratio with 8 adapters 0.865 from 256 tokens against 0.833 with 0 in the same call; env
  // POLYLORA_LORA_DENSE_EXPAND_MMA_MIN_ROWS.
  int64_t lora_dense_expand_mma_min_rows = 256;
  // Outputs per CTA of that tensor-core expand: 128, or 64 (half the accumulator and y registers: 255 per
  // thread at 128, so 2 CTAs of 4 warps per SM; written in session 56 for the prefill expands, which ncu put
  // at ~30% of DRAM bandwidth for a kernel bound by y's read-modify-write). H100, session 56, MXFP4, 16 x
  // 512-token prompts with 8 adapters: prefill 35,064 / 35,078 tok/s at 128 against 34,982 / 35,016 at 64
  // (168 registers, 3 CTAs per SM): no gain, so 128; env POLYLORA_LORA_DENSE_EXPAND_MMA_COLS.
  int64_t lora_dense_expand_mma_cols = 128;
  // Steps of from this many tokens (and past the bf16 split rows) run the q/k/v and o LoRA as extra K
  // columns of their products (kernels::LinearLoraExtArgs, model/lora_dense_ext.h: one cuBLAS GEMM over
  // [x | scaled shrink sums | 1 1] and [W | the slots' B | bias hi lo] in place of the product, its bias add
  // and lora_batch's expand, whose read-modify-write of the f32 outputs took ~9.8 ms of an 8,192-token
  // GPT-OSS-20B step with 8 adapters on the H100, session 57). Costs a copy of the q/k/v and o weights with
  // the tails (GPT-OSS-20B, 8 slots of rank 16: ~1.4 GB). 0: never; env POLYLORA_LORA_DENSE_EXT_MIN_ROWS.
  int64_t lora_dense_ext_min_rows = 0;
  // ... when a product's tail columns (slots x rank for each module, q/k/v stacked: three) are at most
  // this many; env POLYLORA_LORA_DENSE_EXT_MAX_COLS.
  int64_t lora_dense_ext_max_cols = 512;
  // Dense BF16 products (kernels/linear/linear_cuda.cu) with the hi + lo split: rows (tokens) up to which
  // the weight-streaming kernel replaces the split cuBLAS GEMM (at most 16); env POLYLORA_LINEAR_STREAM_ROWS.
  int64_t linear_stream_max_rows = 8;
  // 1: a group of BF16 products over one x that does not stream in one launch (q/k/v at prefill) casts x to
  // bf16 once for all its cuBLAS products instead of once per product (linear_cuda.cu shares_cast; the same
  // results). Written in session 54 after its H100 prefill trace (cast_rows_bf16_kernel 9.2 ms per
  // 8,192-token step, 5 casts per layer of which q/k/v's 3 read the same rows). H100, session 55, MXFP4,
  // 16 x 512-token prompts: prefill 34,557 vs 34,051 tok/s base, 29,249 vs 28,810 with 8 adapters (+1.5%);
  // GpuLinear.* pass with both settings; env POLYLORA_LINEAR_GROUP_SHARED_CAST.
  int64_t linear_group_shared_cast = 1;
  // 1: a dense LoRA shrink that is a launch of its own after its projection's cuBLAS product (decode batches
  // past linear_stream_max_rows: q/k/v's and o's) runs beside the product on a second stream
  // (CudaContext::side_stream; parallel branches of the step's graph), joined before what reads it. Written
  // in session 57 after the H100 timeline of batch-64 decode with 8 adapters (MXFP4): the slot shrinks took
  // 6.9 and 6.8 us per layer in series with the products (12 and 26 us of small GEMMs on 64-128 CTAs) for
  // ~2.9 MB of bytes. H100, session 57 (`polylora_bench device --loras 8`, MXFP4, two rounds each): batch 16
  // with 8 adapters 8.681 / 8.688 ms per step against 8.953 / 8.929 (ratio to the base 0.945-0.951 against
  // 0.920), batch 64 13.300 / 13.305 against 13.516 / 13.507 (0.916 against 0.902); its GPU tests pass (the
  // graph replay with the side branch bit for bit equal to eager): on; env
  // POLYLORA_LORA_SHRINK_BESIDE_PRODUCT.
  int64_t lora_shrink_beside_product = 1;
  // Switches and sizes for A/B timing and tests (once read by getenv inside the kernels' files; the same
  // variables set them):
  // 0: every BF16 product through the split cuBLAS GEMM, never the weight-streaming kernel; env
  // POLYLORA_LINEAR_STREAM.
  int64_t linear_stream = 1;
  // Rank rows per warp of the tiled dense / expert LoRA shrink (lora_stack_cuda.cuh): 4, or 8 (each input
  // half read half as often at 255 registers against 230; H200 moe-lora M = 256: 327 us vs 276 with 4); env
  // POLYLORA_LORA_SHRINK_RANKS_PER_WARP.
  int64_t lora_shrink_ranks_per_warp = 4;
  // 0: BF16 experts' small-batch products on the register-streaming moe_gemv_tc_kernel instead of the
  // cp.async pipeline (moe_gemv_pipe.cuh); env POLYLORA_MOE_GEMV_PIPE.
  int64_t moe_gemv_pipe = 1;
  // 0: BF16 expert LoRA on the grouped-GEMM path always through the CUDA-core shrinks and the expand-fused
  // activation and combine, never the tensor-core LoRA (moe_lora_mma_per_expert); env POLYLORA_MOE_LORA_MMA.
  int64_t moe_lora_mma = 1;
  // 0: on the tensor-core weight-streaming path, the expert LoRA shrinks that do not ride in the products'
  // extra CTAs run between the products instead of beside them; env POLYLORA_MOE_LORA_BESIDE.
  int64_t moe_lora_beside = 1;
  // 0: each expert's rows in token order only, not grouped by adapter slot (with slot-stacked LoRA); env
  // POLYLORA_MOE_SLOT_ORDER.
  int64_t moe_slot_order = 1;
  // 1: MXFP4 expert products take the hi + lo bf16 split of their activations too (CudaContext::bf16_split;
  // off: H200, session 33, decode without it ran 1.36x / 1.38x faster at batch 16 / 64); env
  // POLYLORA_MXFP4_BF16_SPLIT.
  int64_t mxfp4_bf16_split = 0;
  // The expert LoRA delta kernel's least columns per part (every part computes its row's shrink again;
  // batch-4 decode of GPT-OSS-20B with 8 adapters: 4.975 ms per step with 1,024 against 5.204 with 256,
  // H200, session 36); env POLYLORA_MOE_LORA_DELTA_COLS.
  int64_t moe_lora_delta_cols = 1024;
};

// The expert shape an entry applies to (0: any).
struct TuningShape {
  int64_t hidden = 0, inter = 0, experts = 0;
};

struct TuningEntry {
  TuningShape shape;
  // The fields the entry sets, by name (the KernelTuning member names), in file order.
  std::vector<std::pair<std::string, int64_t>> values;
};

struct TuningFile {
  std::string device;  // as the CUDA runtime names it ("NVIDIA H200")
  std::string source;
  std::vector<TuningEntry> entries;
};

// Parses one file's JSON text; errors (bad JSON, a missing device, an unknown field, a non-integer value)
// throw polylora::Error naming `what` and the field.
TuningFile parse_tuning_file(std::string_view json, std::string_view what);
// The file's JSON text (entries in order, then fields in order), as `polylora_bench tune` writes it.
std::string tuning_file_json(const TuningFile& file);
// The KernelTuning field names, in declaration order.
const std::vector<std::string>& tuning_field_names();
// Sets field `name` of t (false: no such field).
bool set_tuning_field(KernelTuning& t, std::string_view name, int64_t value);
std::optional<int64_t> get_tuning_field(const KernelTuning& t, std::string_view name);

// The values for `device` and `shape` from `files` (defaults where no entry of that device matches;
// among matching entries the one with the most non-zero shape fields, the later on ties, applies), without
// the environment overrides.
KernelTuning resolve_tuning(const std::vector<TuningFile>& files, std::string_view device,
                            const TuningShape& shape);

// The process's: the device named by set_tuning_device (none: defaults only), the compiled-in files and those
// of POLYLORA_TUNED_CONFIG_FOLDER (read once; a bad file there is an error at first use), then the
// environment overrides. Thread-safe; cheap after the first call per shape.
void set_tuning_device(std::string_view device);
KernelTuning kernel_tuning(const TuningShape& shape);
// Replaces the process's values for every shape until cleared (tests and `polylora_bench tune`, which sweep
// one bound at a time); environment overrides still apply on top.
void override_kernel_tuning(const std::optional<KernelTuning>& t);
// The compiled-in files (src/kernels/tuning/*.json).
const std::vector<TuningFile>& builtin_tuning_files();
// The environment variable that overrides field `name` (empty: no such field).
std::string_view tuning_field_env(std::string_view name);
// Every *.json file of folder `dir`, by file name (errors name the file).
std::vector<TuningFile> load_tuning_folder(const std::string& dir);

// `polylora_bench tune`'s choice of a bound from measurements: points (x ascending, time of the path below
// the bound, time of the path from the bound on): the smallest x from which the second path is faster at x
// and at every larger measured x (so one noisy point does not move the bound down); no such x: `none`.
struct TunePoint {
  int64_t x = 0;
  double below_s = 0, above_s = 0;
};
int64_t pick_crossover(const std::vector<TunePoint>& points, int64_t none);

}  // namespace polylora::kernels
