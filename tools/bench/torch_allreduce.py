#!/usr/bin/python3
"""tools/bench/torch_allreduce.py: the PyTorch/gloo peer of `dtrun bench collectives`: all_reduce(sum) of fp32 buffers.
Adapted from shared/peers/torch_allreduce.py: the same sizes as ours (1 KiB to 64 MiB, powers of 4), one
line per size 'peer gloo_allreduce ranks=N bytes=B time_us=T algbw_GBps=X busbw_GBps=Y' (busbw = algbw *
2(n-1)/n, the nccl-tests convention; time = median of `iters` after 3 warm-ups, the slowest rank's per
iteration), then one summary line with allreduce_64mib_busbw_gbps= and allreduce_1kib_us=.
Run: /usr/bin/python3 torch_allreduce.py [--ranks 2] [--port 29511] [--iters 10] [--max-mib 64]"""
import argparse, os, time, torch, torch.distributed as dist, torch.multiprocessing as mp


def sizes(max_mib):
    n, out = 1 << 10, []
    while n <= max_mib << 20:
        out.append(n)
        n *= 4
    return out


def run(rank, ws, port, iters, max_mib):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    summary = {}
    for nbytes in sizes(max_mib):
        t = torch.ones(nbytes // 4)
        reps = iters * 5 if nbytes < 1 << 20 else iters
        for _ in range(3):
            dist.all_reduce(t)
        dist.barrier()
        ts = torch.zeros(reps, dtype=torch.float64)
        for i in range(reps):
            s = time.perf_counter()
            dist.all_reduce(t)
            ts[i] = time.perf_counter() - s
        dist.all_reduce(ts, op=dist.ReduceOp.MAX)
        med = ts.sort().values[reps // 2].item()
        if rank == 0:
            alg = nbytes / med / 1e9
            bus = alg * 2 * (ws - 1) / ws
            print(f"peer gloo_allreduce ranks={ws} bytes={nbytes} time_us={med * 1e6:.1f} algbw_GBps={alg:.3f} "
                  f"busbw_GBps={bus:.3f}", flush=True)
            if nbytes == 64 << 20:
                summary["allreduce_64mib_busbw_gbps"] = f"{bus:.4f}"
            if nbytes == 1 << 10:
                summary["allreduce_1kib_us"] = f"{med * 1e6:.2f}"
    if rank == 0:
        print("peer summary " + " ".join(f"{k}={v}" for k, v in summary.items()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--port", type=int, default=29511)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--max-mib", type=int, default=64)
    a = ap.parse_args()
    mp.spawn(run, args=(a.ranks, a.port, a.iters, a.max_mib), nprocs=a.ranks)
