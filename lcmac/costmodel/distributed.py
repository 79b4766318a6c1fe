"""Where an LCMA's products run on P ranks, and what that costs: the plan behind
``lcmac.distributed.matmul``.

Units, pieces and owners
------------------------
An LCMA ``<m,k,n;R>`` cuts C into m×n blocks of (M/m)×(N/n).  Each block's rows are cut
again into S equal *slices*, so the work is R·S *units* ``(r, s)``: the rows s of
``H_r = Ã_r·B̃_r``, which need the rows s of ``Ã_r`` (the rows s of A's blocks) and all of
``B̃_r``.  C is R-independent: it is m·n·S *pieces* ``(i, j, s)``, and unit ``(r, s)``
adds ``W[r,i,j]·H_r[s]`` into every piece ``(i, j, s)`` with ``W[r,i,j] ≠ 0``.  A piece's
*owner* sums it; every other rank that touches the piece sends it its partial sum.

Two shapes of plan, and the model picks the faster:

* slices  S = P, rank p runs every product of slice p: each rank runs the whole LCMA on its
          rows of A; it touches only its own pieces, so no partial sums move.  Each rank needs
          all of B (combines all R of B̃).
* products  S ∈ {1, 2, 4, 8}, the R·S units dealt to the ranks in equal numbers, swapped
          between ranks while that lowers the partial-sum traffic and the B̃ combines done
          twice, then moved from the slowest rank to the fastest while the slowest's
          predicted time falls (``_rebalance``: the rank that sends every operand does fewer
          products).  Each rank needs only its products' blocks of B: the plan for operands
          held by one rank (``src``), where what is sent counts.

With the operands on one rank (``src``), the others receive, per operand, whichever is
smaller: the combined operands of their units (Ã_r rows, B̃_r; src combines them) or the raw
blocks those combine from (they combine them).

Time per rank (no overlap assumed between its phases, so the figure is an upper bound):
receive operands + combines (``combine_bytes``: the bytes the runtime's torch combines move,
at the profile's bandwidth) + GEMMs (``gemm_estimate`` of one unit's shape) + partial sums
sent + C assembled (all-gather, or the pieces sent to ``dst``), each transfer at ``link_bw``
bytes/s per rank.

Worked example (Strassen, 32768³ bf16, 2 H100s, A and B on both, C on both): slices: each
rank 7 GEMMs of 8192×16384×16384 at 5.89 ms (``gemm_estimate``) = 41.2 ms, its combines
11.0 ms, the all-gather of the other half of C (1 GiB at 300 GB/s) 3.6 ms: 55.8 ms.  products
(S = 2, 7 units each): the same GEMMs, 4 partial sums moved, 60.9 ms.  The plain GEMM's row
split: 45.9 + 3.6 = 49.5 ms, which is why the LCMA's products spread with torch combines
lose (measured on 4 H200s: docs/distributed.md) and the LCMA pays inside each GPU instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from lcmac.core.dtypes import ITEMSIZE, normalize_model_dtype
from lcmac.core.errors import LcmacError
from lcmac.costmodel.stages import gemm_estimate

#: NCCL over NVLink between H100s: an all-reduce's bus bandwidth measured 329–355 GB/s on
#: the lent 2- and 4-GPU hosts; 300e9 leaves room for smaller messages
NVLINK_BW = 300e9
#: gloo between processes of one host (loopback TCP): a prior, of the order seen on such hosts
GLOO_BW = 2e9
SLICE_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class ProductPlan:
    """Units per rank, owners of pieces, what each rank is sent, and the predicted time."""
    grid: tuple[int, int, int]
    padded: tuple[int, int, int]         # (M, N, K) after padding to the grid and slices
    slices: int
    strategy: str                        # "slices" | "products"
    units: tuple[tuple[tuple[int, int], ...], ...]   # per rank: (r, s), ordered by r
    owner: dict                          # (i, j, s) -> rank
    send_combined: tuple[tuple[bool, bool], ...]     # per rank (A, B): combined from src?
    rank_s: tuple[float, ...]            # predicted seconds per rank, assembly included
    partial_pieces: int                  # partial sums that cross ranks
    touched: tuple[frozenset, ...]       # per rank: the pieces its units add into
    why: str

    @property
    def ranks(self) -> int:
        return len(self.units)

    @property
    def predicted_s(self) -> float:
        return max(self.rank_s)

    def products_of(self, rank: int) -> tuple[int, ...]:
        return tuple(sorted({r for r, _ in self.units[rank]}))


def _support(T, r) -> list[tuple[int, int]]:
    return [(a, b) for a in range(T.shape[1]) for b in range(T.shape[2]) if T[r, a, b] != 0]


def _pad(x: int, q: int) -> int:
    return -(-x // q) * q


def _deal(R: int, S: int, P: int, strategy: str) -> list[list[tuple[int, int]]]:
    """Units to ranks before swaps: slice-major for "slices" (S = P), product-major otherwise
    (a product's slices kept together where the count allows)."""
    if strategy == "slices":
        return [[(r, p) for r in range(R)] for p in range(P)]
    units = [(r, s) for r in range(R) for s in range(S)]
    q, extra = divmod(len(units), P)
    out, i = [], 0
    for p in range(P):
        n = q + (1 if p < extra else 0)
        out.append(units[i:i + n])
        i += n
    return out


def _reduce_traffic(ranks, pieces_of, b_cost: float, piece_cost: float, passes: int = 4):
    """Swap units between ranks while the sum of partial pieces sent (×piece_cost) and of
    B̃ combines done on more than one rank (×b_cost) falls; the unit counts stay equal."""
    P = len(ranks)
    touch = [dict() for _ in range(P)]            # rank -> piece -> units contributing
    prods = [dict() for _ in range(P)]            # rank -> product -> units
    for p, us in enumerate(ranks):
        for u in us:
            for pc in pieces_of[u]:
                touch[p][pc] = touch[p].get(pc, 0) + 1
            prods[p][u[0]] = prods[p].get(u[0], 0) + 1

    def move_delta(u, p, q):
        d = 0.0
        for pc in pieces_of[u]:
            d -= piece_cost * (touch[p][pc] == 1)
            d += piece_cost * (touch[q].get(pc, 0) == 0)
        d -= b_cost * (prods[p][u[0]] == 1)
        d += b_cost * (prods[q].get(u[0], 0) == 0)
        return d

    def move(u, p, q):
        for pc in pieces_of[u]:
            touch[p][pc] -= 1
            if not touch[p][pc]:
                del touch[p][pc]
            touch[q][pc] = touch[q].get(pc, 0) + 1
        prods[p][u[0]] -= 1
        if not prods[p][u[0]]:
            del prods[p][u[0]]
        prods[q][u[0]] = prods[q].get(u[0], 0) + 1
        ranks[p].remove(u)
        ranks[q].append(u)

    for _ in range(passes):
        improved = False
        for p, q in combinations(range(P), 2):
            for u in list(ranks[p]):
                for v in list(ranks[q]):
                    if u not in ranks[p]:
                        break
                    if u[1] != v[1]:      # only a slice's own units share its pieces
                        continue
                    d = move_delta(u, p, q)
                    move(u, p, q)
                    d += move_delta(v, q, p)
                    if d < -1e-15:
                        move(v, q, p)
                        improved = True
                    else:
                        move(u, q, p)
        if not improved:
            break
    return [sorted(us) for us in ranks]


def _owners(ranks, pieces_of, m, n, S):
    """Each piece to the rank with most contributions to it (ties: the one owning fewest)."""
    count: dict = {}
    for p, us in enumerate(ranks):
        for u in us:
            for pc in pieces_of[u]:
                count.setdefault(pc, {}).setdefault(p, 0)
                count[pc][p] += 1
    owned = [0] * len(ranks)
    owner = {}
    for pc in sorted(count):
        p = max(count[pc], key=lambda q: (count[pc][q], -owned[q], -q))
        owner[pc] = p
        owned[p] += 1
    for pc in ((i, j, s) for i in range(m) for j in range(n) for s in range(S)):
        if pc not in owner:           # a block no product writes: zero, owned by the least loaded
            owner[pc] = min(range(len(ranks)), key=lambda q: owned[q])
            owned[owner[pc]] += 1
    return owner


def plan_products(alg, M: int, N: int, K: int, ranks: int, dtype, profile, *,
                  link_bw: float = NVLINK_BW, src: int | None = None, dst: int | None = None,
                  strategy: str = "auto", slices: int | None = None) -> ProductPlan:
    """The plan for C = A·B (A M×K, B K×N) by ``alg`` on ``ranks`` ranks (module doc).
    ``src``: the rank holding A and B (None: every rank has them); ``dst``: the rank that
    gets C (None: every rank); ``strategy`` "slices", "products" or "auto" (the faster by
    the model); ``slices`` fixes S for "products"."""
    if ranks < 1:
        raise LcmacError(f"a plan needs at least one rank, got {ranks}")
    if strategy not in ("auto", "slices", "products"):
        raise LcmacError(f"strategy is 'auto', 'slices' or 'products', not {strategy!r}")
    choices = []
    if strategy in ("auto", "slices"):
        choices.append(("slices", ranks))
    if strategy in ("auto", "products"):
        choices += [("products", s) for s in ((slices,) if slices else SLICE_CHOICES)]
    plans = [_plan(alg, M, N, K, ranks, dtype, profile, link_bw, src, dst, st, s)
             for st, s in choices]
    best = min(plans, key=lambda p: (p.predicted_s, p.strategy != "slices", p.slices))
    others = ", ".join(f"{p.strategy} S={p.slices} {p.predicted_s * 1e3:.1f} ms"
                       for p in plans if p is not best)
    why = (f"{best.strategy} with S={best.slices}: predicted {best.predicted_s * 1e3:.1f} ms, "
           f"{best.partial_pieces} partial sums moved" + (f" (also priced: {others})" if others else ""))
    return ProductPlan(**{**best.__dict__, "why": why})


def combine_bytes(coefs, isz: int, acc: int, out: int) -> int:
    """Bytes per element moved by ``lcmac.distributed.combine`` for terms with these
    coefficients (in order) of ``isz``-byte inputs, an ``acc``-byte accumulator and an
    ``out``-byte result: nothing for one term of 1 (the input itself), one add for two terms
    led by 1, else an accumulator written, read and written per further term, and cast."""
    if len(coefs) == 1 and coefs[0] == 1 and isz == out:
        return 0
    if len(coefs) == 2 and coefs[0] == 1 and isz == out:
        return 3 * isz
    return isz + acc + (len(coefs) - 1) * (isz + 2 * acc) + (acc + out if out != acc else 0)


def _coefs(T, r):
    return [T[r, a, b] for a, b in _support(T, r)]


def _plan(alg, M, N, K, P, dtype, profile, link_bw, src, dst, strategy, S) -> ProductPlan:
    d = normalize_model_dtype(dtype)
    isz = ITEMSIZE[d]
    acc = 8 if d == "float64" else 4
    m, k, n = alg.grid
    R = alg.R
    Mp, Kp, Np = _pad(M, m * S), _pad(K, k), _pad(N, n)
    h, kb, nb = Mp // (m * S), Kp // k, Np // n
    pieces_of = {(r, s): [(i, j, s) for i, j in _support(alg.W, r)] for r in range(R) for s in range(S)}
    bw = profile.achievable_bw()
    piece_s = h * nb * acc / link_bw
    b_combine_s = lambda r: combine_bytes(_coefs(alg.V, r), isz, acc, isz) * kb * nb / bw
    ranks = _deal(R, S, P, strategy)
    if strategy == "products" and P > 1:
        ranks = _reduce_traffic(ranks, pieces_of, kb * nb * isz / bw, piece_s)
    unit_gemm = gemm_estimate(h, nb, kb, d, profile).time_s

    def price(ranks):
        """(owner, seconds per rank, combined-or-raw per rank, partial sums moved, pieces
        touched per rank)."""
        owner = _owners(ranks, pieces_of, m, n, S)
        touched = [{pc for u in us for pc in pieces_of[u]} for us in ranks]
        rank_s, sent, combined, to_send = [], 0, [], 0
        for p, us in enumerate(ranks):
            prods = sorted({r for r, _ in us})
            t = len(us) * unit_gemm + sum(b_combine_s(r) for r in prods)
            out_pieces = sum(owner[pc] != p for pc in touched[p])
            received = {pc: sum(pc in touched[q] for q in range(P) if q != p)
                        for pc in touched[p] if owner[pc] == p}
            in_pieces = sum(received.values())
            for r, s in us:
                t += combine_bytes(_coefs(alg.U, r), isz, acc, isz) * h * kb / bw
            # each piece summed once from its terms (in the order the runtime sums them): the
            # rank's own, then those received; sent ones stay in the accumulation dtype
            terms: dict = {}
            for r, s in sorted(us):
                for i, j in _support(alg.W, r):
                    terms.setdefault((i, j, s), []).append(alg.W[r, i, j])
            for pc, cs in terms.items():
                if owner[pc] == p:
                    t += combine_bytes(cs + [1] * received[pc], isz, acc, isz) * h * nb / bw
                else:
                    t += combine_bytes(cs, isz, acc, acc) * h * nb / bw
            sent += out_pieces
            t += max(out_pieces, in_pieces) * piece_s
            a_comb = len(us)
            a_raw = len({(i, l, s) for r, s in us for i, l in _support(alg.U, r)})
            b_comb, b_raw = len(prods), len({lj for r in prods for lj in _support(alg.V, r)})
            combined.append((a_comb < a_raw, b_comb < b_raw))
            if src is not None and p != src:
                moved = (min(a_comb, a_raw) * h * kb + min(b_comb, b_raw) * kb * nb) * isz
                to_send += moved
                t += moved / link_bw
            rank_s.append(t)
        if src is not None and P > 1:      # src sends every rank its operands: its link is the bottleneck
            rank_s[src] += to_send / link_bw
        owned = [sum(o == p for o in owner.values()) for p in range(P)]
        gather = (sum(owned) - (min(owned) if dst is None else owned[dst])) * h * nb * isz / link_bw
        return owner, [t + gather for t in rank_s] if P > 1 else rank_s, combined, sent, touched

    priced = price(ranks)
    if strategy == "products" and P > 1:
        ranks, priced = _rebalance(ranks, priced, price)
    owner, rank_s, combined, sent, touched = priced
    return ProductPlan(alg.grid, (Mp, Np, Kp), S, strategy, tuple(tuple(sorted(us)) for us in ranks),
                       owner, tuple(combined), tuple(rank_s), sent,
                       tuple(frozenset(t) for t in touched), "")


def _rebalance(ranks, priced, price, tries: int = 6, rounds: int = 8):
    """Units moved from the slowest rank to the fastest while that lowers the slowest's
    predicted time (what equal counts miss: the rank that sends every operand, combines of
    different sizes); ``tries`` candidate units per move, at most ``rounds`` moves."""
    for _ in range(rounds):
        rank_s = priced[1]
        hi = max(range(len(ranks)), key=lambda p: rank_s[p])
        lo = min(range(len(ranks)), key=lambda p: rank_s[p])
        best = None
        for u in sorted(ranks[hi], key=lambda u: u[0] in {v[0] for v in ranks[lo]}, reverse=True)[:tries]:
            cand = [list(us) for us in ranks]
            cand[hi].remove(u)
            cand[lo].append(u)
            got = price(cand)
            if max(got[1]) < max(rank_s) * (1 - 1e-6) and (best is None or max(got[1]) < max(best[1][1])):
                best = (cand, got)
        if best is None:
            break
        ranks, priced = best
    return [sorted(us) for us in ranks], priced


# ---- operands in host memory: C's tiles streamed ---------------------------------------------
@dataclass(frozen=True)
class TilePlan:
    """C cut into ``tile``-sided tiles, K into ``chunk``-long pieces; ``tiles[p]``: rank p's
    tiles as (row0, row1, col0, col1); ``device_bytes``: one rank's GPU working set."""
    tile: int
    chunk: int
    tiles: tuple[tuple[tuple[int, int, int, int], ...], ...]
    device_bytes: int
    rank_s: tuple[float, ...]
    why: str

    @property
    def predicted_s(self) -> float:
        return max(self.rank_s)


def tile_working_set(tile: int, chunk: int, itemsize: int, acc_itemsize: int) -> int:
    """GPU bytes for one rank: two buffers each of A's and B's pieces (tile×chunk), the
    product, the float32/64 accumulator and two rounded tiles on their way out."""
    return 2 * 2 * tile * chunk * itemsize + tile * tile * (itemsize + acc_itemsize + 2 * itemsize)


def plan_tiles(M: int, N: int, K: int, ranks: int, dtype, profile, device_bytes: int, *,
               host_bw: float = 25e9, tile: int | None = None, chunk: int | None = None) -> TilePlan:
    """Tiles and chunks for ``host_matmul``.  Candidates: C's longer side cut into 1, 2, … equal
    tiles (sides rounded up to 256), chunks as long as the tile, those whose working set fits
    ``device_bytes``; tiles dealt in row-major runs of equal count (±1).  Per tile and chunk the
    time is the slower of the product (``gemm_estimate``) and its operands' copy over
    ``host_bw`` (they overlap), plus the last tile's way back; the fastest candidate wins.
    (Traffic per flop falls as 1/tile: large tiles, as many as balance the ranks.)"""
    d = normalize_model_dtype(dtype)
    isz, acc = ITEMSIZE[d], (8 if d == "float64" else 4)
    sides = [tile] if tile else sorted({_pad(-(-max(M, N) // t), 256) for t in range(1, 17)}, reverse=True)
    plans = []
    for T in sides:
        c = min(chunk or T, K)
        if tile_working_set(T, c, isz, acc) <= device_bytes:
            plans.append(_tile_plan(M, N, K, ranks, d, profile, T, c, host_bw, isz, acc))
    if not plans:
        T = sides[-1]
        need = tile_working_set(T, min(chunk or T, K), isz, acc)
        raise LcmacError(f"a {T}-row tile needs {need / 2**30:.1f} GiB of the GPU's "
                         f"{device_bytes / 2**30:.1f} GiB: pass a smaller tile= or chunk=")
    return min(plans, key=lambda p: (p.predicted_s, -p.tile))


def _tile_plan(M, N, K, ranks, d, profile, tile, chunk, host_bw, isz, acc) -> TilePlan:
    all_tiles = [(r, min(M, r + tile), c, min(N, c + tile))
                 for r in range(0, M, tile) for c in range(0, N, tile)]
    q, extra = divmod(len(all_tiles), ranks)
    dealt, i = [], 0
    for p in range(ranks):
        n = q + (1 if p < extra else 0)
        dealt.append(tuple(all_tiles[i:i + n]))
        i += n
    rank_s, gemm_s = [], {}
    for ts in dealt:
        t = 0.0
        for r0, r1, c0, c1 in ts:
            for k0 in range(0, K, chunk):
                key = (r1 - r0, c1 - c0, min(K, k0 + chunk) - k0)
                if key not in gemm_s:
                    gemm_s[key] = gemm_estimate(*key, d, profile).time_s
                t += max(gemm_s[key], (key[0] + key[1]) * key[2] * isz / host_bw)
        if ts:
            r0, r1, c0, c1 = ts[-1]
            t += (r1 - r0) * (c1 - c0) * isz / host_bw
        rank_s.append(t)
    need = tile_working_set(tile, chunk, isz, acc)
    why = (f"{len(all_tiles)} tiles of {tile}² over {ranks} ranks, K in chunks of {chunk}; "
           f"{need / 2**30:.1f} GiB on each GPU; predicted {max(rank_s) * 1e3:.0f} ms")
    return TilePlan(tile, chunk, tuple(dealt), need, tuple(rank_s), why)
