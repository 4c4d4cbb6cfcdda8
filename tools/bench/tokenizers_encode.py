#!/usr/bin/python3
"""tools/bench/tokenizers_encode.py: `tokenizers` peer of `dtrun bench tokenize`: Tokenizer.encode_batch over the
"text" fields of a JSONL corpus, without special tokens. One configuration per run (the environment: RAYON_NUM_THREADS,
TOKENIZERS_PARALLELISM; `dtrun bench tokenize` runs each and keeps the best). Prints 'peer tokenizers
bytes_per_second=<best of --rounds> tokens=<count>'. Run (the tools/py_refs.sh venv):
build/py-refs/bin/python tokenizers_encode.py --tokenizer DIR/tokenizer.json --corpus FILE.jsonl [--rounds 3]"""
import argparse
import json
import time

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    with open(a.corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    best, tokens = 0.0, 0
    for _ in range(a.rounds):
        t = time.perf_counter()
        out = tok.encode_batch(texts, add_special_tokens=False)
        dt = time.perf_counter() - t
        best, tokens = max(best, nbytes / dt), sum(len(e.ids) for e in out)
    print(f"peer tokenizers bytes_per_second={best:.0f} tokens={tokens}")


if __name__ == "__main__":
    main()
