"""lcmac.core.operands: each question and each check, with the message it raises."""
import re
import sys

import numpy as np
import pytest

from lcmac.core import operands as ops
from lcmac.core.errors import DTypeError, LcmacError, ShapeError, TargetError

torch = pytest.importorskip("torch")


def _raises(exc, text):
    """pytest.raises matching ``text`` literally."""
    return pytest.raises(exc, match=re.escape(text))


def test_the_module_imports_neither_numpy_nor_torch():
    src = open(ops.__file__).read()
    assert not re.search(r"^\s*(import|from)\s+(numpy|torch)\b", src, re.M)


def test_questions_numpy_and_torch_alike():
    a, t = np.zeros((2, 3), np.float32), torch.zeros(2, 3)
    assert (ops.operand_kind(a), ops.operand_kind(t), ops.operand_kind([1])) == ("numpy", "torch", None)
    assert ops.operand_kind(torch.nn.Parameter(t)) == "torch"
    assert ops.device_of(a) == ops.device_of(t) == "cpu"
    assert ops.device_of(torch.zeros(1, device="meta")) == "meta"
    assert ops.device_type(a) == "cpu" and ops.device_type(torch.zeros(1, device="meta")) == "meta"
    assert not ops.is_cuda(a) and not ops.is_cuda(t)
    assert ops.dtype_name(a) == ops.dtype_name(t) == "float32"
    assert ops.is_contiguous(a) and not ops.is_contiguous(np.asfortranarray(a))
    assert ops.is_contiguous(t) and not ops.is_contiguous(t.t())
    assert ops.shape_of(a) == ops.shape_of(t) == (2, 3) and ops.shape_of([1]) == ()
    assert ops.shape_text((48, 56)) == "48x56" and ops.shape_text(()) == "scalar"
    assert ops.memory_span(a) == (a.__array_interface__["data"][0], 24)
    assert ops.memory_span(t) == (t.data_ptr(), 24)


def test_kind_checks():
    a, t = np.zeros((2, 3)), torch.zeros(2, 3)
    assert ops.check_array(a, "A") == "numpy" and ops.check_array(t, "B") == "torch"
    with _raises(DTypeError, "A must be a numpy array or a torch tensor, got list"):
        ops.check_array([[1.0]], "A")
    with _raises(TypeError, "B must be a numpy array or a torch tensor, got int") as e:
        ops.check_array(3, "B", error=TypeError)
    assert type(e.value) is TypeError
    ops.check_tensor(t, "A")
    with _raises(DTypeError, "A must be a torch tensor, got ndarray (torch.from_numpy converts "
                             "a numpy array)"):
        ops.check_tensor(a, "A")
    with _raises(LcmacError, "devices= takes torch tensors; B is of type ndarray (torch.from_numpy"):
        ops.check_tensor(a, "B", who="devices=", error=LcmacError)
    ops.check_same_kind(a, a)
    ops.check_same_kind(t, torch.nn.Parameter(t))
    ops.check_same_kind(a, [1.0])            # neither is a torch tensor: the shape checks say more
    with _raises(DTypeError, "A and B must be both numpy arrays or both torch tensors; got numpy "
                             "and torch"):
        ops.check_same_kind(a, t)
    with _raises(DTypeError, "the blocks and B must be both numpy arrays or both torch tensors; "
                             "got torch and list"):
        ops.check_same_kind(t, [1.0], names=("the blocks", "B"))


def test_dtype_checks():
    a32, a64 = np.zeros((2, 2), np.float32), np.zeros((2, 2))
    ops.check_real(a32, "A")
    ops.check_real(torch.zeros(1), "B")
    with _raises(DTypeError, "A is complex (complex128); lcmac multiplies real matrices only"):
        ops.check_real(a64.astype(complex), "A")
    with _raises(DTypeError, "B is complex (torch.complex64); lcmac multiplies real matrices only"):
        ops.check_real(torch.zeros(1, dtype=torch.complex64), "B")
    assert ops.check_one_dtype(a32, a32, a32) == "float32"
    with _raises(DTypeError, "A and B differ in dtype (A is float32, B is float64); give them one dtype"):
        ops.check_one_dtype(a32, a64)
    with _raises(DTypeError, "A, B and out differ in dtype (A is float64, B is float64, out is "
                             "float32); give them one dtype"):
        ops.check_one_dtype(a64, a64, a32)
    with _raises(LcmacError, "the blocks and B differ in dtype (the blocks are float32, B is "
                             "float64)"):
        ops.check_one_dtype(a32, a64, names=("the blocks", "B"), error=LcmacError)
    assert ops.check_alike(a32, a32) == "float32"
    with _raises(DTypeError, "A and B must be the same kind of array with one dtype; got ndarray "
                             "float32 and Tensor float32"):
        ops.check_alike(a32, torch.zeros(1))
    with pytest.raises(DTypeError, match="unknown dtype"):
        ops.check_alike(a32.astype(np.int64), a32)
    ops.check_dtype_is(a32, "A", "float32", "the artifact s")
    with _raises(DTypeError, "A has dtype float64; the artifact s was built for float32"):
        ops.check_dtype_is(a64, "A", "float32", "the artifact s")
    ops.check_dtype_in("float32", ("float32", "float64"), "host_matmul")
    with _raises(DTypeError, "host_matmul takes float32, float64, not int32 (algo='vendor' runs it)"):
        ops.check_dtype_in("int32", ("float32", "float64"), "host_matmul",
                           hint=" (algo='vendor' runs it)")


