"""One algorithm as a plain dict: what `lcmac list` and `lcmac show` print.

Schema ``lcmac-algorithm-summary/1`` (stable; other tools read it):
    name, grid [m,k,n], rank, naive_rank, saving (fraction of block products saved),
    nnz {U,V,W}, additions {naive {A,B,H,total}, reduced {A,B,H,total}}, published_additions
    (int or null), hash, source
"""
from __future__ import annotations

from lcmac.ir.algorithm import Algorithm
from lcmac.ir.cse import addition_counts


def summarize(alg: Algorithm) -> dict:
    adds = addition_counts(alg)
    return {
        "name": alg.name, "grid": [alg.m, alg.k, alg.n], "rank": alg.R,
        "naive_rank": alg.naive_rank, "saving": round(alg.saving, 6), "nnz": alg.nnz(),
        "additions": adds,
        "published_additions": (alg.programs or {}).get("published_additions")
        if isinstance(alg.programs, dict) else None,
        "hash": alg.hash, "source": alg.source,
    }
