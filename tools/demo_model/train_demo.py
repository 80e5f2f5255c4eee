#!/usr/bin/env python3
"""tools/demo_model/train_demo.py: trains polylora's built-in demo model (models/demo) from data it makes itself.

What it builds
  * a tiny Qwen3-MoE base model (model_type qwen3_moe: 4 layers, hidden 192, 8 experts top-2) whose plain task
    is to repeat the user's message verbatim;
  * a character-level byte-level BPE tokenizer (tokenizer.json: 4 special tokens + the 256 byte symbols, no
    merges) with a ChatML chat template;
  * LoRA adapters in PEFT format, each trained on top of the frozen base for one checkable task:
        reverse  reverse the order of the words              (attention + fused experts, target_parameters)
        upper    uppercase every letter                      (attention only)
        spell    spell each digit as an English word         (attention + fused experts, target_parameters)
        rot13    rotate every letter by 13 places (a code)   (fused experts only, target_parameters)
  * heldout.jsonl: held-out inputs with the expected output of every task (seed differs from training).

Inputs are 3 to 6 items separated by single spaces; an item is a word from WORDS (70%), a random lowercase
string of 2-7 letters (12%) or a single digit (18%); half of the base model's training inputs also have some
words Capitalized or UPPERCASED (so that it copies capitals too; held-out inputs are all lowercase). The model sees them through the chat template:
    <|im_start|>user\\n{input}<|im_end|>\\n<|im_start|>assistant\\n{output}<|im_end|>
and is trained (loss on {output}<|im_end|> only) to answer with the task's output.

Training runs in plain PyTorch with a model written here to match Hugging Face's Qwen3-MoE exactly (all experts
are computed densely and weighted by the top-k routing weights, which gives the same result as sparse
dispatch), then the weights are exported in the Hugging Face layout (per-expert tensors, as transformers
saves them) and the adapters in PEFT's layout. When transformers and peft are importable the script reloads
the export through them and compares logits, so a layout mistake shows up in the log.

Usage (GPU machine; CPU works, slowly):
    python3 tools/demo_model/train_demo.py --out models/demo            # train + export + verify
    python3 tools/demo_model/train_demo.py --dry-run --out /tmp/demo    # no torch: data, tokenizer, heldout
Deterministic seeds; the step counts are fixed by --base-steps/--adapter-steps, or, when 0 (default), chosen
from --budget seconds after timing a few steps (the counts used are written to the model card). models/demo
was made on one H200 with `--budget 160` (about 150 s of training), which chose
    --base-steps 519 --adapter-steps upper=685,rot13=417,spell=562,reverse=946
(pass these to repeat it with the same step counts; GPU kernels are not bitwise deterministic). The script
writes train_log.txt and train_results.json (step counts, held-out accuracies, examples, the transformers/peft
cross-check) next to the model; the model card (README.md) is written by hand from them.
"""
import argparse
import json
import math
import os
import random
import sys
import time

# ----------------------------------------------------------------------------------------------------------
# Data (pure Python)
# ----------------------------------------------------------------------------------------------------------

WORDS = """the a an red blue green cat dog fox owl bee cow pig hen ant bat elk yak emu sun moon star sky sea
rain snow wind tree leaf rock sand lake hill road town home door book pen cup box bag hat key map ship car bus
train cake milk tea jam egg rice corn fish bird frog duck lion bear wolf deer mouse horse big small old new hot
cold fast slow tall kind blue run sits eats sees likes has is and or but in on at to of with from my your our
jumps reads sings flies swims""".split()
WORDS = sorted(set(WORDS))
DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"

TASKS = ["repeat", "reverse", "upper", "spell", "rot13"]  # repeat = the base model's plain task
ADAPTERS = {
    # name: (what it does, target_modules, target_parameters). Trained in this order: each gets an equal share
    # of the time left, so the easy ones come first and the harder ones inherit what early stops save.
    "upper": ("uppercases every letter", ["q_proj", "k_proj", "v_proj", "o_proj"], []),
    "rot13": ("encodes with ROT13 (every letter moves 13 places; a<->n, b<->o, ...); digits stay",
              [], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    "spell": ("spells each digit as an English word",
              ["q_proj", "k_proj", "v_proj", "o_proj"], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    "reverse": ("reverses the order of the words",
                ["q_proj", "k_proj", "v_proj", "o_proj"], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
}


def make_input(rng, need_digit=False):
    while True:
        n = rng.randint(3, 6)
        items = []
        for _ in range(n):
            u = rng.random()
            if u < 0.70:
                items.append(rng.choice(WORDS))
            elif u < 0.82:
                items.append("".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 7))))
            else:
                items.append(str(rng.randint(0, 9)))
        if need_digit and not any(it.isdigit() for it in items):
            continue
        return " ".join(items)