def test_shape_checks_one_problem_at_a_time():
    A, B = np.zeros((4, 3)), np.zeros((3, 5))
    assert ops.check_matrices(A, B) == (4, 5, 3)
    assert ops.check_matrices(np.zeros((2, 4, 3)), B, batch_a=True) == (8, 5, 3)
    assert ops.check_matrices(A, B, np.zeros((4, 5))) == (4, 5, 3)
    with _raises(ShapeError, "A must be 2-D (M×K); got shape (3,)"):
        ops.check_matrices(A[0], B)
    with _raises(ShapeError, "A must be 2-D (M×K); got shape ()"):
        ops.check_matrices([[1.0]], B)          # no .shape
    with _raises(ShapeError, "A must be a matrix or a batch of matrices (…×M×K); got shape (3,)"):
        ops.check_matrices(A[0], B, batch_a=True)
    with _raises(ShapeError, "B must be 2-D (K×N); got shape (1, 3, 5)"):
        ops.check_matrices(A, B[None])
    with _raises(ShapeError, "inner dimensions differ: A is 4x3, B is 2x5"):
        ops.check_matrices(A, B[:-1])
    with _raises(ShapeError, "inner dimensions differ: A is 2x4x3, B is 2x5"):
        ops.check_matrices(np.zeros((2, 4, 3)), B[:-1], batch_a=True)
    with _raises(ShapeError, "out has shape 4x6; the product is 4x5"):
        ops.check_matrices(A, B, np.zeros((4, 6)))
    ops.check_dims(np.zeros((2, 3, 4)), "A", "batch×rows×cols")
    with _raises(ShapeError, "A must be 3-D (batch×rows×cols); got shape (3, 4)"):
        ops.check_dims(np.zeros((3, 4)), "A", "batch×rows×cols")
    ops.check_shape_is(A, "A", (4, 3), "")
    with _raises(ShapeError, "A has shape 4x3; the artifact s accepts 48x56"):
        ops.check_shape_is(A, "A", (48, 56), "the artifact s accepts 48x56")
    with _raises(ShapeError, "A has shape scalar; it takes 2x2"):
        ops.check_shape_is(np.float32(1), "A", (2, 2), "it takes 2x2")


def test_shape_checks_that_state_the_whole_contract():
    A, B = np.zeros((4, 3)), np.zeros((3, 5))
    assert ops.check_matrices(A, B, who="devices=") == (4, 5, 3)
    with _raises(ShapeError, "devices= takes A of M×K and B of K×N; A (2, 4, 3) and B (3, 5) do "
                             "not make C = A·B"):
        ops.check_matrices(np.zeros((2, 4, 3)), B, who="devices=")
    with _raises(ShapeError, "lcmac::matmul takes A of …×M×K and B of K×N; A (2, 4, 3) and B (2, 5) "
                             "do not make C = A·B"):
        ops.check_matrices(np.zeros((2, 4, 3)), B[:2], batch_a=True, who="lcmac::matmul")
    with _raises(ShapeError, "host_matmul takes A of M×K, B of K×N and out of M×N; A (4, 3), "
                             "B (3, 5) and out (4, 6) do not make C = A·B"):
        ops.check_matrices(A, B, np.zeros((4, 6)), who="host_matmul")


def test_batch_checks():
    A, B = np.zeros((2, 4, 3)), np.zeros((2, 3, 5))
    assert ops.check_batches(A, B) == (2, 4, 5, 3)
    with _raises(ShapeError, "B of (2, 3, 5) is a batch of products: A must be 3-D [batch, M, K] "
                             "too, not (4, 3) (or B 2-D [K, N] for one product)"):
        ops.check_batches(A[0], B)
    with _raises(ShapeError, "B must be [batch, K, N] matching A (2, 4, 3): got (1, 3, 5)"):
        ops.check_batches(A, B[:1])
    with _raises(ShapeError, "B must be [batch, K, N] matching A (2, 4, 3): got (2, 2, 5)"):
        ops.check_batches(A, B[:, :2])


