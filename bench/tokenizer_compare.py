#!/usr/bin/env python3
"""bench/tokenizer_compare.py: single-thread encode throughput of the o200k tokenizer in Hugging Face
`tokenizers` and in `tiktoken`, on the same text polylora's `tokenize --bench` reads, as JSON. Run on the GPU
machine's CPU by scripts/gpu_bench.sh, beside polylora in the same job. The tiktoken ranks file is read from a
local path (nothing is downloaded)."""
import argparse, gzip, json, os, time

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # HF tokenizers: one thread
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def timed(fn, min_seconds):
    fn()  # warm-up
    n, t0 = 0, time.perf_counter()
    while True:
        out = fn()
        n += 1
        el = time.perf_counter() - t0
        if el >= min_seconds:
            return el / n, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-json", required=True, help="o200k tokenizer.json or tokenizer.json.gz")
    ap.add_argument("--tiktoken-ranks", required=True, help="o200k_base.tiktoken")
    ap.add_argument("--text", required=True)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    text = open(a.text, encoding="utf-8").read()
    nbytes = len(text.encode("utf-8"))
    out = {"text_bytes": nbytes}

    from tokenizers import Tokenizer
    raw = gzip.open(a.tokenizer_json).read() if a.tokenizer_json.endswith(".gz") else open(a.tokenizer_json, "rb").read()
    hf = Tokenizer.from_str(raw.decode("utf-8"))
    sec, ids = timed(lambda: hf.encode(text, add_special_tokens=False).ids, a.seconds)
    out["hf_tokenizers"] = {"mb_per_s": nbytes / sec / 1e6, "tokens": len(ids)}

    import tiktoken, tiktoken.load
    import tiktoken_ext.openai_public as op
    local = tiktoken.load.load_tiktoken_bpe
    op.load_tiktoken_bpe = lambda *args, **kw: local(a.tiktoken_ranks)
    enc = tiktoken.Encoding(**op.o200k_base())
    sec, tids = timed(lambda: enc.encode_ordinary(text), a.seconds)
    out["tiktoken"] = {"mb_per_s": nbytes / sec / 1e6, "tokens": len(tids)}
    out["hf_equals_tiktoken"] = ids == tids
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
