"""Where lcmac starts to win for one linear layer: the planner asked at a grid of row counts.

A layer of K input and N output features multiplies rows × K by K × N, and its rows (batch
× sequence length) change from call to call: one token in decode, thousands in a prompt.
``search`` asks ``lcmac.ops.plan`` (what ``lcmac.matmul`` runs; planning never compiles) at
each row count of a grid (``row_grid``: powers of two and their midpoints) and returns the
decisions and the layer's crossover: the smallest of those row counts at which an lcmac
kernel runs, with "auto"; 0 with a forced algorithm, which runs at every row count.  Above
the crossover each call still decides for its own row count, so where the vendor GEMM wins
again higher up (the decision need not be monotone in the rows) that call runs it.
"""
from __future__ import annotations

from dataclasses import dataclass

from lcmac.api import matmul as ops
from lcmac.artifact.bundle import backend_kind
from lcmac.core.errors import ShapeError
from lcmac.policy import AUTO, VENDOR
from lcmac.spec.shape_rules import JIT_ROWS

__all__ = ["RowDecision", "Search", "row_grid", "smallest_bucket", "search", "check_rows"]


def check_rows(value, what: str) -> int:
    """``value`` as a positive row count; ShapeError naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShapeError(f"{what} must be a positive whole number of rows, got {value!r}")
    return value


def smallest_bucket(target: str) -> int:
    """The smallest row bucket of ``target``'s kernels: "auto" gives fewer rows to the
    vendor GEMM, so no search point below it can win."""
    return min(JIT_ROWS[backend_kind(target)])


def row_grid(max_rows: int, smallest: int = 1) -> tuple[int, ...]:
    """Powers of two and their midpoints (3·2ᵏ⁻¹) from ``smallest`` to ``max_rows``, and
    ``max_rows`` itself, ascending."""
    grid = {max_rows}
    p = 1
    while p <= max_rows:
        grid.update(r for r in (p, p + p // 2) if smallest <= r <= max_rows)
        p *= 2
    return tuple(sorted(grid))


@dataclass(frozen=True)
class RowDecision:
    """The plan at ``rows`` rows: what runs ("vendor" or an lcmac kernel), its predicted
    speed-up over lcmac's plain GEMM and error ÷ the plain GEMM's (None where not priced)."""
    rows: int
    runs: str
    speedup: float | None
    error: float | None
    why: str

    @property
    def wins(self) -> bool:
        return self.runs != VENDOR

    def to_dict(self) -> dict:
        return {"rows": self.rows, "runs": self.runs, "speedup": self.speedup,
                "error": self.error, "why": self.why}


@dataclass(frozen=True)
class Search:
    """The decisions at each row count searched, ascending, and the crossover (None where no
    lcmac kernel runs at any of them)."""
    crossover: int | None
    decisions: tuple

    def first_win(self) -> RowDecision | None:
        return next((d for d in self.decisions if d.wins), None)


def _decide(rows: int, N: int, K: int, dtype: str, target: str, algo: str,
            max_error, operands=None) -> RowDecision:
    mode = {} if operands is None else {"operands": operands}
    p = ops.plan(rows, N, K, dtype, algo=algo, max_error=max_error, target=target, **mode)
    # a plan whose every row piece goes to the vendor GEMM runs no lcmac kernel
    runs = p.runs if p.kernel_shapes() else VENDOR
    return RowDecision(rows, runs, p.speedup, p.error, p.why)


def search(N: int, K: int, dtype: str, target: str, grid, *, algo: str = AUTO,
           max_error=None, operands: str | None = None) -> Search:
    """The decisions for a K→N layer at the row counts of ``grid`` (module doc), in the
    operand mode ``operands`` where given (``"fp8"``: ``lcmac.nn.Linear(operands="fp8")``)."""
    decisions = tuple(_decide(r, N, K, dtype, target, algo, max_error, operands)
                      for r in sorted(set(grid)))
    first = next((d.rows for d in decisions if d.wins), None)
    crossover = None if first is None else (first if algo == AUTO else 0)
    return Search(crossover, decisions)
