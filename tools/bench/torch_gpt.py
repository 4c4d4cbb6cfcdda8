#!/usr/bin/python3
"""tools/bench/torch_gpt.py: PyTorch peer of `dtrun bench train` (ref-gpt, same shapes and optimizer).

Reference model ("ref-gpt"): byte vocabulary (256), context 256, width 384, 6 layers,
6 heads, MLP 4x with exact GELU, pre-LayerNorm, learned positions, untied LM head
without bias, AdamW(lr=3e-4, wd=0.1), batch 8 x 256 tokens, random tokens.
Prints one line: 'peer torch_gpt tokens_per_second=<median> step_ms=<median> params=<n>'.
Run: python3 torch_gpt.py [--threads N] [--steps N]   (Debian package python3-torch)
"""
import argparse, time, torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.ln1, s.ln2, s.h = nn.LayerNorm(d), nn.LayerNorm(d), h
        s.qkv, s.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.fc, s.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, 2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // s.h) ** 0.5)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        x = x + s.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))
        return x + s.fc2(F.gelu(s.fc(s.ln2(x))))

class GPT(nn.Module):
    def __init__(s, V=256, T=256, d=384, L=6, h=6):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, d), nn.Embedding(T, d)
        s.blocks = nn.ModuleList([Block(d, h) for _ in range(L)])
        s.lnf, s.head = nn.LayerNorm(d), nn.Linear(d, V, bias=False)
    def forward(s, idx, tgt):
        B, T = idx.shape
        x = s.wte(idx) + s.wpe(torch.arange(T))
        for b in s.blocks:
            x = b(x)
        logits = s.head(s.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="0 = library default")
    ap.add_argument("--steps", type=int, default=7)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = GPT()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1)
    x, y = torch.randint(0, 256, (8, 256)), torch.randint(0, 256, (8, 256))
    for _ in range(2):
        opt.zero_grad(); m(x, y).backward(); opt.step()
    ts = []
    for _ in range(a.steps):
        t = time.perf_counter()
        opt.zero_grad(); m(x, y).backward(); opt.step()
        ts.append(time.perf_counter() - t)
    med = sorted(ts)[len(ts) // 2]
    n = sum(p.numel() for p in m.parameters())
    print(f"peer torch_gpt tokens_per_second={8 * 256 / med:.0f} step_ms={med * 1e3:.0f} params={n}")

if __name__ == "__main__":
    main()
