"""What lcmac asks of the matrices it is handed, in one place: what kind each one is (a numpy
array, a torch tensor on the CPU or on CUDA), its dtype's name, shape, device and layout, and
the checks every product call and every loaded artifact makes of them.

Each ``check_*`` raises on the first problem it finds (ShapeError, DTypeError, TargetError;
the message names the problem and the fix) and returns what it learnt where that is of use
(the kind, the dtype's name, M, N and K).  A caller runs the checks its contract states, in
that contract's order, naming its operands (``what``) and, where its message says which call
refuses, itself (``who``); ``error`` keeps the class a call has always raised where that is
another one.

Duck-typed: neither numpy nor torch is imported here.  An operand is read through its
``.shape``, ``.dtype``, ``.device``, ``.flags`` (numpy) or ``.is_contiguous()`` (torch) and
its data pointer, and copied row-major through ``.copy(order="C")`` / ``.contiguous()``.
"""
from __future__ import annotations

from lcmac.core.dtypes import normalize_dtype
from lcmac.core.errors import DTypeError, ShapeError, TargetError

NUMPY, TORCH = "numpy", "torch"


# ---- questions ------------------------------------------------------------------------------
def operand_kind(x) -> str | None:
    """"numpy" or "torch" for an array or tensor of those libraries (by its type's module, so
    torch is not imported to ask), else None."""
    t = type(x)
    kind = _kinds.get(t, _kinds)
    if kind is _kinds:
        mod = t.__module__.split(".")[0]
        kind = _kinds[t] = mod if mod in (NUMPY, TORCH) else None
    return kind


#: type → kind, asked several times a product call (the types seen are few)
_kinds: dict = {}


def device_of(x) -> str:
    """Where ``x`` lives: a torch tensor's device ("cpu", "cuda:0", "meta"), "cpu" for
    anything else (a numpy array is in host memory)."""
    return str(x.device) if operand_kind(x) == TORCH else "cpu"


def device_type(x) -> str:
    """The device's type: "cpu", "cuda", "meta"…; "cpu" for a numpy array."""
    return x.device.type if operand_kind(x) == TORCH else "cpu"


def is_cuda(x) -> bool:
    return bool(getattr(x, "is_cuda", False))


def dtype_name(x) -> str:
    """The element type as lcmac writes it: numpy's name, torch's without "torch."."""
    return str(x.dtype).replace("torch.", "")


def is_contiguous(x) -> bool:
    """Whether ``x`` is row-major (C order) with no gaps."""
    if operand_kind(x) == NUMPY:
        return bool(x.flags["C_CONTIGUOUS"])
    return bool(x.is_contiguous())


def shape_of(x) -> tuple:
    """``x``'s dimensions (none for an object without a shape)."""
    return tuple(getattr(x, "shape", ()))


def shape_text(shape) -> str:
    """(48, 56) → "48x56"; () → "scalar"."""
    return "x".join(map(str, shape)) or "scalar"


def memory_span(x) -> tuple[int, int]:
    """(address of the first byte, bytes) of an array's or tensor's data."""
    if operand_kind(x) == TORCH:
        return x.data_ptr(), x.numel() * x.element_size()
    return x.__array_interface__["data"][0], x.nbytes


def _listed(names) -> str:
    """("A", "B", "out") → "A, B and out"."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _be(name: str) -> str:
    """The verb after ``name``: "the blocks are", "A is"."""
    return "are" if name.endswith("s") else "is"


# ---- what an operand is -----------------------------------------------------------------------
def check_array(x, what: str, *, error=DTypeError) -> str:
    """``x``'s kind ("numpy" or "torch"); anything else raises ``error``."""
    kind = operand_kind(x)
    if kind is None:
        raise error(f"{what} must be a numpy array or a torch tensor, got {type(x).__name__}")
    return kind


def check_tensor(x, what: str, *, who: str | None = None, error=DTypeError) -> None:
    """``x`` is a torch tensor (``who``: the call that takes only those)."""
    if operand_kind(x) != TORCH:
        got = type(x).__name__
        said = f"{who} takes torch tensors; {what} is of type {got}" if who else \
            f"{what} must be a torch tensor, got {got}"
        raise error(f"{said} (torch.from_numpy converts a numpy array)")


def check_same_kind(A, B, names=("A", "B"), *, error=DTypeError) -> None:
    """Both torch tensors or neither."""
    if (operand_kind(A) == TORCH) != (operand_kind(B) == TORCH):
        got = [operand_kind(x) or type(x).__name__ for x in (A, B)]
        raise error(f"{_listed(names)} must be both numpy arrays or both torch tensors; got "
                    f"{got[0]} and {got[1]}")


