#!/usr/bin/python3
"""tools/bench/torch_kernels.py: PyTorch peer of `dtrun bench kernels`: the same kernels on the same shapes on a GPU.

Each case is timed as the bench times its own: --iters calls between two device synchronisations, best of --rounds,
host wall clock. Where PyTorch has several ways, every one is tried and the fastest kept (and named): scaled dot
product attention under each backend this torch has (flash, cuDNN, memory-efficient, math), AdamW fused and foreach.
matmul f32 keeps PyTorch's default (no TF32), as dtrun's. --cases names the cases to run (comma-separated).
Prints 'peer torch_kernels <case>=<ms per call> ... <case>_via=<the way that won>', or 'unsupported: <why>' (exit 3).
Run: python3 torch_kernels.py --cases copy_f32,attention_fwd_bf16 [--n 67108864 --rows 16384 --cols 4096
     --mm 8192 --b 4 --h 16 --t 2048 --d 128 --gpt2 16,12,1024,64 --iters 20 --rounds 3]"""
import argparse, contextlib, sys, time, torch, torch.nn.functional as F

def time_per_call(fn, iters, rounds):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best

def sdpa_backends():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return [("default", None)]
    names = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
    return [(n.lower(), (sdpa_kernel, getattr(SDPBackend, n))) for n in names if hasattr(SDPBackend, n)]

