"""The CUDA any-shape bundle (format ``lcmac-bundle/4``): one kernel of run-time M, N and K
per algorithm (``CudaConfig.dynamic_shape``).  The rule and index without a compiler, how the
runtime feeds the kernel (on the operands, or on zero-padded copies) with a stand-in kernel,
and the CLI's build without a GPU (slow); the kernels' results on a GPU are
tests/schedules/cuda/test_cuda_dynamic_shape.py's."""
import json

import pytest

from lcmac.artifact.bundle import INDEX, SHAPE_FORMAT, FORMAT, plan_rule, read_bundle
from lcmac.core.errors import ArtifactError, ShapeError
from lcmac.runtime.bundle import load_bundle
from lcmac.spec.shape_rules import ANY_MAX_SHAPE
from tests.schedules.cuda.test_cuda_codegen import needs_nvcc, needs_tilelang

torch = pytest.importorskip("torch")
MAX = (64, 64, 64)


def test_any_rule_on_cuda_is_one_kernel_of_run_time_shape():
    spec = plan_rule(None, "strassen", "cuda", dynamic_shape=MAX)
    assert spec.shapes() == [MAX] and spec.to_dict()["dynamic_shape"] == list(MAX)
    assert spec.rows == () and spec.tile is None
    # without it the any rule keeps its copied tiles; rows and exact rules ignore it
    assert plan_rule(None, "strassen", "cuda").tile is not None
    assert plan_rule("?x64x64", "strassen", "cuda", dynamic_shape=MAX).dynamic_shape is None
    with pytest.raises(ArtifactError, match="CUDA targets"):
        plan_rule(None, "strassen", "cpu", dynamic_shape=MAX)
    with pytest.raises(ArtifactError, match="three positive sizes"):
        plan_rule(None, "strassen", "cuda", dynamic_shape=(64, 0, 64))
    assert all(d >= 20480 for d in ANY_MAX_SHAPE["cuda"])


def test_configs_without_the_form_keep_copied_tiles():
    from lcmac.artifact.bundle import _shape_form_why
    from lcmac.artifact.build import resolve_target
    t = resolve_target("cuda-sm90a")
    for algo, dtype in (("strassen", "bf16"), ("gemm", "float16"), ("winograd^2", "bf16")):
        assert _shape_form_why(algo, 1, t, dtype, None) is None
    for dtype, config, why in (("float64", None, "cp.async"), ("float32", {"operands": "fp16x2"}, "fp16x2"),
                               ("bf16", '{"fused": true, "split_group": true}', "persistent fused forms")):
        assert why in _shape_form_why("strassen", 1, t, dtype, config)


def _index(tmp_path, fmt=SHAPE_FORMAT, rule="any:?x?x?"):
    (tmp_path / "k.json").write_text("{}")
    (tmp_path / INDEX).write_text(json.dumps({
        "format": fmt, "target": {"name": "cuda-sm90a", "family": "cuda", "backend": "tilelang"},
        "dtype": "float32",
        "kernels": [{"name": "k", "manifest": "k.json", "config": {"dynamic_shape": True},
                     "shape": dict(zip("MNK", MAX))}],
        "rules": [{"rule": rule, "algorithm": "strassen", "rows": [], "tile": None, "kernels": ["k"],
                   "dynamic_shape": list(MAX)}]}))
    return tmp_path


def test_the_format_names_run_time_shape_rules(tmp_path):
    (tmp_path / "new").mkdir()
    b = read_bundle(_index(tmp_path / "new"))
    assert b.rules[0].dynamic_shape == MAX and b.rules[0].shapes() == [MAX]
    for fmt, rule in ((FORMAT, "any:?x?x?"), (SHAPE_FORMAT, "rows:?x64x64")):
        d = tmp_path / f"{fmt[-1]}{rule[0]}"
        d.mkdir()
        with pytest.raises(ArtifactError, match="run-time-shape kernel"):
            read_bundle(_index(d, fmt, rule))


class ShapeKernel:
    """Stands in for ``CudaShapeMatmul``: takes contiguous operands with N and K multiples of
    8 up to 64, as the entry point does, and records each call."""
    max_rows, max_cols, max_depth, vec = MAX + (8,)

    def __init__(self):
        self.calls = []

    def shape_why(self, M, N, K):
        if N > self.max_cols or K > self.max_depth:
            return "too large"
        return "N and K must be multiples of 8" if N % 8 or K % 8 else None

    def __call__(self, A, B, out=None):
        assert self.shape_why(A.shape[0], B.shape[1], A.shape[1]) is None
        assert A.is_contiguous() and B.is_contiguous() and (out is None or out.is_contiguous())
        self.calls.append((tuple(A.shape), tuple(B.shape)))
        C = A @ B
        return C if out is None else out.copy_(C)


