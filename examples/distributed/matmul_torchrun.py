"""One product over every GPU of this host (or over CPU processes with gloo):

    torchrun --nproc-per-node 4 examples/distributed/matmul_torchrun.py --size 16384
    torchrun --nproc-per-node 2 examples/distributed/matmul_torchrun.py --size 2048 --backend gloo

Rank 0 holds A and B and receives C; the others get their operands from it (src=0, dst=0).
The row split with lcmac's Winograd² kernel on each GPU: --algo gemm --local winograd^2
(needs TileLang; the first call compiles the kernels into the cache).
"""
import argparse
import os

import torch
import torch.distributed as dist

import lcmac.distributed as ld

ap = argparse.ArgumentParser()
ap.add_argument("--size", type=int, default=8192)
ap.add_argument("--algo", default="strassen")
ap.add_argument("--local", default="vendor")
ap.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo")
args = ap.parse_args()

if args.backend == "nccl":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group(args.backend)
rank = dist.get_rank()
device = "cuda" if args.backend == "nccl" else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32

A = B = None
if rank == 0:
    A = torch.randn(args.size, args.size, device=device, dtype=dtype)
    B = torch.randn(args.size, args.size, device=device, dtype=dtype)
C, plan = ld.matmul(A, B, algo=args.algo, local=args.local, src=0, dst=0, return_plan=True)
if rank == 0:
    rows = slice(0, 64)
    ref = A[rows].double() @ B.double()
    err = ((C[rows].double() - ref).abs().max() / ref.abs().max()).item()
    print(f"{args.algo} on {dist.get_world_size()} ranks: {plan.why}; relative error {err:.2e}")
dist.destroy_process_group()