def case_mix(rng, text):
    """Base-model augmentation: some words Capitalized or UPPERCASED, so that the base model also learns to
    copy capital letters (otherwise their embeddings stay untrained and the `upper` adapter has to invent them)."""
    words = text.split(" ")
    for i, w in enumerate(words):
        u = rng.random()
        if u < 0.15:
            words[i] = w.capitalize()
        elif u < 0.35:
            words[i] = w.upper()
    return " ".join(words)


def rot13(s):
    return "".join(LETTERS[(LETTERS.index(c) + 13) % 26] if c in LETTERS else c for c in s)


def apply_task(task, text):
    if task == "repeat":
        return text
    if task == "reverse":
        return " ".join(reversed(text.split(" ")))
    if task == "upper":
        return text.upper()
    if task == "spell":
        return " ".join(DIGIT_WORDS[int(w)] if w.isdigit() else w for w in text.split(" "))
    if task == "rot13":
        return rot13(text)
    raise ValueError(task)


def make_inputs(seed, count, exclude=(), need_digit_frac=0.0):
    """count distinct inputs; a fraction need_digit_frac of them contain a digit for sure."""
    rng = random.Random(seed)
    seen = set(exclude)
    out = []
    while len(out) < count:
        s = make_input(rng, need_digit=rng.random() < need_digit_frac)
        if s in seen:
            continue
        seen.add(s)
        out.append(s)
    return out


# ----------------------------------------------------------------------------------------------------------
# Tokenizer (pure Python; the same ids as the tokenizer.json written below)
# ----------------------------------------------------------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
BOS_ID, IM_START, IM_END, PAD_ID = 0, 1, 2, 3
BYTE_BASE = len(SPECIALS)
VOCAB_SIZE = BYTE_BASE + 256
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def encode_text(s):
    return [BYTE_BASE + b for b in s.encode("utf-8")]


def decode_ids(ids):
    out = bytearray()
    for i in ids:
        if i >= BYTE_BASE:
            out.append(i - BYTE_BASE)
    return out.decode("utf-8", errors="replace")


def prompt_ids(text):
    """The chat template rendered for one user message plus the generation prompt, as token ids."""
    return [IM_START] + encode_text("user\n" + text) + [IM_END] + encode_text("\n") + [IM_START] + \
        encode_text("assistant\n")


def render_chat(text):
    return "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n"


def tokenizer_json():
    b2u = bytes_to_unicode()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for b in range(256):
        vocab[b2u[b]] = BYTE_BASE + b
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(SPECIALS)]
    split_regex = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
                   "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split_regex}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def write_tokenizer(out):
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False, indent=1)
    cfg = {"backend": "tokenizers", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
           "pad_token": "<|pad|>", "model_max_length": 1024, "tokenizer_class": "TokenizersBackend",
           "clean_up_tokenization_spaces": False}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)


# ----------------------------------------------------------------------------------------------------------
# Model configuration
# ----------------------------------------------------------------------------------------------------------

ARCH = dict(hidden=192, layers=4, heads=6, kv_heads=2, head_dim=32, experts=8, top_k=2, moe_inter=256,
            eps=1e-6, theta=1000000.0, max_pos=512)
LORA_R, LORA_ALPHA = 16, 32


def hf_config():
    a = ARCH
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": BOS_ID, "decoder_sparse_step": 1, "dtype": "bfloat16", "eos_token_id": IM_END,
        "head_dim": a["head_dim"], "hidden_act": "silu", "hidden_size": a["hidden"], "initializer_range": 0.02,
        "intermediate_size": 4 * a["hidden"], "max_position_embeddings": a["max_pos"], "mlp_only_layers": [],
        "model_type": "qwen3_moe", "moe_intermediate_size": a["moe_inter"], "norm_topk_prob": True,
        "num_attention_heads": a["heads"], "num_experts_per_tok": a["top_k"], "num_hidden_layers": a["layers"],
        "num_key_value_heads": a["kv_heads"], "num_local_experts": a["experts"], "output_router_logits": False,
        "pad_token_id": PAD_ID, "rms_norm_eps": a["eps"],
        "rope_parameters": {"rope_theta": a["theta"], "rope_type": "default"},
        "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
        "transformers_version": "5.17.0", "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB_SIZE,
    }