def test_device_checks():
    cpu, meta = torch.zeros(2, 2), torch.zeros(2, 2, device="meta")
    ops.check_same_device(cpu, cpu, cpu)
    ops.check_same_device(np.zeros(2), np.zeros(2))
    with _raises(TargetError, "A is on cpu, B on meta: put them on one device"):
        ops.check_same_device(cpu, meta)
    with _raises(TargetError, "A is on cpu, out on meta: put them on one device"):
        ops.check_same_device(cpu, cpu, meta)
    with _raises(TargetError, "the blocks are on cpu, B on meta: put them on one device"):
        ops.check_same_device(cpu, meta, names=("the blocks", "B"))
    with _raises(DTypeError, "A's blocks are on cpu, B's on meta: move both"):
        ops.check_same_device(cpu, meta, names=("A's blocks", "B's"), fix="move both", error=DTypeError)
    ops.check_same_device(cpu, meta, by=ops.is_cuda)     # neither on CUDA: one target
    ops.check_device_type(cpu, "A", "cpu", "")
    ops.check_device_type(np.zeros(2), "A", "cpu", "")
    with _raises(TargetError, "B is on meta; this artifact (x86_64-avx2) runs on the CPU"):
        ops.check_device_type(meta, "B", "cpu", "this artifact (x86_64-avx2) runs on the CPU")
    with _raises(TargetError, "A is on cpu; this artifact runs on CUDA tensors"):
        ops.check_device_type(cpu, "A", "cuda", "this artifact runs on CUDA tensors")


def test_layout_and_memory_checks():
    a = np.zeros((4, 3), np.float32)
    ops.check_contiguous(a, "A")
    with _raises(ShapeError, "A is not contiguous (row-major) with shape (4, 3); pass a contiguous "
                             "copy (numpy.ascontiguousarray(x))"):
        ops.check_contiguous(np.asfortranarray(a), "A")
    with _raises(ShapeError, "B is not contiguous (row-major) with shape (3, 4); pass a contiguous "
                             "copy (x.contiguous())"):
        ops.check_contiguous(torch.zeros(4, 3).t(), "B")
    with _raises(ShapeError, "out is not contiguous (row-major) with shape (3, 4); pass a "
                             "contiguous array (numpy.empty / torch.empty)"):
        ops.check_contiguous(a.T, "out", output=True)
    flat = torch.zeros(17, dtype=torch.uint8)
    base = flat.data_ptr() % 16
    aligned, off = flat[(16 - base) % 16:], flat[(17 - base) % 16:]
    ops.check_aligned(aligned, "A", 16, "TMA")
    with pytest.raises(ShapeError, match=r"A must be 16-byte aligned \(TMA\); got address 0x"):
        ops.check_aligned(off, "A", 16, "TMA")
    C = np.zeros(40, np.float32)
    ops.check_no_overlap(C[:20], (("A", C[20:]), ("B", None)))
    with _raises(ShapeError, "out overlaps B in memory; pass a separate output array"):
        ops.check_no_overlap(C[:20], (("A", C[20:]), ("B", C[10:30])))


def test_out_checks():
    A = np.zeros((2, 4, 3), np.float32)
    ops.check_out(np.zeros((2, 4, 5), np.float32), A, (2, 4, 5))
    cases = [
        (torch.zeros(2, 4, 5), DTypeError, "out must be a numpy array like A"),
        (np.zeros((4, 5), np.float32), ShapeError, "out has shape 4x5; the product is 2x4x5"),
        (np.zeros((2, 4, 5)), DTypeError, "out has dtype float64; A and B are float32"),
        (np.zeros((2, 5, 4), np.float32).transpose(0, 2, 1), ShapeError, "out is not contiguous"),
    ]
    for out, exc, text in cases:
        with _raises(exc, text):
            ops.check_out(out, A, (2, 4, 5))
    T = torch.zeros(4, 3)
    with _raises(DTypeError, "out must be a torch tensor like A"):
        ops.check_out(np.zeros((4, 5), np.float32), T, (4, 5))
    with _raises(TargetError, "out is on meta, A on cpu: pass an out on A's device"):
        ops.check_out(torch.zeros(4, 5, device="meta"), T, (4, 5))
    ops.check_out(torch.zeros(4, 5), T, (4, 5), summary=True)
    for out in (torch.zeros(5, 4), torch.zeros(4, 5, dtype=torch.float64),
                torch.zeros(4, 5, device="meta"), torch.zeros(5, 4).t(), np.zeros((4, 5), np.float32)):
        with _raises(ShapeError, "out must be a contiguous 4x5 float32 tensor on cpu"):
            ops.check_out(out, T, (4, 5), summary=True)


def test_no_torch_import_to_ask(monkeypatch):
    """The questions on numpy operands never need torch."""
    monkeypatch.setitem(sys.modules, "torch", None)
    a = np.zeros((2, 3), np.float32)
    assert ops.check_array(a, "A") == "numpy" and ops.check_matrices(a, a.T) == (2, 2, 3)
    ops.check_contiguous(a, "A")
    ops.check_out(np.zeros((2, 2), np.float32), a, (2, 2))
