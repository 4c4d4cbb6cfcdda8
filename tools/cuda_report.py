#!/usr/bin/env python3
"""cuda_report.py: per-kernel resources, instruction mix, occupancy and a roofline model of the compiled kernels.

Reads what tools/cuda_report.sh gathers: per arch (80, 90) either SASS (cuobjdump -sass) plus resource usage
(cuobjdump -res-usage), or PTX plus ptxas -v output. Prints every kernel's registers / local memory, then the hot
kernels of tools/cuda_hot_kernels.tsv with their instruction mix, occupancy and predicted time on an A100 and an H100
(the slowest of: FLOPs at the peak, compulsory DRAM bytes at the bandwidth, for tensor-core kernels the shared
memory their ldmatrix traffic per mma needs at 128 bytes a clock and their main loop's instructions at 4 a clock, and
for a memory-bound kernel whose table row counts its main loop's trips, that loop's instructions at 4 a clock or its
f64 arithmetic at the FP64 pipe's rate, whichever is slower);
--check exits 1 naming every hot kernel that regressed (a needed instruction missing, spills, registers or occupancy).
Then the passes over a linear layer's output that cuBLASLt's epilogues remove (tools/cuda_epilogues.tsv): bytes saved
per call and the DRAM time that is on an A100 and an H100.
"""
import argparse
import os
import re
import sys

# Per-SM limits (CUDA C Programming Guide, compute capabilities 8.0 and 9.0): warps, blocks, 32-bit registers,
# shared memory (bytes; 1 KiB of it reserved per block), register allocation unit (per warp).
SM = {
    "80": dict(warps=64, blocks=32, regs=65536, smem=167936, reserved=1024, reg_unit=256),
    "90": dict(warps=64, blocks=32, regs=65536, smem=233472, reserved=1024, reg_unit=256),
}
# Published dense peaks: A100 SXM4 80 GB (312 TFLOP/s bf16/f16 tensor, 19.5 TFLOP/s f32, 2039 GB/s HBM2e) and
# H100 SXM5 (989.4 TFLOP/s bf16/f16 tensor, 66.9 TFLOP/s f32, 3350 GB/s HBM3).
# Per SM and clock: tc, the tensor FLOPs of those peaks (sms SMs at clock Hz: 108 at 1.41 GHz, 132 at 1.83 GHz);
# smem, shared-memory bytes (both 128); f64, warp instructions of f64 arithmetic (32 FP64 lanes on an A100 SM, 64 on
# an H100's: their 9.7 and 33.5 TFLOP/s).
GPUS = [
    ("A100", "80", dict(tensor=312e12, fp32=19.5e12, dram=2039e9, tc=2048, smem=128, sms=108, clock=1.41e9, f64=1)),
    ("H100", "90", dict(tensor=989.4e12, fp32=66.9e12, dram=3350e9, tc=4096, smem=128, sms=132, clock=1.83e9, f64=2)),
]
# FLOPs of one tensor-core instruction (mma m16n8k16); bytes an ldmatrix moves: 128 per 8x8 matrix (x1, x2, x4).
MMA_FLOPS = 2 * 16 * 8 * 16
LDSM_WIDTH = (r"\bLDSM\.16\.MT?88(?:\.(\d))?", r"\bldmatrix\.sync\.aligned\.m8n8\.x(\d)")
# A wgmma (sm_90a, 16-bit inputs, k16): its N, and whether A comes from shared memory (a descriptor) or registers; it
# does 2 * 64 * N * 16 FLOPs and reads B (16 x N) and an A from shared memory (64 x 16) from shared memory itself.
WGMMA = (r"\bHGMMA\.64x(\d+)x16\.F32(?:\.BF16)? \S+, (\S+)",
         r"\bwgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.\w+\.\w+\s+\{[^}]*\},\s*(\S)")
# What each "needs" word is in SASS and in PTX.
NEEDS = {
    "mma": (r"\bHMMA\.", r"\bmma\.sync\."),
    "wgmma": (r"\bHGMMA\.", r"\bwgmma\.mma_async\."),
    "ldmatrix": (r"\bLDSM\.", r"\bldmatrix\."),
    "cp.async": (r"\bLDGSTS\.", r"\bcp\.async\.c[ag]\."),
    "v4": (r"\bLDG\.E\.(128|ENL2\.128)",
           r"\bld\.global(\.nc)?\.v4\.(f32|b32|u32|s32)|\bld\.global(\.nc)?\.v2\.(f64|b64|u64)"),
    "st.v4": (r"\bSTG\.E\.(128|ENL2\.128)", r"\bst\.global\.v4\.(f32|b32|u32|s32)|\bst\.global\.v2\.(f64|b64|u64)"),
}
LOCAL = (r"\b(STL|LDL)\b", r"\b(st|ld)\.local\.")
# An SM issues 4 warp instructions a clock (one a scheduler), on the A100 and the H100 alike.
ISSUE = 4
# f64 arithmetic in SASS (the FP64 pipe, at GPUS' f64 a clock).
F64 = r"\bD(FMA|MUL|ADD|SETP|MNMX)\b"