# ---- dtypes -----------------------------------------------------------------------------------
def check_real(x, what: str) -> None:
    """``x``'s elements are real numbers, not complex ones."""
    complex_ = x.dtype.kind == "c" if operand_kind(x) == NUMPY else x.is_complex()
    if complex_:
        raise DTypeError(f"{what} is complex ({x.dtype}); lcmac multiplies real matrices only")


def check_one_dtype(*xs, names=("A", "B", "out"), error=DTypeError) -> str:
    """The one dtype name of all of ``xs`` (named by ``names``, in order)."""
    got = [dtype_name(x) for x in xs]
    if got.count(got[0]) != len(got):
        named = names[:len(xs)]
        each = ", ".join(f"{n} {_be(n)} {d}" for n, d in zip(named, got))
        raise error(f"{_listed(named)} differ in dtype ({each}); give them one dtype")
    return got[0]


def check_alike(A, B) -> str:
    """A and B of one array type and one dtype: lcmac's name of it (an unknown dtype raises).
    Stricter than ``check_same_kind``: the type itself is compared."""
    da, db = normalize_dtype(A.dtype), normalize_dtype(B.dtype)
    if type(A) is not type(B) or da != db:
        raise DTypeError(f"A and B must be the same kind of array with one dtype; got "
                         f"{type(A).__name__} {da} and {type(B).__name__} {db}")
    return da


def check_dtype_is(x, what: str, dtype: str, built: str) -> None:
    """``x``'s dtype is ``dtype``, the one ``built`` (an artifact) was built for."""
    got = dtype_name(x)
    if got != dtype:
        raise DTypeError(f"{what} has dtype {got}; {built} was built for {dtype}")


def check_dtype_in(dtype: str, allowed, who: str, *, hint: str = "") -> None:
    """``dtype`` (a name) is one ``who`` takes; ``hint`` ends the message (what else runs it)."""
    if dtype not in allowed:
        raise DTypeError(f"{who} takes {', '.join(allowed)}, not {dtype}{hint}")


# ---- shapes -----------------------------------------------------------------------------------
def check_dims(x, what: str, dims: str, *, leading: bool = False) -> None:
    """``x`` has the dimensions ``dims`` names ("M×K": 2-D); with ``leading`` it may have
    more before them (a batch of matrices)."""
    _check_dims(shape_of(x), what, dims, leading)


def _check_dims(got: tuple, what: str, dims: str, leading: bool) -> None:
    n = dims.count("×") + 1
    if leading and len(got) < n:
        raise ShapeError(f"{what} must be a matrix or a batch of matrices (…×{dims}); got shape {got}")
    if not leading and len(got) != n:
        raise ShapeError(f"{what} must be {n}-D ({dims}); got shape {got}")


def check_inner(A, B) -> None:
    """A's last dimension is B's first."""
    _check_inner(shape_of(A), shape_of(B))


def _check_inner(sa: tuple, sb: tuple) -> None:
    if sa[-1] != sb[0]:
        raise ShapeError(f"inner dimensions differ: A is {shape_text(sa)}, B is {shape_text(sb)}")


def check_matrices(A, B, out=None, *, batch_a: bool = False, who: str | None = None) -> tuple:
    """(M, N, K) of C = A·B for A of M×K (``batch_a``: …×M×K, its rows flattened into M) and
    B of K×N; ``out``, where given, of C's shape.  The first problem is said on its own:
    A's dimensions, B's, K, out; where ``who`` names the call, one message states its whole
    contract instead."""
    sa, sb = shape_of(A), shape_of(B)
    a_ok = len(sa) >= 2 if batch_a else len(sa) == 2
    fits = a_ok and len(sb) == 2 and sa[-1] == sb[0]
    want = (*sa[:-1], sb[1]) if fits and out is not None else None
    if who is not None:
        if not fits or (out is not None and shape_of(out) != want):
            takes = [f"A of {'…×' if batch_a else ''}M×K", "B of K×N"]
            got = [f"A {sa}", f"B {sb}"]
            if out is not None:
                takes.append(f"out of {'…×' if batch_a else ''}M×N")
                got.append(f"out {shape_of(out)}")
            raise ShapeError(f"{who} takes {_listed(takes)}; {_listed(got)} do not make C = A·B")
    else:
        _check_dims(sa, "A", "M×K", batch_a)
        _check_dims(sb, "B", "K×N", False)
        _check_inner(sa, sb)
        if out is not None:
            check_shape_is(out, "out", want, f"the product is {shape_text(want)}")
    M = 1
    for d in sa[:-1]:
        M *= d
    return M, sb[1], sa[-1]


def check_batches(A, B) -> tuple:
    """(batch, M, N, K) of C[b] = A[b]·B[b] for A [batch, M, K] and B [batch, K, N]."""
    sa, sb = shape_of(A), shape_of(B)
    if len(sa) != 3:
        raise ShapeError(f"B of {sb} is a batch of products: A must be 3-D [batch, M, K] too, not "
                         f"{sa} (or B 2-D [K, N] for one product)")
    if len(sb) != 3 or sb[0] != sa[0] or sb[1] != sa[2]:
        raise ShapeError(f"B must be [batch, K, N] matching A {sa}: got {sb}")
    return sa[0], sa[1], sb[2], sa[2]


