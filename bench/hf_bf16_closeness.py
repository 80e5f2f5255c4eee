#!/usr/bin/env python3
"""bench/hf_bf16_closeness.py: applies vLLM's close-logprobs rule to Hugging Face's *own* bf16 forward on the
fixture models (greedy, 24 tokens) against the fp32 reference, to tell how often bf16 rounding alone breaks
the rule on these tiny random MoE models. Prints one line per failing case and a summary."""
import json, os, sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def top5(logits):
    return torch.topk(logits.float(), 5).indices.tolist()


def main(root):
    total = fails = 0
    for name in ["llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "mixtral-tiny"]:
        d = os.path.join(root, name)
        meta = json.load(open(os.path.join(d, "reference.json")))
        ref = load_file(os.path.join(d, "reference.safetensors"))
        for variant in meta["variants"]:
            if variant == "per-expert-r8":
                continue  # its reference is a merged checkpoint, not a PEFT model
            models = {}
            for dtype in (torch.float32, torch.bfloat16):
                m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).cuda().eval()
                if variant != "base":
                    from peft import PeftModel
                    m = PeftModel.from_pretrained(m, os.path.join(d, meta["adapters"][variant])).cuda().eval()
                models[dtype] = m
            for i in range(len(meta["prompts"])):
                prompt = ref[f"prompt.{i}"].tolist()
                ref_tokens = ref[f"{variant}.greedy.{i}"].tolist()
                with torch.no_grad():
                    ids = torch.tensor([prompt]).cuda()
                    out = models[torch.bfloat16].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                                                          min_new_tokens=24, do_sample=False, output_scores=True,
                                                          return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
                    ours = out.sequences[0, len(prompt):].tolist()
                    ours_top = [top5(s[0]) for s in out.scores]
                    forced = torch.tensor([prompt + ref_tokens[:-1]]).cuda()
                    ref_logits = models[torch.float32](forced).logits[0]
                    ref_top = [top5(ref_logits[len(prompt) - 1 + s]) for s in range(len(ref_tokens))]
                total += 1
                for s, (a, b) in enumerate(zip(ours, ref_tokens)):
                    if a == b:
                        continue
                    ok = a in ref_top[s] and b in ours_top[s]
                    if not ok:
                        fails += 1
                        print(f"HF bf16 fails close-logprobs: {name} {variant} prompt {i} step {s}: {a} vs {b}")
                    break
    print(f"HF bf16 close-logprobs: {total - fails}/{total} cases pass")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/models")