def adapter_config(name):
    _, modules, params = ADAPTERS[name]
    return {
        "alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None,
        "auto_mapping": {"base_model_class": "Qwen3MoeForCausalLM",
                         "parent_library": "transformers.models.qwen3_moe.modeling_qwen3_moe"},
        "base_model_name_or_path": "models/demo", "bias": "none", "corda_config": None,
        "ensure_weight_tying": False, "eva_config": None, "exclude_modules": None, "fan_in_fan_out": False,
        "inference_mode": True, "init_lora_weights": True, "kasa_config": None, "layer_replication": None,
        "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": LORA_ALPHA,
        "lora_bias": False, "lora_dropout": 0.0, "lora_ga_config": None, "megatron_config": None,
        "megatron_core": "megatron.core", "modules_to_save": None, "monteclora_config": None, "peft_type": "LORA",
        "peft_version": "0.21.0", "qalora_group_size": 16, "r": LORA_R, "rank_pattern": {}, "revision": None,
        "target_modules": modules, "target_parameters": params, "task_type": None,
        "trainable_token_indices": None, "use_bdlora": None, "use_dora": False, "use_qalora": False,
        "use_rslora": False, "velora_config": None,
    }


def write_heldout(out, n_per_task=200):
    """Held-out test set (seed 2), disjoint from validation (seed 1) and training (seed 3) inputs."""
    rows = []
    inputs = make_inputs(2, n_per_task)
    digit_inputs = make_inputs(22, n_per_task, need_digit_frac=1.0)
    for task in TASKS:
        for s in (digit_inputs if task == "spell" else inputs):
            rows.append({"task": task, "adapter": None if task == "repeat" else task, "input": s,
                         "output": apply_task(task, s)})
    with open(os.path.join(out, "heldout.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return inputs, digit_inputs


def dry_run(args):
    os.makedirs(args.out, exist_ok=True)
    write_tokenizer(args.out)
    test_in, test_dig = write_heldout(args.out)
    val = make_inputs(1, 1000)
    train = make_inputs(3, 2000, exclude=set(val) | set(test_in) | set(test_dig))
    maxlen = 0
    for task in TASKS:
        for s in train[:5]:
            print(f"{task:8s} {s!r} -> {apply_task(task, s)!r}")
        for s in train + val:
            maxlen = max(maxlen, len(prompt_ids(s)) + len(encode_text(apply_task(task, s))) + 1)
    print("words", len(WORDS), "max sequence length", maxlen, "vocab", VOCAB_SIZE)
    assert decode_ids(prompt_ids("red fox 3")) == "user\nred fox 3\nassistant\n"
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hf_config(), f, indent=2)
    for name in ADAPTERS:
        os.makedirs(os.path.join(args.out, "adapters", name), exist_ok=True)
        with open(os.path.join(args.out, "adapters", name, "adapter_config.json"), "w") as f:
            json.dump(adapter_config(name), f, indent=2)
    print("dry run ok:", args.out)


def save_safetensors(tensors, path):
    """Minimal safetensors writer (torch tensors on the CPU; F32 or BF16), so the export needs no extra package."""
    import torch
    names = {torch.float32: "F32", torch.bfloat16: "BF16"}
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        raw = t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).numpy().tobytes()
        header[k] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------------------------------------
# Torch part
# ----------------------------------------------------------------------------------------------------------

