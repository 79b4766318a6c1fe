"""A decoder stack of Llama architecture, prefill, plain torch against ``lcmac.optimize``, in one
run: eager and ``torch.compile`` for each, and the error of each against a float32 reference.

    python scripts/bench_model.py --tokens 8192 16384 32768 --out bench/results/h100-model.json

The model is built from a config with random weights (no download): by default 70B-class
layers (hidden 8192, MLP 28672, 64 heads with 8 KV heads), ``--layers`` of them, bf16.  Timed
is the stack's forward over one sequence of each ``--tokens`` length (``LlamaModel``: the
layers and the final norm; the LM head of a prefill reads one token and is left out), CUDA
events over ``--repeats`` calls after warm-up: median and spread.  ``lcmac.optimize`` swaps
the linear layers the decision picks an LCMA for at the longest prefill; a swapped layer
decides again per call shape (cuBLAS where no LCMA wins) and keeps its weight prepared, eager
and compiled.  The
kernels are compiled before timing, in parallel, into the kernel cache.  Error: relative Frobenius norm of the final hidden states against the same model
run in float32 (TF32 off), on the last ``--check-tokens`` positions.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import datetime as dt
import json
import statistics
import sys
import time


def make_model(args, dtype):
    import torch
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                      max_position_embeddings=max(args.tokens), attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(args.device):
        return LlamaModel(cfg).to(dtype).eval()


def prebuild(model, tokens: int) -> list[str]:
    """Compile, in parallel, the kernels the swapped layers run at ``tokens`` rows."""
    from lcmac import ops
    from lcmac.nn import Linear
    jobs = {}
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            dtype = str(m.weight.dtype).replace("torch.", "")
            target = ops.target_for(m.weight.device.type)
            p = ops.plan(tokens, m.out_features, m.in_features, dtype, algo=m.algo,
                         max_error=m.max_error, target=target)
            if p.runs not in ("vendor", "gemm"):
                jobs[(p.runs, target, dtype, (tokens, m.out_features, m.in_features))] = name
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda key: ops.kernel(*key), jobs))
    return [f"{k[0]} {'x'.join(map(str, k[3]))}" for k in jobs]


@contextlib.contextmanager
def fp32_attention(cuda: bool):
    """The float32 reference's attention on the GPU: the memory-efficient SDPA kernel (the math
    one would hold all T² scores, 64 GiB at 16k tokens), which takes K and V expanded to every
    head rather than grouped (transformers' ``use_gqa_in_sdpa`` is turned off meanwhile)."""
    if not cuda:
        yield
        return
    from unittest import mock

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.integrations import sdpa_attention
    with mock.patch.object(sdpa_attention, "use_gqa_in_sdpa", lambda *a, **k: False), \
            sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        yield


def time_forward(fn, ids, repeats: int, warmup: int) -> list[float]:
    """Seconds per call: CUDA events on a GPU, the wall clock elsewhere (a smoke test)."""
    import torch

    from lcmac.tune.measure import gpu_timer
    for _ in range(warmup):
        fn(ids)
    if ids.is_cuda:
        torch.cuda.synchronize()
        timer = gpu_timer()
        return [timer(lambda: fn(ids), 1) for _ in range(repeats)]
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(ids)
        out.append(time.perf_counter() - t0)
    return out


def bench_tokens(T: int, runs: dict, args) -> dict:
    import torch
    g = torch.Generator(device=args.device).manual_seed(T)
    ids = torch.randint(0, args.vocab, (1, T), device=args.device, generator=g)
    built = prebuild(runs["lcmac eager"], T)
    row = {"tokens": T, "kernels": built, "variants": {}}
    with torch.no_grad():
        with fp32_attention(ids.is_cuda):
            ref = args.reference(ids).last_hidden_state[0, -args.check_tokens:].float()
        for name, m in runs.items():
            fn = (lambda x, m=m: m(x).last_hidden_state)
            h = fn(ids)[0, -args.check_tokens:].float()
            err = ((h - ref).norm() / ref.norm()).item()
            ts = time_forward(fn, ids, args.repeats, args.warmup)
            row["variants"][name] = {"median_s": statistics.median(ts), "seconds": ts, "rel_error": err}
    base = {k: row["variants"][f"torch {k}"]["median_s"] for k in ("eager", "compiled") if f"torch {k}" in row["variants"]}
    print(f"\n{T} tokens; lcmac kernels: {', '.join(built) or 'none (every layer runs cuBLAS)'}")
    for name, v in row["variants"].items():
        mode = name.split()[1]
        v["vs_torch_same_mode"] = base[mode] / v["median_s"]
        spread = (max(v["seconds"]) - min(v["seconds"])) / v["median_s"]
        print(f"  {name:16s} {v['median_s'] * 1e3:9.2f} ms  spread {spread * 100:5.1f}%  "
              f"vs torch {v['vs_torch_same_mode']:.3f}x  error {v['rel_error']:.2e}")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768], help="prefill lengths")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--intermediate", type=int, default=28672)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000, help="embedding rows (the LM head is not run)")
    ap.add_argument("--algo", default="auto", help="lcmac.optimize's algo (auto: the decision per layer)")
    ap.add_argument("--max-error", type=float, default=None, help="lcmac.optimize's error budget")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--check-tokens", type=int, default=1024, help="positions compared with float32")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="eager only")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    import copy

    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_model: no CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    plain = make_model(args, torch.bfloat16)
    args.reference = copy.deepcopy(plain).float()
    lcmac_model = copy.deepcopy(plain)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    print(f"# {name}, torch {torch.__version__}; {args.layers} Llama layers, hidden {args.hidden}, "
          f"MLP {args.intermediate}, {args.heads}/{args.kv_heads} heads, bf16")
    from lcmac.nn import optimize
    report = optimize(lcmac_model, algo=args.algo, max_error=args.max_error, rows=max(args.tokens))
    print(report)
    runs = {"torch eager": plain, "lcmac eager": lcmac_model}
    if args.compile:
        runs["torch compiled"] = torch.compile(plain)
        runs["lcmac compiled"] = torch.compile(lcmac_model)
    results = [bench_tokens(T, runs, args) for T in args.tokens]
    if args.out:
        doc = {"benchmark": "Llama decoder stack prefill: torch vs lcmac.optimize", "device": name,
               "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
               "command": "python scripts/bench_model.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "torch": torch.__version__, "config": {k: getattr(args, k) for k in (
                   "layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "algo", "max_error")},
               "optimize": report.to_dict(), "results": results}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
