"""Combine stages as straight-line programs of additions with constant coefficients.

A ``LinearProgram`` computes ``n_outputs`` linear combinations of ``n_inputs`` values through
temporaries.  Slot numbering: inputs are 0..n_inputs-1, temporary t is n_inputs+t.  Each
temporary and each output is a tuple of ``(coefficient, slot)`` terms; an output of q terms
costs q-1 additions (a coefficient of ±1 is an add/sub; any other constant is a scaled add).

The three combine stages of an algorithm:

    Combine A: inputs A_il (slot i·k+l)   → outputs Ã_r   (R of them)
    Combine B: inputs B_lj (slot l·n+j)   → outputs B̃_r
    Combine H: inputs H_r                 → outputs C_ij  (slot i·n+j)

Backends fold the coefficients of these programs into generated code as literals.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from lcmac.ir.algorithm import Algorithm

Term = tuple  # (coefficient: int | Fraction, slot: int)


@dataclass(frozen=True)
class LinearProgram:
    n_inputs: int
    temps: tuple[tuple[Term, ...], ...]
    outputs: tuple[tuple[Term, ...], ...]

    @property
    def n_outputs(self) -> int:
        return len(self.outputs)

    @property
    def additions(self) -> int:
        return sum(max(0, len(t) - 1) for t in self.temps + self.outputs)

    @property
    def scalings(self) -> int:
        """Terms with a coefficient other than ±1 (a multiply each, on top of the adds)."""
        return sum(1 for e in self.temps + self.outputs for c, _ in e if c not in (1, -1))

    def matrix(self) -> np.ndarray:
        """The exact n_outputs × n_inputs coefficient matrix the program computes."""
        rows: list[dict[int, Fraction]] = [{i: Fraction(1)} for i in range(self.n_inputs)]

        def expand(expr):
            acc: dict[int, Fraction] = {}
            for c, s in expr:
                for i, v in rows[s].items():
                    acc[i] = acc.get(i, Fraction(0)) + c * v
            return acc

        for t in self.temps:
            rows.append(expand(t))
        M = np.zeros((self.n_outputs, self.n_inputs), dtype=object)
        M[...] = 0
        for o, expr in enumerate(self.outputs):
            for i, v in expand(expr).items():
                M[o, i] = int(v) if v.denominator == 1 else v
        return M

    def evaluate(self, inputs: list):
        """Run the program on numbers or arrays (the order backends emit it in)."""
        if len(inputs) != self.n_inputs:
            raise ValueError(f"program takes {self.n_inputs} inputs, got {len(inputs)}")
        slots = list(inputs)

        def ev(expr):
            if not expr:
                return 0 * inputs[0]
            acc = None
            for c, s in expr:
                term = slots[s] if c == 1 else (-slots[s] if c == -1 else float(c) * slots[s])
                acc = term if acc is None else acc + term
            return acc

        for t in self.temps:
            slots.append(ev(t))
        return [ev(o) for o in self.outputs]

    def to_dict(self) -> dict:
        enc = lambda e: [[c if isinstance(c, int) else str(c), s] for c, s in e]  # noqa: E731
        return {"n_inputs": self.n_inputs, "temps": [enc(t) for t in self.temps],
                "outputs": [enc(o) for o in self.outputs], "additions": self.additions}

    @classmethod
    def from_dict(cls, d: dict) -> "LinearProgram":
        def dec(e):
            return tuple((int(c) if isinstance(c, int) else Fraction(c), int(s)) for c, s in e)
        return cls(int(d["n_inputs"]), tuple(dec(t) for t in d["temps"]),
                   tuple(dec(o) for o in d["outputs"]))

    def pretty(self, in_names: list[str], out_names: list[str]) -> str:
        names = list(in_names) + [f"t{i}" for i in range(len(self.temps))]

        def fmt(expr):
            s = ""
            for c, slot in expr:
                mag = abs(c)
                sign = "-" if c < 0 else "+"
                term = names[slot] if mag == 1 else f"{mag}*{names[slot]}"
                s += (f" {sign} " if s else ("-" if c < 0 else "")) + term
            return s or "0"

        lines = [f"{names[self.n_inputs + i]} = {fmt(t)}" for i, t in enumerate(self.temps)]
        lines += [f"{out_names[i]} = {fmt(o)}" for i, o in enumerate(self.outputs)]
        return "\n".join(lines)


def direct_outputs(p: LinearProgram) -> dict[int, int]:
    """{output: input slot} of the outputs that are one input with coefficient ±1 (Strassen's
    Ã_3 = A11): a backend can read that block in place instead of writing a copy (a −1 moves
    into the products' W, ``scale_inputs``)."""
    return {o: e[0][1] for o, e in enumerate(p.outputs)
            if len(e) == 1 and e[0][0] in (1, -1) and e[0][1] < p.n_inputs}


def scale_inputs(p: LinearProgram, scale: dict[int, int]) -> LinearProgram:
    """The program with input slot i replaced by scale[i]·input i (e.g. Combine H's program
    when product r is computed from a negated operand: H_r' = −H_r)."""
    def term(c, s):
        return (c * scale.get(s, 1), s) if s < p.n_inputs else (c, s)
    return LinearProgram(p.n_inputs, tuple(tuple(term(c, s) for c, s in e) for e in p.temps),
                         tuple(tuple(term(c, s) for c, s in e) for e in p.outputs))


def keep_outputs(p: LinearProgram, keep: list[int]) -> LinearProgram:
    """The program computing only outputs ``keep`` (in that order); temporaries no kept
    output needs are dropped."""
    n = p.n_inputs
    outs = tuple(p.outputs[o] for o in keep)
    live = set()
    stack = [s for e in outs for _, s in e if s >= n]
    while stack:
        s = stack.pop()
        if s not in live:
            live.add(s)
            stack += [s2 for _, s2 in p.temps[s - n] if s2 >= n]
    remap = {}
    temps = []
    for t, e in enumerate(p.temps):
        if n + t in live:
            remap[n + t] = n + len(temps)
            temps.append(tuple((c, remap.get(s, s)) for c, s in e))
    return LinearProgram(n, tuple(temps), tuple(tuple((c, remap.get(s, s)) for c, s in e) for e in outs))


def naive_program(M: np.ndarray) -> LinearProgram:
    """Each output computed directly from the inputs (no sharing)."""
    outs = tuple(tuple((M[o, i], i) for i in range(M.shape[1]) if M[o, i] != 0)
                 for o in range(M.shape[0]))
    return LinearProgram(M.shape[1], (), outs)


def combine_matrices(alg: Algorithm) -> dict[str, np.ndarray]:
    """The coefficient matrices of the three stages in the slot order documented above."""
    R = alg.R
    return {"A": alg.U.reshape(R, alg.m * alg.k),
            "B": alg.V.reshape(R, alg.k * alg.n),
            "H": np.ascontiguousarray(alg.W.reshape(R, alg.m * alg.n).T)}


def stage_names(alg: Algorithm) -> dict[str, tuple[list[str], list[str]]]:
    R = alg.R
    return {
        "A": ([f"A{i+1}{l+1}" for i in range(alg.m) for l in range(alg.k)], [f"At{r+1}" for r in range(R)]),
        "B": ([f"B{l+1}{j+1}" for l in range(alg.k) for j in range(alg.n)], [f"Bt{r+1}" for r in range(R)]),
        "H": ([f"H{r+1}" for r in range(R)], [f"C{i+1}{j+1}" for i in range(alg.m) for j in range(alg.n)]),
    }