def test_runtime_feeds_the_kernel_the_operands_or_padded_copies(tmp_path):
    kernel = ShapeKernel()
    f = load_bundle(_index(tmp_path), lambda path: kernel)
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(40, 16, generator=g), torch.randn(16, 24, generator=g)
    assert torch.allclose(f(A, B), A @ B) and kernel.calls == [((40, 16), (16, 24))]
    # N = 5, K = 7: zero-padded to 8; C's columns past N (a wider buffer's) are left alone
    A, B = torch.randn(3, 7, generator=g), torch.randn(7, 5, generator=g)
    wide = torch.full((3, 13), float("nan"))
    assert f(A, B, out=wide[:, :5]) is not None and torch.isnan(wide[:, 5:]).all()
    assert torch.allclose(wide[:, :5], A @ B, atol=1e-6) and kernel.calls[-1] == ((3, 8), (8, 8))
    C = f(A, B)
    assert C.shape == (3, 5) and C.is_contiguous() and torch.allclose(C, A @ B, atol=1e-6)
    # a transposed (non-contiguous) operand is copied, not refused
    Bt = torch.randn(24, 16, generator=g).t()
    A = torch.randn(9, 16, generator=g)
    assert torch.allclose(f(A, Bt), A @ Bt, atol=1e-5)
    with pytest.raises(ShapeError, match=r"8x8x72 \(MxNxK\): the bundle .* takes N up to 64 and K up to 64"):
        f(torch.zeros(8, 72), torch.zeros(72, 8))


@needs_tilelang
@needs_nvcc
def test_cli_builds_the_cuda_any_shape_bundle_as_one_kernel(tmp_path):
    from lcmac.cli.main import main
    # the default form of a CUDA any-shape bundle (no --dynamic-shape needed)
    assert main(["build", "--algo", "gemm", "--target", "cuda-sm90a", "--dtype", "bf16",
                 "-o", str(tmp_path)]) == 0
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["format"] == SHAPE_FORMAT
    [rule] = index["rules"]
    assert rule["rule"] == "any:?x?x?" and rule["dynamic_shape"] == list(ANY_MAX_SHAPE["cuda"])
    [k] = index["kernels"]
    assert k["config"]["dynamic_shape"] and [k["shape"][d] for d in "MNK"] == list(ANY_MAX_SHAPE["cuda"])
    assert read_bundle(tmp_path).rules[0].kernels == (k["name"],)


def test_dynamic_shape_is_an_any_shape_cuda_option(tmp_path, capsys):
    from lcmac.cli.main import main
    for extra in (["--shape", "64x64x64"], ["--shape", "?x64x64"], ["--tile", "64x64"], ["--target", "x86_64-avx512"]):
        args = ["build", "--algo", "gemm", "--target", "cuda-sm90a", "--dtype", "bf16", "--dynamic-shape",
                "-o", str(tmp_path / "out")] + extra
        assert main(args) == 2
        assert "--dynamic-shape builds the any-shape rule" in capsys.readouterr().err
        args[args.index("--dynamic-shape")] = "--copied-tiles"
        assert main(args) == 2
        assert "--copied-tiles builds the any-shape rule" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("asked, rows, form", [(None, None, "shape"), (True, None, "shape"),
                                               (False, None, "tiles"), (None, (2048,), "tiles")])
def test_cuda_any_shape_bundles_take_the_run_time_shape_unless_tiles_are_asked(monkeypatch, asked, rows, form):
    import lcmac.artifact.bundle as bundle
    planned = []
    monkeypatch.setattr(bundle, "build_specs", lambda specs, *a, **kw: planned.extend(specs))
    bundle.build_bundle("strassen", "cuda-sm90a", "bfloat16", [None], rows=rows, dynamic_shape=asked)
    [spec] = planned
    assert (spec.dynamic_shape is not None) == (form == "shape")
    # a config without the run-time form (2-CTA clusters) keeps the tiles either way
    planned.clear()
    bundle.build_bundle("strassen", "cuda-sm90a", "bfloat16", [None], dynamic_shape=asked,
                        config={"cluster": 2})
    assert planned[0].dynamic_shape is None
