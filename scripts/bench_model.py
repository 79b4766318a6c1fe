"""A decoder stack of Llama architecture, prefill, plain torch against ``lcmac.optimize``, in one
run: eager and ``torch.compile`` for each, and the error of each against a float32 reference.
Compiled means each decoder layer compiled (``--compile-how``, ``compiled``).

    python scripts/bench_model.py --tokens 8192 16384 32768 --out bench/results/h100-model.json

The model is built from a config with random weights (no download): by default 70B-class
layers (hidden 8192, MLP 28672, 64 heads with 8 KV heads), ``--layers`` of them, bf16.  Timed
is the stack's forward over one sequence of each ``--tokens`` length (``LlamaModel``: the
layers and the final norm; the LM head of a prefill reads one token and is left out), and a
decode step's layers (``--decode-rows``: that many sequences of one token), CUDA events in
``--repeats`` interleaved rounds (the first place in a round rotates; ``--sustained S`` adds
each variant back to back for S seconds): median and spread.  ``lcmac.optimize`` runs as a
user calls it (its default decision and budget, ``--algo``/``--max-error``/``--rows`` to
change them) with ``warmup`` = the lengths and decode rows timed, so its kernels compile there,
in parallel; the kernels compiled while timing are counted (none is the aim).  A swapped
layer decides per call shape (``F.linear`` below its crossover) and keeps its weight
prepared, eager and compiled.  Error: relative Frobenius norm of the final hidden states
against the same model run in float32 (TF32 off), on the last ``--check-tokens`` positions.

``--train`` (default on a GPU) also times one training step of one layer, the stack's first
decoder layer, at each ``--train-tokens`` length (default: the shortest ``--tokens``: a
70B-class layer keeps over 10 GiB of activations for its backward at 32k tokens): forward and
backward of loss = mean(output.float()²), with the gradients of the weights and of the layer's
input, for plain torch and the lcmac-optimized layer, eager and compiled (``torch.compile`` of
the layer and its loss, static shapes; the backward runs what AOTAutograd compiled), timed as
the forward is.  Error: relative Frobenius norm of one MLP projection's weight gradient
(``mlp.down_proj.weight``) against the same layer in float32 (only that gradient computed
there), and of lcmac's against torch's in the same mode.  Results under ``train`` in the
JSON, with each variant's peak GPU memory.

``--fp8`` times FP8 instead, eager (lcmac's fp8 layers run outside ``torch.compile``) and
without the training step (fp8 layers are inference only): ``lcmac.optimize(model,
dtype="fp8")`` ("lcmac eager") against the same model whose same layers run torch's FP8
GEMM on the same quantised weights (``TorchFp8Linear``: ``lcmac.torch.fp8.Fp8Linear``, A
per 1×128 and W per 128×128 where torch has the blockwise recipe, else rowwise; "torch
eager"), the bf16 model beside them ("bf16 eager"); each one's error against float32.

    python scripts/bench_model.py --fp8 --tokens 8192 16384 --out bench/results/h200-model-fp8.json
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
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
                      max_position_embeddings=max(args.tokens + args.train_tokens),
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(args.device):
        return LlamaModel(cfg).to(dtype).eval()


def prebuild(model, tokens: int, backward: bool = False) -> list[str]:
    """Compile, in parallel, the kernels the swapped layers ask for at ``tokens`` rows: the
    bucket kernels of each row piece (``lcmac.spec.shape_rules.JIT_ROWS``), as ``lcmac.matmul``
    asks for them; with ``backward``, also those of the two backward products (dx = dy·W:
    tokens × in × out, dW = dyᵀ·x: out × in × tokens, as M×N×K)."""
    from lcmac.api import matmul as ops
    from lcmac.torch.nn import Linear
    jobs = {}
    for name, m in model.named_modules():
        if not isinstance(m, Linear):
            continue
        dtype = str(m.weight.dtype).replace("torch.", "")
        target = ops.target_for(m.weight.device.type)
        N, K = m.out_features, m.in_features
        products = [(tokens, N, K)] + ([(tokens, K, N), (N, K, tokens)] if backward else [])
        for M, n, k in products:
            for key in ops.kernel_keys(M, n, k, dtype, algo=m.algo, max_error=m.max_error, target=target):
                jobs[key] = name
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda key: ops.kernel(*key), jobs))
    return [f"{k[0]} {'x'.join(map(str, k[3]))}" for k in jobs]


def torch_fp8_linear(layer):
    """An ``nn.Module`` computing ``layer`` (an ``nn.Linear``) by torch's FP8 GEMM on its
    weight quantised once (``lcmac.torch.fp8.Fp8Linear``), plus its bias: what a user would
    call without lcmac."""
    import torch

    from lcmac.torch.fp8 import Fp8Linear

    class _TorchFp8Linear(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.in_features, self.out_features = layer.in_features, layer.out_features
            self.bias = layer.bias
            self.gemm = Fp8Linear(layer.weight.detach())

        def forward(self, x):
            y = self.gemm(x)
            return y if self.bias is None else y + self.bias
    return _TorchFp8Linear(layer)


def swap_torch_fp8(model, names) -> None:
    """Replace the linear layers ``names`` of ``model`` by ``torch_fp8_linear``, in place."""
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, torch_fp8_linear(getattr(owner, child)))


def compiled(model, how: str):
    """``model`` under ``torch.compile``: ``how="layers"`` compiles each decoder layer and
    leaves the stack's own forward eager (regional compilation: the causal mask is then
    decided eagerly, so SDPA gets ``is_causal`` and a flash kernel, where a whole-model
    compile makes transformers build a T×T mask, a slower attention); ``"model"`` compiles
    the whole forward.  The compiled model shares the parameters of ``model``."""
    import copy

    import torch
    if how == "model":
        return torch.compile(model)
    out = copy.copy(model)                 # a shallow copy with its own table of children
    out._modules = dict(model._modules)
    out.layers = torch.nn.ModuleList(torch.compile(layer) for layer in model.layers)
    return out


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
    """Seconds per call of ``fn(ids)`` (a forward, or a training step): CUDA events on a GPU,
    the wall clock elsewhere (a smoke test)."""
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


class CompileCounter:
    """Counts the kernels compiled (into lcmac's kernel cache) while it is active: a timed
    forward after ``lcmac.optimize(..., warmup=...)`` must compile none."""

    def __init__(self):
        self.count = 0

    def __enter__(self):
        from lcmac.artifact import cache
        self._cache, self._compile = cache, cache._compile

        def counted(request):
            self.count += 1
            return self._compile(request)
        cache._compile = counted
        return self

    def __exit__(self, *exc):
        self._cache._compile = self._compile


def interleaved(variants: dict, ids, rounds: int, calls: int, warmup: int,
                sustained_s: float) -> tuple[dict, dict]:
    """Seconds per call of each variant (name → fn(ids)) over ``rounds`` interleaved rounds
    of ``calls`` calls (the first place in a round rotates; ``gpu_rounds``), and with
    ``sustained_s`` each variant's back-to-back figure; the wall clock off the GPU."""
    import torch
    for fn in variants.values():
        for _ in range(warmup):
            fn(ids)
    if ids.is_cuda:
        from lcmac.tune.measure import gpu_rounds
        torch.cuda.synchronize()
        return gpu_rounds([(n, lambda fn=fn: fn(ids)) for n, fn in variants.items()], rounds,
                          calls, sustained_s=sustained_s)
    names, times = list(variants), {n: [] for n in variants}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(calls):
                variants[n](ids)
            times[n].append((time.perf_counter() - t0) / calls)
    return times, {}


def bench_tokens(T: int, runs: dict, args, batch: int = 1, calls: int = 1,
                 decode: bool = False) -> dict:
    """The stack's forward on ``batch`` sequences of ``T`` tokens (a decode step's layers see
    ``batch`` rows with ``T`` = 1) for every variant of ``runs``, interleaved; the error of
    each against the float32 reference."""
    import torch
    g = torch.Generator(device=args.device).manual_seed(T * 1000 + batch)
    ids = torch.randint(0, args.vocab, (batch, T), device=args.device, generator=g)
    rows = batch * T
    row = {"tokens": T, "batch": batch, "rows": rows, "decode": decode, "variants": {}}
    check = slice(-min(args.check_tokens, T), None)
    with torch.no_grad(), CompileCounter() as compiled_kernels:
        with fp32_attention(ids.is_cuda):
            ref = args.reference(ids).last_hidden_state[:, check].float()
        fns = {name: (lambda x, m=m: m(x).last_hidden_state) for name, m in runs.items()}
        for name, fn in fns.items():
            h = fn(ids)[:, check].float()
            row["variants"][name] = {"rel_error": ((h - ref).norm() / ref.norm()).item()}
        times, sustained = interleaved(fns, ids, args.repeats, calls, args.warmup, args.sustained)
    row["kernels_compiled"] = compiled_kernels.count
    for name, ts in times.items():
        v = row["variants"][name]
        v.update(median_s=statistics.median(ts), seconds=ts)
        if name in sustained:
            v["sustained_s"] = sustained[name]
    what = f"decode step, {batch} sequence(s) of 1 token" if decode else f"{T} tokens"
    print(f"\n{what}; kernels compiled while running: {compiled_kernels.count}")
    for name, v in row["variants"].items():
        base = row["variants"][f"torch {name.split()[1]}"]
        v["vs_torch_same_mode"] = base["median_s"] / v["median_s"]
        if "sustained_s" in v:
            v["sustained_vs_torch_same_mode"] = base["sustained_s"] / v["sustained_s"]
        spread = (max(v["seconds"]) - min(v["seconds"])) / v["median_s"]
        sus = (f"  sustained {v['sustained_vs_torch_same_mode']:.3f}x"
               if "sustained_vs_torch_same_mode" in v else "")
        print(f"  {name:16s} {v['median_s'] * 1e3:9.3f} ms  spread {spread * 100:5.1f}%  "
              f"vs torch {v['vs_torch_same_mode']:.3f}x{sus}  error {v['rel_error']:.2e}")
    return row


#: the weight whose gradient the training step is checked on (one MLP projection)
GRAD_PARAM = "mlp.down_proj.weight"


def layer_loss(layer):
    """``loss(h, cos, sin)``: mean(layer(h).float()²) of one decoder layer, causal attention
    (no mask: SDPA's is_causal), the rotary embedding (cos, sin) given."""
    def loss(h, cos, sin):
        out = layer(h, attention_mask=None, position_embeddings=(cos, sin))
        out = out[0] if isinstance(out, tuple) else out      # older transformers: a tuple
        return out.float().square().mean()
    return loss


def train_step(loss_fn, h, cos, sin, params) -> None:
    """One training step's forward and backward: the gradients of ``params`` and of the input
    ``h`` set afresh (not accumulated); no optimizer step."""
    h.grad = None
    for p in params:
        p.grad = None
    loss_fn(h, cos, sin).backward()


def _rel(x, ref) -> float:
    return ((x.float() - ref).norm() / ref.norm()).item()


def bench_train(T: int, train: dict, args) -> dict:
    """One training step of one decoder layer at ``T`` tokens for each variant of ``train``
    ({name: (layer, loss function)}), timed as the forward is; ``GRAD_PARAM``'s gradient
    against the same layer in float32 (``args.reference``), and lcmac's against torch's."""
    import torch
    cuda = args.device == "cuda"
    g = torch.Generator(device=args.device).manual_seed(T)
    ids = torch.randint(0, args.vocab, (1, T), device=args.device, generator=g)
    pos = torch.arange(T, device=args.device).unsqueeze(0)
    built = prebuild(train["lcmac eager"][0], T, backward=True)
    row = {"tokens": T, "kernels": built, "variants": {}}
    with torch.no_grad():
        h0 = args.plain.embed_tokens(ids)           # the layer's input: random tokens' embeddings
        cos, sin = args.plain.rotary_emb(h0, pos)
        h32 = h0.float()
        cos32, sin32 = args.reference.rotary_emb(h32, pos)
    # float32 reference (TF32 off): only GRAD_PARAM needs a gradient there
    ref_layer = args.reference.layers[0]
    ref_w = ref_layer.get_parameter(GRAD_PARAM)
    flags = {p: p.requires_grad for p in ref_layer.parameters()}
    try:
        for p in ref_layer.parameters():
            p.requires_grad_(p is ref_w)
        ref_w.grad = None
        with torch.enable_grad(), fp32_attention(cuda):
            layer_loss(ref_layer)(h32, cos32, sin32).backward()
        g_ref = ref_w.grad.detach().float()
    finally:
        ref_w.grad = None
        for p, f in flags.items():
            p.requires_grad_(f)
    del h32, cos32, sin32
    torch_grads = {}
    for name, (layer, loss_fn) in train.items():
        mode = name.split()[1]
        params = [p for p in layer.parameters() if p.requires_grad]
        w = layer.get_parameter(GRAD_PARAM)
        h = h0.detach().clone().requires_grad_()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        fn = (lambda x, f=loss_fn, ps=params: train_step(f, x, cos, sin, ps))
        with torch.enable_grad():
            fn(h)                   # compiles (compiled variants); its gradient is the one checked
            gw = w.grad.detach().clone()
            ts = time_forward(fn, h, args.repeats, args.warmup)
        v = {"median_s": statistics.median(ts), "seconds": ts, "grad_rel_error": _rel(gw, g_ref)}
        if name.startswith("torch"):
            torch_grads[mode] = gw
        elif mode in torch_grads:
            v["grad_rel_diff_vs_torch"] = _rel(gw, torch_grads[mode].float())
        if cuda:
            v["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            v["step_peak_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30
        layer.zero_grad(set_to_none=True)
        del h, gw
        row["variants"][name] = v
    base = {k: row["variants"][f"torch {k}"]["median_s"] for k in ("eager", "compiled")
            if f"torch {k}" in row["variants"]}
    print(f"\ntraining step (forward + backward) of layer 0, {T} tokens; grad error: {GRAD_PARAM} "
          f"against float32; lcmac kernels: {', '.join(built) or 'none (every product runs cuBLAS)'}")
    for name, v in row["variants"].items():
        v["vs_torch_same_mode"] = base[name.split()[1]] / v["median_s"]
        spread = (max(v["seconds"]) - min(v["seconds"])) / v["median_s"]
        line = (f"  {name:16s} {v['median_s'] * 1e3:9.2f} ms  spread {spread * 100:5.1f}%  "
                f"vs torch {v['vs_torch_same_mode']:.3f}x  grad error {v['grad_rel_error']:.2e}")
        if "grad_rel_diff_vs_torch" in v:
            line += f"  vs torch's {v['grad_rel_diff_vs_torch']:.2e}"
        if "step_peak_gib" in v:
            line += f"  step peak +{v['step_peak_gib']:.1f} GiB"
        print(line)
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
    ap.add_argument("--rows", type=int, nargs="+", default=None,
                    help="lcmac.optimize(rows=): decide at these row counts only (default: each "
                         "layer's crossover up to optimize's max_rows)")
    ap.add_argument("--decode-rows", type=int, nargs="*", default=[1, 16, 64],
                    help="a decode step: the stack's forward on this many sequences of one token "
                         "(its linear layers see that many rows)")
    ap.add_argument("--decode-calls", type=int, default=10, help="calls per round of a decode step")
    ap.add_argument("--sustained", type=float, default=0.0, metavar="S",
                    help="also run each variant back to back for S seconds (GPU)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--check-tokens", type=int, default=1024, help="positions compared with float32")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="eager only")
    ap.add_argument("--compile-how", choices=["layers", "model"], default="layers",
                    help="torch.compile each decoder layer (default: the causal mask stays eager "
                         "and SDPA runs flash attention) or the whole model (transformers then "
                         "builds a T×T mask)")
    ap.add_argument("--train", action=argparse.BooleanOptionalAction, default=None,
                    help="also time one training step (forward + backward) of the first layer "
                         "(default: on with --device cuda or --train-tokens, off otherwise)")
    ap.add_argument("--train-tokens", type=int, nargs="+", default=None,
                    help="sequence lengths of the training step (default: the shortest --tokens)")
    ap.add_argument("--fp8", action="store_true",
                    help="time lcmac.optimize(model, dtype='fp8') against torch's FP8 GEMM on the "
                         "same quantised weights, eager, no training step (module doc)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.fp8:
        args.compile, args.train = False, False
    if args.train is None:
        args.train = args.device == "cuda" or args.train_tokens is not None
    args.train_tokens = (args.train_tokens or [min(args.tokens)]) if args.train else []
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
          f"MLP {args.intermediate}, {args.heads}/{args.kv_heads} heads, bf16"
          + ("; fp8: lcmac against torch's FP8 GEMM" if args.fp8 else ""))
    from lcmac.torch.nn import optimize
    t0 = time.perf_counter()
    report = optimize(lcmac_model, algo=args.algo, max_error=args.max_error,
                      warmup=[T for T in args.tokens if T > 0] + list(args.decode_rows),
                      **({"rows": args.rows} if args.rows else {}),
                      **({"dtype": "fp8"} if args.fp8 else {}))
    optimize_s = time.perf_counter() - t0
    print(report)
    print(f"optimize with warm-up: {optimize_s:.1f} s")
    runs = {"torch eager": plain, "lcmac eager": lcmac_model}
    if args.fp8:
        torch_fp8 = copy.deepcopy(plain)          # the layers lcmac swapped, on torch's FP8 GEMM
        swap_torch_fp8(torch_fp8, [s.name for s in report.swapped])
        runs = {"torch eager": torch_fp8, "lcmac eager": lcmac_model, "bf16 eager": plain}
    if args.compile:
        # both models' layers share one code object: a graph per layer, length and model must
        # fit dynamo's cache, or the later lengths would run eager
        cfg = torch._dynamo.config
        limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        need = 2 * args.layers * (len(args.tokens) + len(args.decode_rows)) + 8
        setattr(cfg, limit, max(getattr(cfg, limit), need))
        runs["torch compiled"] = compiled(plain, args.compile_how)
        runs["lcmac compiled"] = compiled(lcmac_model, args.compile_how)
    results = [bench_tokens(T, runs, args) for T in args.tokens]
    decode = [bench_tokens(1, runs, args, batch=b, calls=args.decode_calls, decode=True)
              for b in args.decode_rows]
    train_results = []
    if args.train:
        args.plain = plain
        layers = {"torch": plain.layers[0], "lcmac": lcmac_model.layers[0]}
        train = {}
        for kind, layer in layers.items():
            layer.requires_grad_(True)
            train[f"{kind} eager"] = (layer, layer_loss(layer))
        if args.compile:
            # static shapes, one graph per variant and length: room for them all in dynamo's cache
            cfg = torch._dynamo.config
            limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
            setattr(cfg, limit, max(getattr(cfg, limit), 2 * len(args.train_tokens) + 2))
            for kind, layer in layers.items():
                train[f"{kind} compiled"] = (layer, torch.compile(layer_loss(layer), dynamic=False))
        train_results = [bench_train(T, train, args) for T in args.train_tokens]
    if args.out:
        from lcmac.tune.measure import run_header
        doc = {**run_header("Llama decoder stack prefill: torch vs lcmac.optimize", name, __file__, argv),
               "torch": torch.__version__, "config": {k: getattr(args, k) for k in (
                   "layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "algo", "max_error",
                   "compile_how", "fp8")},
               "variants": ({"torch eager": "torch's FP8 GEMM (lcmac.torch.fp8.Fp8Linear) on the "
                                            "layers lcmac swapped", "lcmac eager":
                             "lcmac.optimize(model, dtype='fp8')", "bf16 eager": "the bf16 model"}
                            if args.fp8 else None),
               "optimize": report.to_dict(), "optimize_s": optimize_s, "results": results,
               "decode": decode, "rounds": args.repeats, "sustained_s": args.sustained,
               "train": {"layer": "layers.0", "loss": "mean(layer(h).float()**2)",
                         "grad_param": GRAD_PARAM, "tokens": args.train_tokens,
                         "results": train_results} if args.train else None}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
