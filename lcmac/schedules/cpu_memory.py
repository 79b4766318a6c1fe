"""The CPU templates' workspace buffers, backed by 2 MiB pages where they are large.

A large workspace (an LCMA's packed Ã and B̃, its H, a band of packed A) comes from apache-tvm's
workspace pool, which takes it from malloc, i.e. from fresh 4 KiB pages: the kernel gives
transparent huge pages only to memory that asked for them (``madvise``) unless THP is set to
``always``, and on the machines measured it is ``madvise``.  numpy asks for every array of
4 MiB or more, so the vendor GEMM it is timed against reads and writes 2 MiB pages while
lcmac's passes walked 4 KiB ones, each new page a TLB miss.  Each large workspace is
therefore advised right after it is allocated, before anything touches it (pages already
faulted in as 4 KiB stay so; the pool keeps and reuses them, advised, from call to call).
The LCMA passes gain most at the large shapes where they walk the most pages (docs/cpu.md,
bench/experiments/cpu.md).

The advice is a hint: where it is refused (another kernel, qemu-user) nothing changes.
"""
from __future__ import annotations

from math import prod

from lcmac.core.dtypes import ITEMSIZE

#: bytes per element, with the integer types the bf16 kernels pack into
_BYTES = {**ITEMSIZE, "uint16": 2, "int32": 4}

#: buffers this large or larger are advised (numpy's threshold for its own arrays)
HUGE_MIN_BYTES = 4 << 20

ADVISE_FN = "lcmac_advise_huge"
#: ``madvise(MADV_HUGEPAGE)`` (14 on Linux, x86-64 and AArch64 alike) over the whole 2 MiB
#: pages inside [p, p + n): the call wants page-aligned ranges and the pool's blocks are
#: 64-byte aligned.  Linked into the module through TVM's ``pragma_import_llvm`` like
#: cpu_combine's ``STREAM_LL``; ``madvise`` is libc's, resolved when the library is loaded.
ADVISE_LL = (
    "declare i32 @madvise(ptr, i64, i32)\n"
    f"define void @{ADVISE_FN}(ptr %p, i64 %n) {{\n"
    "entry:\n"
    "  %a = ptrtoint ptr %p to i64\n"
    "  %b = add i64 %a, 2097151\n"
    "  %lo = and i64 %b, -2097152\n"
    "  %end = add i64 %a, %n\n"
    "  %hi = and i64 %end, -2097152\n"
    "  %some = icmp ugt i64 %hi, %lo\n"
    "  br i1 %some, label %advise, label %done\n"
    "advise:\n"
    "  %len = sub i64 %hi, %lo\n"
    "  %q = inttoptr i64 %lo to ptr\n"
    "  %r = call i32 @madvise(ptr %q, i64 %len, i32 14)\n"
    "  br label %done\n"
    "done:\n"
    "  ret void\n}\n")


def emit_workspace(w, name: str, shape: tuple, dtype: str, align: int | None = None,
                   per_task: bool = False) -> None:
    """``name = T.alloc_buffer(shape, dtype)`` (``per_task``: ``T.decl_buffer``, the buffer a
    parallel task allocates for itself), advised onto huge pages when it has
    ``HUGE_MIN_BYTES`` or more."""
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    extra = f", align={align}" if align else ""
    w(f"{name} = T.{'decl' if per_task else 'alloc'}_buffer(({dims}), \"{dtype}\"{extra})")
    elems = prod(shape)
    nbytes = elems * _BYTES[dtype]
    if nbytes < HUGE_MIN_BYTES:
        return
    with w.block(f"with T.attr(0, \"pragma_import_llvm\", {ADVISE_LL!r}):"):
        # tvm_access_ptr with the whole extent: TVM shrinks a buffer to what it sees touched
        w(f"T.evaluate(T.call_extern(\"void\", \"{ADVISE_FN}\", T.tvm_access_ptr(T.type_annotation("
          f"\"{dtype}\"), {name}.data, 0, {elems}, 3), T.int64({nbytes})))")