def ways(a, name):
    """The ways PyTorch can run case `name`: a list of (label, setup) where setup() returns the call."""
    dev, bf = "cuda", torch.bfloat16
    randn = lambda *shape, dtype=bf: torch.randn(*shape, device=dev, dtype=dtype)
    if name == "copy_f32":
        def setup():
            x, y = randn(a.n, dtype=torch.float32), torch.empty(a.n, device=dev)
            return lambda: y.copy_(x)
        return [("copy_", setup)]
    if name == "add_bf16":
        def setup():
            x, y = randn(a.n), randn(a.n)
            return lambda: torch.add(x, y)
        return [("add", setup)]
    if name == "sum_rows_bf16":
        def setup():
            x = randn(a.rows, a.cols)
            return lambda: x.sum(0)
        return [("sum", setup)]
    if name in ("softmax_bf16", "layer_norm_bf16", "rms_norm_bf16"):
        def setup():
            x, w, b = randn(a.rows, a.cols), randn(a.cols), randn(a.cols)
            if name == "softmax_bf16":
                return lambda: torch.softmax(x, -1)
            if name == "layer_norm_bf16":
                return lambda: F.layer_norm(x, (a.cols,), w, b, 1e-5)
            return lambda: F.rms_norm(x, (a.cols,), w, 1e-5)
        return [(name.rsplit("_", 1)[0], setup)]
    if name == "sumsq_f32":
        def make(f):
            def setup():
                x = randn(a.n, dtype=torch.float32)
                return lambda: f(x)
            return setup
        return [("vector_norm", make(lambda x: torch.linalg.vector_norm(x))), ("dot", make(lambda x: torch.dot(x, x)))]
    if name == "layer_norm_bwd_gpt2_bf16":
        def setup():
            B, H, T, D = (int(x) for x in a.gpt2.split(","))
            x, w, b, dy = randn(B * T, H * D), randn(H * D), randn(H * D), randn(B * T, H * D)
            _, mean, rstd = torch.ops.aten.native_layer_norm(x, [H * D], w, b, 1e-5)
            return lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [H * D], mean, rstd, w, b,
                                                                     [True, True, True])
        return [("native_layer_norm_backward", setup)]
    if name == "index_add_gpt2_bf16":
        B, H, T, D = (int(x) for x in a.gpt2.split(","))
        def make(f):
            def setup():
                g, gw = randn(B * T, H * D), torch.zeros(256, H * D, device=dev, dtype=bf)
                idx = torch.randint(0, 256, (B * T,), device=dev)
                return lambda: f(g, gw, idx)
            return setup
        return [("index_add_", make(lambda g, gw, idx: gw.index_add_(0, idx, g))),
                ("embedding_dense_backward",
                 make(lambda g, gw, idx: torch.ops.aten.embedding_dense_backward(g, idx, 256, -1, False)))]
    if name == "rope_gpt2_bf16":
        B, H, T, D = (int(x) for x in a.gpt2.split(","))
        def rope(x, cos, sin):  # transformers' apply_rotary_pos_emb (rotate_half) on x laid out (B, T, H, D)
            x1, x2 = x[..., : D // 2], x[..., D // 2:]
            return x * cos + torch.cat((-x2, x1), dim=-1) * sin
        def make(f):
            def setup():
                x = randn(B, T, H, D)
                inv = 1.0 / 10000 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D)
                angles = torch.outer(torch.arange(T, device=dev, dtype=torch.float32), inv)
                emb = torch.cat((angles, angles), dim=-1)[None, :, None, :]
                cos, sin = emb.cos().to(bf), emb.sin().to(bf)  # (cast to x's dtype, as transformers does)
                return lambda: f(x, cos, sin)
            return setup
        return [("rotate_half_eager", make(rope)), ("rotate_half_compiled", make(torch.compile(rope)))]
    if name == "gelu_bf16":
        def setup():
            x = randn(a.n)
            return lambda: F.gelu(x, approximate="tanh")
        return [("gelu_tanh", setup)]
    if name == "adamw_f32":
        def make(kw):
            def setup():
                p = torch.nn.Parameter(randn(a.n, dtype=torch.float32))
                p.grad = randn(a.n, dtype=torch.float32)
                opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, eps=1e-8, **kw)
                return opt.step
            return setup
        return [("fused", make({"fused": True})), ("foreach", make({"foreach": True}))]
    if name in ("matmul_bf16", "matmul_f32"):
        def setup():
            dtype = bf if name == "matmul_bf16" else torch.float32
            x, y = randn(a.mm, a.mm, dtype=dtype), randn(a.mm, a.mm, dtype=dtype)
            return lambda: torch.matmul(x, y)
        return [("matmul", setup)]
    if name.startswith("attention_"):
        causal, backward = "noncausal" not in name, "bwd" in name
        shape = [int(x) for x in a.gpt2.split(",")] if "gpt2" in name else (a.b, a.h, a.t, a.d)
        def make(ctx):
            def setup():
                q, k, v = (randn(*shape).requires_grad_(backward) for _ in range(3))
                dout = randn(*shape)
                def call():
                    with ctx[0](ctx[1]) if ctx else contextlib.nullcontext():
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        if backward:
                            o.backward(dout)
                            q.grad = k.grad = v.grad = None
                return call
            return setup
        return [(label, make(ctx)) for label, ctx in sdpa_backends()]
    raise SystemExit(f"unsupported: unknown case {name}")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    for k, v in dict(n=64 << 20, rows=16384, cols=4096, mm=8192, b=4, h=16, t=2048, d=128, iters=20, rounds=3).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--gpt2", default="16,12,1024,64", help="B,H,T,D of the attention_*_gpt2 cases")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"unsupported: torch {torch.__version__} sees no CUDA device")
        sys.exit(3)
    out = []
    for name in a.cases.split(","):
        best, via = None, None
        for label, setup in ways(a, name):
            try:
                s = time_per_call(setup(), a.iters, a.rounds)
            except Exception as e:  # a backend (or this torch) that does not take these shapes or dtypes
                print(f"{name} via {label}: {str(e).splitlines()[0][:160]}", file=sys.stderr)
                continue
            finally:
                torch.cuda.empty_cache()
            if best is None or s < best:
                best, via = s, label
        if best is not None:
            out += [f"{name}={best * 1e3:.5f}", f"{name}_via={via}"]
    print(f"peer torch_kernels torch={torch.__version__.split('+')[0]} " + " ".join(out))

if __name__ == "__main__":
    main()