def parse_res_usage(text):
    """{name: dict(regs, stack, shared, local)} from cuobjdump -res-usage of one arch."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = m.group(1)
            continue
        m = re.match(r"\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and name:
            out[name] = dict(zip(("regs", "stack", "shared", "local"), map(int, m.groups())))
            name = None
    return out


def parse_ptxas(text):
    """{name: dict(regs, stack, shared, local)} from ptxas -v (local: spill stores + loads)."""
    out, name, stack, spill = {}, None, 0, 0
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            stack, spill = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            sm = re.search(r"(\d+) bytes smem", line)
            out[name] = dict(regs=int(m.group(1)), stack=stack, shared=int(sm.group(1)) if sm else 0, local=spill)
    return out


def split_functions(text, sass):
    """{name: code} from cuobjdump -sass ("Function : NAME") or PTX (".entry NAME(")."""
    pat = r"^\s*Function : (\S+)" if sass else r"^\.(?:visible )?\.entry (\w+)\("
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(pat, line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name:
            out[name].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def main_loop(text):
    """The instructions of a SASS function's longest loop (from a backward branch's target to the branch): a tile of
    a tensor-core kernel's work, every instruction its code holds (branches it skips included, loops once)."""
    ins = [(int(a, 16), i) for a, i in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    loops = [(int(m.group(1), 16), a) for a, i in ins for m in [re.search(r"\bBRA (?:\S+, )?0x([0-9a-f]+)", i)]
             if m and int(m.group(1), 16) < a]
    if not loops:
        return []
    lo, hi = max(loops, key=lambda l: l[1] - l[0])
    return [i for a, i in ins if lo <= a <= hi]


def tensor_flops_per_warp(code):
    """Tensor-core FLOPs one warp's pass over these instructions adds: an mma.sync its own, a wgmma its quarter of the
    warpgroup's."""
    flops = sum(MMA_FLOPS for i in code if re.search(NEEDS["mma"][0], i))
    for i in code:
        m = re.search(WGMMA[0], i)
        if m:
            flops += 2 * 64 * int(m.group(1)) * 16 // 4
    return flops


def occupancy(arch, regs, threads, smem):
    """(resident blocks per SM, % of its warps) from the SM's limits."""
    L = SM[arch]
    wpb = -(-threads // 32)
    per_warp = -(-regs * 32 // L["reg_unit"]) * L["reg_unit"]
    by_regs = (L["regs"] // per_warp) // wpb if per_warp else L["blocks"]
    by_smem = L["smem"] // (smem + L["reserved"])
    blocks = min(L["blocks"], L["warps"] // wpb, by_regs, by_smem)
    return blocks, 100.0 * blocks * wpb / L["warps"]


def epilogues(path, markdown):
    """Bytes per call the cuBLASLt epilogues save (passes over the (N, Nout) output removed) and that DRAM time."""
    with open(path) as f:
        lines = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#")]
    header = lines[0].split("\t")
    print()
    if markdown:
        print("| linear epilogue (cuBLASLt) | passes over the output | bytes saved per call | A100 | H100 |")
        print("|---|---|---|---|---|")
    for line in lines[1:]:
        h = dict(zip(header, line.split("\t")))
        shape = {k: int(v) for k, v in (kv.split("=") for kv in h["shape"].split(","))}
        unfused, fused = int(h["unfused"]), int(h["fused"])
        saved = (unfused - fused) * shape["N"] * shape["Nout"] * shape["E"]
        t = {gpu: saved / peak["dram"] for gpu, _, peak in GPUS}
        if markdown:
            print(f"| {h['label']}: {h['epilogue']} ({h['shape']}) | {unfused} -> {fused} | {saved / 1e6:.1f} MB | "
                  f"{t['A100'] * 1e3:.3f} ms | {t['H100'] * 1e3:.3f} ms |")
        else:
            print(f"{h['label']} [{h['shape']}]: {h['epilogue']} epilogue, {unfused} -> {fused} passes over the "
                  f"output, {saved / 1e6:.1f} MB saved per call = {t['A100'] * 1e3:.3f} ms on an A100, "
                  f"{t['H100'] * 1e3:.3f} ms on an H100 (DRAM roofline)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True,
                    help="per arch: sass_ARCH.txt + res_ARCH.txt, or ptx_ARCH.txt + ptxas_ARCH.txt")
    ap.add_argument("--table", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="print the hot kernels as the README's table")
    ap.add_argument("--epilogues", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                        "cuda_epilogues.tsv"))
    a = ap.parse_args()
    sass = os.path.exists(os.path.join(a.dir, "sass_80.txt"))
    res, code = {}, {}
    for arch in SM:
        def read(name):
            with open(os.path.join(a.dir, f"{name}_{arch}.txt")) as f:
                return f.read()
        res[arch] = parse_res_usage(read("res")) if sass else parse_ptxas(read("ptxas"))
        code[arch] = split_functions(read("sass" if sass else "ptx"), sass)
    col = 0 if sass else 1
    print(f"source: {'SASS (cuobjdump)' if sass else 'PTX only (no cuobjdump: instructions are PTX, local = spills)'}")
    if not a.markdown:
        print(f"{'kernel':72} {'regs 80/90':>10} {'local 80/90':>12}")
        for name in sorted(res["90"]):
            r80, r90 = res["80"].get(name, {}), res["90"][name]
            print(f"{name[:72]:72} {r80.get('regs', '-'):>4}/{r90['regs']:<5} "
                  f"{r80.get('local', '-'):>5}/{r90['local']:<6}")
    rows = []
    with open(a.table) as f:
        lines = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#")]
    header = lines[0].split("\t")
    failures = []
    for line in lines[1:]:
        h = dict(zip(header, line.split("\t")))
        shape = {k: int(v) for k, v in (kv.split("=") for kv in h["shape"].split(","))}
        flops, nbytes = eval(h["flops"], {}, shape), eval(h["bytes"], {}, shape)
        needs = [n for n in h["needs"].split(",") if n]
        mix, occ, pred, smem_frac, issue_frac, issue_time, loop_size = [], {}, [], {}, {}, {}, {}
        trips = eval(h["loop_trips"], {}, shape) if h.get("loop_trips") else None
        archs = (h.get("archs") or "80,90").split(",")
        for arch in archs:
            names = [n for n in res[arch] if h["symbol"] in n]
            if len(names) != 1:
                failures.append(f"{h['label']}: {len(names)} kernels match '{h['symbol']}' on sm_{arch}")
                continue
            name, r = names[0], res[arch][names[0]]
            text = code[arch].get(name, "")
            counts = {n: len(re.findall(NEEDS[n][col], text)) for n in NEEDS}
            smem_bytes = sum(128 * int(w or 1) for w in re.findall(LDSM_WIDTH[col], text))
            tensor_flops = counts["mma"] * MMA_FLOPS
            for cols, a_operand in re.findall(WGMMA[col], text):
                a_shared = a_operand.startswith("gdesc") if sass else a_operand != "{"
                tensor_flops += 2 * 64 * int(cols) * 16
                smem_bytes += 2 * 16 * int(cols) + (2 * 64 * 16 if a_shared else 0)
            gpu = next(g for g in GPUS if g[1] == arch)[2]
            if h["unit"] == "tensor" and tensor_flops and smem_bytes:
                # the code's ratio of tensor work to shared-memory operand traffic (all of it in the hot loop)
                smem_frac[arch] = min(1.0, tensor_flops / gpu["tc"] / (smem_bytes / gpu["smem"]))
            loop = main_loop(text) if sass and (h["unit"] == "tensor" or trips) else []
            loop_flops = tensor_flops_per_warp(loop)
            if trips and loop:
                # a memory-bound kernel's main loop: its threads' trips (loop_trips) over warps, each warp's trip
                # its instructions, at 4 a clock an SM, or its f64 ones at the FP64 pipe's rate when that is slower
                f64 = sum(1 for i in loop if re.search(F64, i))
                clocks = max(len(loop) / ISSUE, f64 / gpu["f64"])
                issue_time[arch] = trips / 32 * clocks / (gpu["sms"] * gpu["clock"])
                loop_size[arch] = (len(loop), 0)
            if loop_flops:
                # the main loop's instructions at 4 a clock an SM against its tensor work at the peak's rate a clock
                issue_frac[arch] = min(1.0, ISSUE * loop_flops / (gpu["tc"] * len(loop)))
                loop_size[arch] = (len(loop), loop_flops // MMA_FLOPS)
            local = len(re.findall(LOCAL[col], text)) if sass else r["local"]
            blocks, pct = occupancy(arch, r["regs"], int(h["threads"]), int(h["smem"]) + r["shared"])
            occ[arch] = (r["regs"], local, blocks, pct)
            if arch == "90":
                mix = [f"{n} {counts[n]}" for n in NEEDS if counts[n]]
            for n in needs:
                if not counts[n]:
                    failures.append(f"{h['label']}: no {n} instruction on sm_{arch} ({name})")
            if local:
                what = "instructions" if sass else "bytes"
                failures.append(f"{h['label']}: {local} local-memory (spill) {what} on sm_{arch}")
            if r["regs"] > int(h["max_regs"]):
                failures.append(f"{h['label']}: {r['regs']} registers on sm_{arch}, the table allows {h['max_regs']}")
            if arch == archs[0] and pct < float(h["min_occ"]):
                failures.append(f"{h['label']}: occupancy {pct:.1f}% on sm_{arch}, the table wants >= {h['min_occ']}%")
        for gpu, arch, peak in GPUS:
            if arch not in archs:
                pred.append((gpu, None, None, None))
                continue
            unit = h["unit"]
            bounds = {unit: flops / peak[unit] if unit != "dram" else 0.0, "dram": nbytes / peak["dram"]}
            if arch in smem_frac:
                bounds["shared-memory"] = flops / (peak["tensor"] * smem_frac[arch])
            if arch in issue_frac:
                bounds["issue"] = flops / (peak["tensor"] * issue_frac[arch])
            if arch in issue_time:
                bounds["issue"] = issue_time[arch]
            bound = max(bounds, key=bounds.get)
            t = bounds[bound]
            ref = peak["tensor"] if unit != "dram" else peak["dram"]
            achieved = (flops if unit != "dram" else nbytes) / t
            pred.append((gpu, t, 100.0 * achieved / ref, bound))
        if "90" in loop_size:
            instr, mma = loop_size["90"]
            mix.append(f"loop: {instr} instr, {mma} mma" if mma else f"loop: {instr} instr a trip")
        rows.append((h, mix, occ, pred, flops, nbytes))
    print()
    if a.markdown:
        print("| kernel | instruction mix (sm_90 SASS) | regs | occupancy sm_80 / sm_90 | A100 | H100 |")
        print("|---|---|---|---|---|---|")
    for h, mix, occ, pred, flops, nbytes in rows:
        o80, o90 = occ.get("80", (0, 0, 0, 0)), occ.get("90", (0, 0, 0, 0))
        p = {g: (t, pct, bound) for g, t, pct, bound in pred}
        ref = "DRAM" if h["unit"] == "dram" else "bf16 TC"
        def cell(g, fmt):
            t, pct, bound = p[g]
            return fmt.format(t=t * 1e3, pct=pct, bound=bound) if t is not None else "-"
        o80s = f"{o80[3]:.0f}%" if "80" in occ else "-"
        if a.markdown:
            print(f"| {h['label']} ({h['shape']}) | {', '.join(mix) or '-'} | {o90[0]} | {o80s} / {o90[3]:.0f}% | "
                  + " | ".join(cell(g, "{t:.3f} ms, {pct:.0f}% of " + ref + " ({bound})") for g in ("A100", "H100"))
                  + " |")
        else:
            print(f"{h['label']} [{h['shape']}]: {flops / 1e9:.1f} GFLOP, {nbytes / 1e6:.1f} MB per call")
            print(f"  mix (sm_90): {', '.join(mix) or '-'}; regs {o80[0]}/{o90[0]}, local {o80[1]}/{o90[1]}; "
                  f"occupancy sm_80 {o80[2]} blocks {o80[3]:.1f}%, sm_90 {o90[2]} blocks {o90[3]:.1f}%")
            for g, t, pct, bound in pred:
                print(f"  {g}: " + (f"predicted {t * 1e3:.3f} ms ({bound}-bound roofline), {pct:.1f}% of {ref} peak"
                                    if t is not None else "does not run it"))
    epilogues(a.epilogues, a.markdown)
    if failures:
        print("\nregressions:\n  " + "\n  ".join(failures))
    return 1 if a.check and failures else 0


if __name__ == "__main__":
    sys.exit(main())
