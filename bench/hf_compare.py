#!/usr/bin/env python3
"""bench/hf_compare.py: Hugging Face transformers on a config.json alone (random bf16 weights on the GPU):
load time, memory, prefill and decode tokens per second at the given batch sizes, as JSON. Run on the GPU
machine in the same job as `polylora_bench device` (scripts/gpu_bench.sh), so the two are compared on one
GPU in one run. Same prompt length and generated tokens as polylora; greedy decoding with the KV cache."""
import argparse, json, time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    cfg = AutoConfig.from_pretrained(a.config)
    if getattr(cfg, "quantization_config", None) is not None:  # gpt-oss ships MXFP4; compare in bf16
        try:
            delattr(cfg, "quantization_config")
        except AttributeError:
            cfg.quantization_config = None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    out = {"engine": "hf-transformers", "model": cfg.model_type, "load_seconds": load_s,
           "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
           "attn_implementation": getattr(model.config, "_attn_implementation", None),
           "prompt_len": a.prompt_len, "decode_tokens": a.decode_tokens, "runs": []}
    g = torch.Generator(device="cpu").manual_seed(0)
    for b in [int(x) for x in a.batches.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (b, a.prompt_len), generator=g).cuda()
        mask = torch.ones_like(ids)
        with torch.no_grad():
            model(ids[:, :16], attention_mask=mask[:, :16])  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids, attention_mask=mask, use_cache=True)
            torch.cuda.synchronize()
            prefill_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=a.decode_tokens, min_new_tokens=a.decode_tokens,
                           do_sample=False, pad_token_id=0, eos_token_id=None)
            torch.cuda.synchronize()
            gen_s = time.perf_counter() - t0
        decode_s = max(gen_s - prefill_s, 1e-9)  # generate = one prefill + (decode_tokens - 1) decode steps
        steps = a.decode_tokens - 1
        run = {"batch": b, "prefill_tok_per_s": b * a.prompt_len / prefill_s,
               "decode_tok_per_s": b * steps / decode_s, "decode_ms_per_step": 1e3 * decode_s / steps}
        print(f"batch {b}: prefill {run['prefill_tok_per_s']:.0f} tok/s, decode {run['decode_tok_per_s']:.1f} tok/s",
              flush=True)
        out["runs"].append(run)
    out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(out, indent=2))
    if a.json_out:
        json.dump(out, open(a.json_out, "w"), indent=2)


if __name__ == "__main__":
    main()