def torch_main(args):
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    t_start = time.time()
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    use_amp = dev.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    log_lines = []

    def amp(on):
        import contextlib
        return torch.autocast("cuda", dtype=torch.bfloat16) if (on and use_amp) else contextlib.nullcontext()

    def log(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log_lines.append(s)

    a = ARCH
    H, L, NH, NKV, HD, E, K, I = (a["hidden"], a["layers"], a["heads"], a["kv_heads"], a["head_dim"], a["experts"],
                                  a["top_k"], a["moe_inter"])

    # ---------------- data ----------------
    os.makedirs(args.out, exist_ok=True)
    write_tokenizer(args.out)
    test_in, test_dig = write_heldout(args.out)
    val_in = make_inputs(1, 1000)
    val_dig = make_inputs(11, 1000, exclude=set(val_in), need_digit_frac=1.0)
    excl = set(test_in) | set(test_dig) | set(val_in) | set(val_dig)
    train_in = make_inputs(3, args.pool, exclude=excl, need_digit_frac=0.3)
    log(f"data: {len(train_in)} training inputs, {len(val_in)} validation, {len(test_in)} test per task "
        f"({time.time() - t_start:.1f}s)")

    def build(task, inputs):
        seqs, starts = [], []
        for s in inputs:
            p = prompt_ids(s)
            seqs.append(p + encode_text(apply_task(task, s)) + [IM_END])
            starts.append(len(p))
        T = max(len(x) for x in seqs)
        ids = np.full((len(seqs), T), PAD_ID, dtype=np.int64)
        mask = np.zeros((len(seqs), T), dtype=bool)  # mask[t]: token t is a target
        for i, (x, st) in enumerate(zip(seqs, starts)):
            ids[i, :len(x)] = x
            mask[i, st:len(x)] = True
        lens = np.array([len(x) for x in seqs])
        return (torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev), torch.from_numpy(lens).to(dev))

    data_cache = {}

    def task_data(task, split):
        key = (task, split)
        if key not in data_cache:
            if split == "train":
                inputs = train_in
                if task == "spell":  # every spell example contains a digit
                    inputs = [s for s in train_in if any(w.isdigit() for w in s.split(" "))]
                if task == "repeat":  # half of the base model's inputs contain capital letters
                    crng = random.Random(5)
                    inputs = [case_mix(crng, s) if crng.random() < 0.5 else s for s in train_in]
            elif split == "val":
                inputs = val_dig if task == "spell" else val_in
            else:
                inputs = test_dig if task == "spell" else test_in
            data_cache[key] = build(task, inputs)
        return data_cache[key]

    # ---------------- model ----------------
    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            dt = x.dtype
            x = x.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a["eps"])
            return self.weight * x.to(dt)

    def lin(n_in, n_out):
        w = nn.Parameter(torch.empty(n_out, n_in))
        nn.init.normal_(w, std=0.02)
        return w

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(H)
            self.q_proj = lin(H, NH * HD)
            self.k_proj = lin(H, NKV * HD)
            self.v_proj = lin(H, NKV * HD)
            self.o_proj = lin(NH * HD, H)
            self.q_norm = RMSNorm(HD)
            self.k_norm = RMSNorm(HD)
            self.post_attention_layernorm = RMSNorm(H)
            self.gate = lin(H, E)
            self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * I, H) * 0.02)  # transformers 5 fused layout
            self.down_proj = nn.Parameter(torch.randn(E, H, I) * 0.02)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Parameter(torch.randn(VOCAB_SIZE, H) * 0.02)
            self.layers = nn.ModuleList([Layer() for _ in range(L)])
            self.norm = RMSNorm(H)
            self.lm_head = lin(H, VOCAB_SIZE)
            inv = 1.0 / (a["theta"] ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))
            pos = torch.arange(a["max_pos"]).float()
            freqs = torch.outer(pos, inv)
            emb = torch.cat([freqs, freqs], -1)
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", emb.sin(), persistent=False)

        def forward(self, ids, lora=None, valid=None):
            """ids [B,T] -> logits [B,T,V] (float); also the load-balancing loss over `valid` tokens."""
            B, T = ids.shape
            x = F.embedding(ids, self.embed_tokens)
            cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)

            def rot(t):
                t1, t2 = t[..., :HD // 2], t[..., HD // 2:]
                return t * cos + torch.cat([-t2, t1], -1) * sin

            aux = 0.0
            for li, ly in enumerate(self.layers):
                lo = lora.layers[li] if lora is not None else None

                def proj(h, name):
                    y = F.linear(h, getattr(ly, name))
                    if lo is not None and name in lo.mods:
                        y = y + lo.mods[name](h)
                    return y

                h = ly.input_layernorm(x)
                q = ly.q_norm(proj(h, "q_proj").view(B, T, NH, HD)).transpose(1, 2)
                k = ly.k_norm(proj(h, "k_proj").view(B, T, NKV, HD)).transpose(1, 2)
                v = proj(h, "v_proj").view(B, T, NKV, HD).transpose(1, 2)
                q, k = rot(q), rot(k)
                k = k.repeat_interleave(NH // NKV, dim=1)
                v = v.repeat_interleave(NH // NKV, dim=1)
                if hasattr(F, "scaled_dot_product_attention"):
                    att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=HD ** -0.5)
                else:  # torch < 2.0
                    sc = (q @ k.transpose(-1, -2)).float() * HD ** -0.5
                    sc = sc.masked_fill(torch.ones(T, T, dtype=torch.bool, device=sc.device).triu(1), float("-inf"))
                    att = torch.softmax(sc, -1).to(v.dtype) @ v
                x = x + proj(att.transpose(1, 2).reshape(B, T, NH * HD), "o_proj")

                h = ly.post_attention_layernorm(x).reshape(B * T, H)
                logits = F.linear(h, ly.gate)
                probs = torch.softmax(logits.float(), dim=-1)
                topv, topi = probs.topk(K, dim=-1)
                topv = topv / topv.sum(-1, keepdim=True)
                topv = topv.to(h.dtype)
                wgu, wd = ly.gate_up_proj, ly.down_proj
                if lo is not None and lo.experts is not None:
                    if "gate_up_proj" in lo.experts:
                        wgu = wgu + lo.experts["gate_up_proj"].delta()
                    if "down_proj" in lo.experts:
                        wd = wd + lo.experts["down_proj"].delta()
                gu = torch.einsum("nh,eoh->eno", h, wgu.to(h.dtype))
                g, u = gu.chunk(2, dim=-1)
                y = torch.einsum("eni,ehi->enh", F.silu(g) * u, wd.to(h.dtype))
                w = torch.zeros(B * T, E, dtype=h.dtype, device=h.device).scatter(1, topi, topv)
                x = x + torch.einsum("enh,ne->nh", y, w).view(B, T, H)
                if valid is not None:
                    vm = valid.reshape(-1).float()
                    cnt = torch.zeros(B * T, E, device=h.device).scatter(1, topi, 1.0)
                    f = (cnt * vm[:, None]).sum(0) / (vm.sum() * K)
                    p = (probs * vm[:, None]).sum(0) / vm.sum()
                    aux = aux + E * (f * p).sum()
            x = self.norm(x)
            return F.linear(x, self.lm_head).float(), aux

    class DenseLora(nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.A = nn.Parameter(torch.empty(LORA_R, n_in))
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
            self.B = nn.Parameter(torch.zeros(n_out, LORA_R))
            self.scale = LORA_ALPHA / LORA_R

        def forward(self, x):
            return F.linear(F.linear(x, self.A.to(x.dtype)), self.B.to(x.dtype)) * self.scale

    class ExpertLora(nn.Module):
        """PEFT target_parameters LoRA on a fused (E, out, in) tensor: A (E*r, in) expert-major,
        B (out, r*E) expert-minor; delta_e = scale * B_e @ A_e."""

        def __init__(self, n_in, n_out):
            super().__init__()
            self.A = nn.Parameter(torch.empty(E * LORA_R, n_in))
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
            self.B = nn.Parameter(torch.zeros(n_out, LORA_R * E))
            self.scale = LORA_ALPHA / LORA_R
            self.n_in, self.n_out = n_in, n_out

        def delta(self):
            a3 = self.A.view(E, LORA_R, self.n_in)
            b3 = self.B.view(self.n_out, LORA_R, E).permute(2, 0, 1)
            return torch.bmm(b3, a3) * self.scale

    class LoraLayer(nn.Module):
        def __init__(self, modules, params):
            super().__init__()
            dims = {"q_proj": (H, NH * HD), "k_proj": (H, NKV * HD), "v_proj": (H, NKV * HD),
                    "o_proj": (NH * HD, H)}
            self.mods = nn.ModuleDict({m: DenseLora(*dims[m]) for m in modules})
            pd = {"gate_up_proj": (H, 2 * I), "down_proj": (I, H)}
            ex = {p.split(".")[-1]: ExpertLora(*pd[p.split(".")[-1]]) for p in params}
            self.experts = nn.ModuleDict(ex) if ex else None

    class Lora(nn.Module):
        def __init__(self, name):
            super().__init__()
            _, modules, params = ADAPTERS[name]
            self.layers = nn.ModuleList([LoraLayer(modules, params) for _ in range(L)])

    # ---------------- training helpers ----------------
    def loss_fn(model, ids, mask, lens, lora=None, aux_coef=0.0):
        T = int(lens.max())
        ids, mask = ids[:, :T], mask[:, :T]
        valid = ids != PAD_ID
        with amp(True):
            logits, aux = model(ids, lora, valid if aux_coef > 0 else None)
        tgt = mask[:, 1:]
        ce = F.cross_entropy(logits[:, :-1][tgt], ids[:, 1:][tgt])
        return ce + aux_coef * aux, ce

    @torch.no_grad()
    def exact_match(model, task, split, lora=None, fp32=False, n=None):
        ids, mask, lens = task_data(task, split)
        if n is not None:
            ids, mask, lens = ids[:n], mask[:n], lens[:n]
        ok = []
        for i in range(0, ids.shape[0], 500):
            b_ids, b_mask, b_lens = ids[i:i + 500], mask[i:i + 500], lens[i:i + 500]
            T = int(b_lens.max())
            b_ids, b_mask = b_ids[:, :T], b_mask[:, :T]
            with amp(not fp32):
                logits, _ = model(b_ids, lora)
            pred = logits[:, :-1].argmax(-1)
            tgt = b_mask[:, 1:]
            ok.append(((pred == b_ids[:, 1:]) | ~tgt).all(-1))
        return torch.cat(ok).float().mean().item()

    def train_phase(model, params, task_mix, steps, lr, warmup, lora=None, aux_coef=0.0, label="",
                    eval_tasks=(), stop_at=1.1, min_frac=0.5):
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01 if lora is None else 0.0,
                                **({"fused": True} if dev.type == "cuda" else {}))
        gen = torch.Generator(device=dev)
        gen.manual_seed(sum(map(ord, label)))
        datas = [task_data(t, "train") for t in task_mix]
        bs = args.batch
        t0 = time.time()
        done = 0
        for step in range(steps):
            f = step / max(1, steps)
            lr_now = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * f)))
            for g in opt.param_groups:
                g["lr"] = lr_now
            ids, mask, lens = datas[step % len(datas)]
            idx = torch.randint(0, ids.shape[0], (bs,), device=dev, generator=gen)
            loss, ce = loss_fn(model, ids[idx], mask[idx], lens[idx], lora, aux_coef)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            done = step + 1
            if (step + 1) % args.eval_every == 0 or step + 1 == steps:
                accs = {t: exact_match(model, t, "val", lora, n=500) for t in eval_tasks}
                log(f"[{label}] step {step + 1}/{steps} ce {ce.item():.4f} lr {lr_now:.2e} val {accs} "
                    f"({time.time() - t0:.1f}s)")
                if accs and min(accs.values()) >= stop_at and step + 1 >= min_frac * steps:
                    log(f"[{label}] early stop at step {step + 1}")
                    break
        return done

    def time_steps(model, params, task, lora=None, aux_coef=0.0, n=12):
        """Seconds per training step (after 3 warm-up steps), with a throwaway optimizer and restored weights."""
        saved = [p.detach().clone() for p in params]
        opt = torch.optim.SGD(params, lr=0.0)
        ids, mask, lens = task_data(task, "train")
        for i in range(n + 3):
            if i == 3:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.time()
            idx = torch.randint(0, ids.shape[0], (args.batch,), device=dev)
            loss, _ = loss_fn(model, ids[idx], mask[idx], lens[idx], lora, aux_coef)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = (time.time() - t0) / n
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
        return dt * 1.35  # optimizer (AdamW) and evaluation overhead

    # ---------------- base model ----------------
    model = Model().to(dev)
    base_params = [p for p in model.parameters()]
    n_params = sum(p.numel() for p in base_params)
    active = n_params - L * (E - K) * 3 * H * I
    log(f"base model: {n_params} parameters ({active} active per token), device {dev}")
    budget_end = t_start + args.budget
    if args.random_export:  # export check only: random, peaked weights instead of training
        torch.manual_seed(7)
        with torch.no_grad():
            for p in base_params:
                if p.dim() >= 2:
                    p.normal_(0, 0.08)
        base_steps = 0
    elif args.base_steps > 0:
        base_steps = args.base_steps
    else:
        dt = time_steps(model, base_params, "repeat", aux_coef=0.01)
        avail = (budget_end - time.time()) * args.base_share
        base_steps = int(max(300, min(args.max_base_steps, avail / dt)))
        log(f"timing: {dt * 1000:.1f} ms/step -> {base_steps} base steps")
    base_done = train_phase(model, base_params, ["repeat"], base_steps, args.base_lr, 200, aux_coef=0.01,
                            label="base", eval_tasks=["repeat"], stop_at=0.999, min_frac=0.6)
    with torch.no_grad():  # ship bf16: train the adapters against exactly the rounded weights
        for p in base_params:
            p.copy_(p.bfloat16().float())
    for p in base_params:
        p.requires_grad_(False)
    results = {"base": {"steps": base_done, "parameters": n_params, "active_parameters": active}}
    base_acc = {t: exact_match(model, t, "test", fp32=True) for t in TASKS}
    log(f"base model (bf16 weights, fp32 compute) test exact-match per task: {base_acc}")
    results["base"]["test_exact_match"] = base_acc

    # ---------------- adapters ----------------
    loras = {}
    names = list(ADAPTERS)
    for ai, name in enumerate(names):
        torch.manual_seed(100 + ai)
        lora = Lora(name).to(dev)
        lp = list(lora.parameters())
        if args.random_export:
            with torch.no_grad():
                for pn, p in lora.named_parameters():
                    if pn.endswith("B"):
                        p.normal_(0, 0.05)
            steps = 0
        elif adapter_steps(args.adapter_steps, name) > 0:
            steps = adapter_steps(args.adapter_steps, name)
        else:
            dt = time_steps(model, lp, name, lora=lora, n=8)
            avail = (budget_end - time.time()) / (len(names) - ai)
            steps = int(max(200, min(args.max_adapter_steps, avail / dt)))
            log(f"[{name}] timing: {dt * 1000:.1f} ms/step -> {steps} steps")
        done = train_phase(model, lp, [name], steps, args.lora_lr, 50, lora=lora, label=name,
                           eval_tasks=[name], stop_at=0.999, min_frac=0.3)
        with torch.no_grad():
            for p in lp:
                p.copy_(p.float())
        loras[name] = lora
        acc = exact_match(model, name, "test", lora, fp32=True)
        n_lora = sum(p.numel() for p in lp)
        results[name] = {"steps": done, "parameters": n_lora, "test_exact_match": acc,
                         "what": ADAPTERS[name][0], "target_modules": ADAPTERS[name][1],
                         "target_parameters": ADAPTERS[name][2]}
        log(f"[{name}] {n_lora} LoRA parameters, held-out test exact-match {acc:.4f} (fp32 compute)")

    # ---------------- export ----------------
    sd = {"model.embed_tokens.weight": model.embed_tokens, "model.norm.weight": model.norm.weight,
          "lm_head.weight": model.lm_head}
    for li, ly in enumerate(model.layers):
        pre = f"model.layers.{li}."
        sd[pre + "input_layernorm.weight"] = ly.input_layernorm.weight
        sd[pre + "post_attention_layernorm.weight"] = ly.post_attention_layernorm.weight
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[pre + f"self_attn.{n}.weight"] = getattr(ly, n)
        sd[pre + "self_attn.q_norm.weight"] = ly.q_norm.weight
        sd[pre + "self_attn.k_norm.weight"] = ly.k_norm.weight
        sd[pre + "mlp.gate.weight"] = ly.gate
        for e in range(E):
            sd[pre + f"mlp.experts.{e}.gate_proj.weight"] = ly.gate_up_proj[e, :I]
            sd[pre + f"mlp.experts.{e}.up_proj.weight"] = ly.gate_up_proj[e, I:]
            sd[pre + f"mlp.experts.{e}.down_proj.weight"] = ly.down_proj[e]
    save_safetensors({k: v.detach().to(torch.bfloat16).cpu() for k, v in sd.items()},
                     os.path.join(args.out, "model.safetensors"))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hf_config(), f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS_ID, "eos_token_id": IM_END, "pad_token_id": PAD_ID,
                   "transformers_version": "5.17.0"}, f, indent=2)
    for name, lora in loras.items():
        d = os.path.join(args.out, "adapters", name)
        os.makedirs(d, exist_ok=True)
        tensors = {}
        for li, ll in enumerate(lora.layers):
            pre = f"base_model.model.model.layers.{li}."
            for m, mod in ll.mods.items():
                tensors[pre + f"self_attn.{m}.lora_A.weight"] = mod.A
                tensors[pre + f"self_attn.{m}.lora_B.weight"] = mod.B
            if ll.experts is not None:
                # PEFT wraps target_parameters in list order: the first (gate_up_proj) is innermost.
                order = [p.split(".")[-1] for p in ADAPTERS[name][2]]
                for depth, pname in enumerate(reversed(order)):
                    key = pre + "mlp.experts." + "base_layer." * depth
                    tensors[key + "lora_A.weight"] = ll.experts[pname].A
                    tensors[key + "lora_B.weight"] = ll.experts[pname].B
        save_safetensors({k: v.detach().float().cpu() for k, v in tensors.items()},
                         os.path.join(d, "adapter_model.safetensors"))
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(adapter_config(name), f, indent=2)
    log(f"exported to {args.out} ({time.time() - t_start:.1f}s since start)")

    # ---------------- examples (greedy, our model) ----------------
    @torch.no_grad()
    def greedy(text, lora=None, max_new=80):
        ids = prompt_ids(text)
        out = []
        for _ in range(max_new):
            logits, _ = model(torch.tensor([ids + out], device=dev), lora)
            nxt = int(logits[0, -1].argmax())
            if nxt == IM_END:
                break
            out.append(nxt)
        return decode_ids(out)

    examples = {}
    for s in ["the red fox jumps", "my 2 cats eat 7 fish", "a blue bird sings"]:
        examples[s] = {"base": greedy(s)}
        for name, lora in loras.items():
            examples[s][name] = greedy(s, lora)
    if args.dump_greedy:  # fixed-length greedy ids (no EOS stop), to compare with `polylora generate --ignore-eos`
        with open(args.dump_greedy, "w") as f:
            for s in test_in[:3]:
                for name in [None] + list(loras):
                    ids = prompt_ids(s)
                    out = []
                    with torch.no_grad():
                        for _ in range(12):
                            lg, _ = model(torch.tensor([ids + out], device=dev), loras.get(name))
                            out.append(int(lg[0, -1].argmax()))
                    f.write(json.dumps({"input": s, "adapter": name, "ids": out}) + "\n")
    log("examples: " + json.dumps(examples, indent=1))
    results["examples"] = examples

    # ---------------- verification through transformers / peft / tokenizers ----------------
    verify = {}
    try:
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
        bad = 0
        for s in test_in[:50]:
            full = render_chat(s) + s + "<|im_end|>"
            mine = prompt_ids(s) + encode_text(s) + [IM_END]
            if tk.encode(full).ids != mine:
                bad += 1
            if tk.decode(encode_text(s)) != s:
                bad += 1
        verify["tokenizers_mismatches"] = bad
    except Exception as ex:  # noqa: BLE001
        verify["tokenizers_error"] = repr(ex)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.out)
        rendered = tok.apply_chat_template([{"role": "user", "content": "red fox"}], tokenize=False,
                                           add_generation_prompt=True)
        verify["chat_template_ok"] = rendered == render_chat("red fox")

        def compare(hf_model, lora, task):
            t_ids, t_mask, t_lens = task_data(task, "test")
            T = int(t_lens[:64].max())
            x = t_ids[:64, :T]
            v = x != PAD_ID
            with torch.no_grad():
                ref, _ = model(x, lora)
                got = hf_model(input_ids=x).logits.float()
            diff = (ref - got).abs()[v].max().item()
            agree = (ref.argmax(-1) == got.argmax(-1))[v].float().mean().item()
            return {"max_abs_logit_diff": round(diff, 6), "argmax_agreement": agree}

        def load_base():
            return AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32).to(dev).eval()

        verify["hf_base"] = compare(load_base(), None, "repeat")
        try:
            from peft import PeftModel
            for name, lora in loras.items():
                pm = PeftModel.from_pretrained(load_base(), os.path.join(args.out, "adapters", name)).to(dev).eval()
                verify[f"peft_{name}"] = compare(pm, lora, name)
        except Exception as ex:  # noqa: BLE001
            verify["peft_error"] = repr(ex)
    except Exception as ex:  # noqa: BLE001
        verify["transformers_error"] = repr(ex)
    log("verification: " + json.dumps(verify))
    results["verification"] = verify
    results["seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(args.out, "train_results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "train_log.txt"), "w") as f:
        f.write("\n".join(log_lines) + "\n")