def check_shape_is(x, what: str, shape, fits: str) -> None:
    """``x`` has exactly ``shape``; ``fits`` says what does (an artifact's fixed shape, the
    product's)."""
    got = shape_of(x)
    if got != tuple(shape):
        raise ShapeError(f"{what} has shape {shape_text(got)}; {fits}")


# ---- devices ----------------------------------------------------------------------------------
def _device_key(x):
    """What tells two devices apart, cheaper to make than ``device_of``'s text."""
    return x.device if operand_kind(x) == TORCH else "cpu"


def check_same_device(*xs, names=("A", "B", "out"), fix: str = "put them on one device",
                      error=TargetError, by=_device_key) -> None:
    """All of ``xs`` (of one kind) on one device (``by``: what counts as one, e.g.
    ``is_cuda`` where only CPU against CUDA matters)."""
    first = by(xs[0])
    for name, x in zip(names[1:], xs[1:]):
        if by(x) != first:
            raise error(f"{names[0]} {_be(names[0])} on {device_of(xs[0])}, {name} on "
                        f"{device_of(x)}: {fix}")


def check_device_type(x, what: str, want: str, needs: str) -> None:
    """``x`` on a device of type ``want`` ("cpu", "cuda"); ``needs`` says who asks and why."""
    if device_type(x) != want:
        raise TargetError(f"{what} is on {device_of(x)}; {needs}")


# ---- layout and memory --------------------------------------------------------------------------
def check_contiguous(x, what: str, *, output: bool = False) -> None:
    """``x`` row-major with no gaps; the fix for an input is a copy, for an ``output`` (written
    in place, so a copy would not receive the result) another array."""
    if not is_contiguous(x):
        if output:
            fix = "pass a contiguous array (numpy.empty / torch.empty)"
        else:
            fix = "pass a contiguous copy ({})".format(
                "numpy.ascontiguousarray(x)" if operand_kind(x) == NUMPY else "x.contiguous()")
        raise ShapeError(f"{what} is not contiguous (row-major) with shape {shape_of(x)}; {fix}")


def row_major(x):
    """``x`` itself where it is row-major with no gaps, else a row-major copy of it: what a
    kernel reads.  A transposed, Fortran-ordered, sliced or reversed view multiplies as its
    copy does, so numpy's and torch's product calls take them."""
    if is_contiguous(x):
        return x
    return x.copy(order="C") if operand_kind(x) == NUMPY else x.contiguous()


def check_aligned(x, what: str, align: int, why: str) -> None:
    """``x``'s data starts on an ``align``-byte boundary (``why``: what reads it so)."""
    ptr = memory_span(x)[0]
    if ptr % align:
        raise ShapeError(f"{what} must be {align}-byte aligned ({why}); got address {ptr:#x}")


def check_no_overlap(out, named) -> None:
    """``out``'s memory shares no byte with any operand of ``named`` ((name, x) pairs; x may
    be None)."""
    c0, cn = memory_span(out)
    for what, x in named:
        if x is not None:
            x0, xn = memory_span(x)
            if c0 < x0 + xn and x0 < c0 + cn:
                raise ShapeError(f"out overlaps {what} in memory; pass a separate output array")


# ---- the output -------------------------------------------------------------------------------
def check_out(out, like, shape, *, summary: bool = False, any_layout: bool = False) -> None:
    """``out`` fit to receive C of ``shape``: the kind, dtype and device of ``like`` (A),
    row-major unless ``any_layout`` (the caller copies the result into a strided ``out``).
    The first problem is said on its own; with ``summary`` one message says all that out
    must be."""
    kind = operand_kind(like)
    noun = "array" if kind == NUMPY else "tensor"
    if summary:
        if not (operand_kind(out) == kind and shape_of(out) == tuple(shape)
                and dtype_name(out) == dtype_name(like) and device_of(out) == device_of(like)
                and is_contiguous(out)):
            raise ShapeError(f"out must be a contiguous {shape_text(shape)} {dtype_name(like)} "
                             f"{noun} on {device_of(like)}")
        return
    if operand_kind(out) != kind:
        raise DTypeError(f"out must be a {kind} {noun} like A")
    check_shape_is(out, "out", shape, f"the product is {shape_text(shape)}")
    if dtype_name(out) != dtype_name(like):
        raise DTypeError(f"out has dtype {dtype_name(out)}; A and B are {dtype_name(like)}")
    check_same_device(out, like, names=("out", "A"), fix="pass an out on A's device")
    if not any_layout:
        check_contiguous(out, "out", output=True)
