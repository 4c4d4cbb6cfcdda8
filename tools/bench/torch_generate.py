#!/usr/bin/python3
"""tools/bench/torch_generate.py: PyTorch peer of `dtrun bench generate`: batched sampling with a KV-cache loop.

The same work as the engine: --batch prompts of --prompt random tokens, a prefill, then --new decode steps of one
token per row (temperature 1, no stop token), each step appending the new keys/values to preallocated caches and
attending them (q @ k^T, softmax, @ v: torch 1.13 has no scaled_dot_product_attention). --model gpt is ref-gpt (LayerNorm, learned positions, GELU 4x MLP,
biases); --model llama the Llama of the same width (RMSNorm, RoPE, SwiGLU, GQA with --kv-heads, no biases).
Prints 'peer torch_generate tokens_per_second=<best of --reps> ms=<its time>'.
--device cuda runs on the GPU (the bench passes it when its own default device is cuda).
Run: /usr/bin/python3 torch_generate.py [--model gpt] [--threads N] [--batch 32 --prompt 64 --new 256]"""
import argparse, math, time, torch, torch.nn as nn, torch.nn.functional as F

class RMSNorm(nn.Module):  # torch 1.13 has none
    def __init__(s, d, eps=1e-5):
        super().__init__()
        s.w, s.eps = nn.Parameter(torch.ones(d)), eps
    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.w

class Attn(nn.Module):
    def __init__(s, d, h, kv, bias, rope):
        super().__init__()
        s.h, s.kv, s.hd, s.rope = h, kv, d // h, rope
        s.qkv, s.proj = nn.Linear(d, (h + 2 * kv) * (d // h), bias=bias), nn.Linear(d, d, bias=bias)
    def rotate(s, x, pos):  # x (B, T, H, D): pairs (i, i + D/2), as dt's F.rope
        D = x.shape[-1]
        inv = 10000.0 ** (-torch.arange(0, D // 2, dtype=torch.float32) * 2 / D)
        ang = (pos + torch.arange(x.shape[1], dtype=torch.float32))[:, None] * inv[None]
        c, sn = ang.cos()[None, :, None], ang.sin()[None, :, None]
        a, b = x[..., : D // 2], x[..., D // 2 :]
        return torch.cat((a * c - b * sn, a * sn + b * c), -1)
    def forward(s, x, cache, pos):
        B, T, C = x.shape
        q, k, v = s.qkv(x).split((s.h * s.hd, s.kv * s.hd, s.kv * s.hd), 2)
        q, k, v = q.view(B, T, s.h, s.hd), k.view(B, T, s.kv, s.hd), v.view(B, T, s.kv, s.hd)
        if s.rope:
            q, k = s.rotate(q, pos), s.rotate(k, pos)
        K, V = cache
        K[:, :, pos : pos + T] = k.transpose(1, 2)
        V[:, :, pos : pos + T] = v.transpose(1, 2)
        k, v = K[:, :, : pos + T], V[:, :, : pos + T]
        if s.kv != s.h:
            k, v = k.repeat_interleave(s.h // s.kv, 1), v.repeat_interleave(s.h // s.kv, 1)
        att = (q.transpose(1, 2) @ k.transpose(-2, -1)) * (1.0 / math.sqrt(s.hd))
        if T > 1:  # a prefill at pos 0: causal
            att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        y = att.softmax(-1) @ v
        return s.proj(y.transpose(1, 2).reshape(B, T, C))

class Block(nn.Module):
    def __init__(s, d, h, kv, llama, hidden):
        super().__init__()
        norm = (lambda: RMSNorm(d)) if llama else (lambda: nn.LayerNorm(d))
        s.n1, s.n2, s.llama = norm(), norm(), llama
        s.attn = Attn(d, h, kv, not llama, llama)
        if llama:
            s.gate, s.up, s.down = (nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False),
                                    nn.Linear(hidden, d, bias=False))
        else:
            s.fc, s.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(s, x, cache, pos):
        x = x + s.attn(s.n1(x), cache, pos)
        h = s.n2(x)
        return x + (s.down(F.silu(s.gate(h)) * s.up(h)) if s.llama else s.fc2(F.gelu(s.fc(h))))

class LM(nn.Module):
    def __init__(s, llama, V, T, d, L, h, kv):
        super().__init__()
        s.llama, s.h, s.kv, s.d = llama, h, kv, d
        s.wte = nn.Embedding(V, d)
        s.wpe = None if llama else nn.Embedding(T, d)
        hidden = 32 * math.ceil(8 * d / 3 / 32)
        s.blocks = nn.ModuleList([Block(d, h, kv, llama, hidden) for _ in range(L)])
        s.nf = RMSNorm(d) if llama else nn.LayerNorm(d)
        s.head = nn.Linear(d, V, bias=False)
    def forward(s, idx, caches, pos):
        x = s.wte(idx)
        if s.wpe is not None:
            x = x + s.wpe(torch.arange(pos, pos + idx.shape[1]))
        for b, c in zip(s.blocks, caches):
            x = b(x, c, pos)
        return s.head(s.nf(x[:, -1]))

def generate(m, prompts, new, seq):
    B, P = prompts.shape
    hd = m.d // m.h
    caches = [(torch.empty(B, m.kv, seq, hd), torch.empty(B, m.kv, seq, hd)) for _ in m.blocks]
    logits, out = m(prompts, caches, 0), []
    for i in range(new):
        tok = torch.multinomial(F.softmax(logits, -1), 1)  # temperature 1
        out.append(tok)
        if i + 1 < new:
            logits = m(tok, caches, P + i)
    return torch.cat(out, 1)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("gpt", "llama"), default="gpt")
    ap.add_argument("--threads", type=int, default=0, help="0 = library default")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    torch.set_default_tensor_type(torch.cuda.FloatTensor if a.device == "cuda" else torch.FloatTensor)
    seq = a.prompt + a.new
    llama = a.model == "llama"
    m = LM(llama, a.vocab, seq, a.dim, a.layers, a.heads, a.kv_heads if llama else a.heads).eval()
    prompts = torch.randint(0, a.vocab, (a.batch, a.prompt), device=a.device)
    best = math.inf
    with torch.inference_mode():
        for _ in range(a.reps):
            t = time.perf_counter()
            generate(m, prompts, a.new, seq)
            if a.device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
    print(f"peer torch_generate tokens_per_second={a.batch * a.new / best:.1f} ms={best * 1e3:.0f}")

if __name__ == "__main__":
    main()