def adapter_steps(spec, name):
    """--adapter-steps: one count for every adapter ("800") or one per adapter ("upper=685,rot13=417,...")."""
    if "=" in spec:
        return int(dict(kv.split("=") for kv in spec.split(",")).get(name, 0))
    return int(spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/demo")
    ap.add_argument("--dry-run", action="store_true", help="no torch: write tokenizer, configs and heldout only")
    ap.add_argument("--budget", type=float, default=160.0, help="seconds for data + training (auto step counts)")
    ap.add_argument("--base-share", type=float, default=0.4, help="share of the budget for the base model")
    ap.add_argument("--base-steps", type=int, default=0, help="fixed base steps (0: from --budget)")
    ap.add_argument("--adapter-steps", default="0",
                    help="fixed steps per adapter, N or NAME=N,... (0: from --budget)")
    ap.add_argument("--max-base-steps", type=int, default=6000)
    ap.add_argument("--max-adapter-steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--pool", type=int, default=120000, help="distinct training inputs")
    ap.add_argument("--base-lr", type=float, default=2e-3)
    ap.add_argument("--lora-lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--random-export", action="store_true", help="no training: random weights (export check)")
    ap.add_argument("--dump-greedy", default="", help="write 12 greedy ids per test prompt and adapter here")
    args = ap.parse_args()
    if args.dry_run:
        dry_run(args)
    else:
        torch_main(args)


if __name__ == "__main__":
    sys.exit(main())
