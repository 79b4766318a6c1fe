"""lcmac.optimize: each layer's crossover from the planner over a grid of row counts, torch's
own linear under it (eager and compiled), a forced algorithm at every row count, the report
(table, JSON) and ``lcmac export`` of exactly the kernels it names, warm-up compiling before
the first forward, PyTorch's fused encoder path kept from bypassing swapped layers, and a tiny
transformers Llama through it.  Kernels are stand-ins (no compiles) except in the one test
marked slow, which builds the strassen 256x45x53 kernel tests/test_ops.py builds too."""
import copy
import json
import threading

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from lcmac.api import call_args, export as export_api, matmul as ops  # noqa: E402
from lcmac.artifact import cache  # noqa: E402
from lcmac.artifact.build import resolve_algorithm  # noqa: E402
from lcmac.cli.main import main  # noqa: E402
from lcmac.core.errors import LcmacError, ShapeError  # noqa: E402
from lcmac.ir.executor import run_unfused  # noqa: E402
from lcmac.policy import Plan  # noqa: E402
from lcmac.spec.shape_rules import bucket_shapes  # noqa: E402
from lcmac.torch import crossover as xo  # noqa: E402
from lcmac.torch.nn import Linear, optimize, warm_up  # noqa: E402

M, N, K = 66, 45, 53


class _Kernel:
    """Stands in for a compiled kernel: runs ``algo``'s scheme in numpy float32 (the reference
    executor, so an LCMA rounds as one), counting calls."""

    def __init__(self, algo="strassen", calls=None):
        self.alg = resolve_algorithm(algo)[0]
        self.calls = [] if calls is None else calls

    def __call__(self, A, B, out=None):
        self.calls.append(tuple(A.shape))
        C = torch.from_numpy(run_unfused(self.alg, A.numpy(), B.numpy())).to(A.dtype)
        return C if out is None else out.copy_(C)


@pytest.fixture
def stand_in(monkeypatch):
    """Every kernel lcmac asks for is a stand-in; the list of calls they made."""
    calls = []
    monkeypatch.setattr(ops, "kernel", lambda algo, *rest: _Kernel(algo, calls))
    return calls


def _planner(wins):
    """A stand-in for lcmac.ops.plan: "winograd" where ``wins(M)``, else the vendor GEMM."""
    def plan(m, n, k, dtype="float32", *, algo="auto", max_error=None, target=None, **kw):
        runs = "winograd" if wins(m) else "vendor"
        return Plan((m, n, k), dtype, target or "x86_64", algo, runs, runs,
                    1.0 + m / 1e5 if runs != "vendor" else None, 1.5, f"{runs} at {m}")
    return plan


def test_row_grid_is_powers_of_two_and_midpoints():
    assert xo.row_grid(32768, 256) == (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                                       6144, 8192, 12288, 16384, 24576, 32768)
    assert xo.row_grid(10) == (1, 2, 3, 4, 6, 8, 10)
    assert xo.row_grid(100, 256) == (100,)               # the bound is always searched


def test_crossover_is_the_first_row_count_an_lcmac_kernel_wins(monkeypatch):
    # wins from 1024 rows, not at 3072 (the decision need not be monotone), again above
    monkeypatch.setattr(ops, "plan", _planner(lambda m: m >= 1024 and m != 3072))
    model = nn.Sequential(nn.Linear(300, 400), nn.Linear(400, 8))
    rep = optimize(model, max_rows=8192)
    assert rep.grid == xo.row_grid(8192, xo.smallest_bucket(ops.target_for("cpu")))
    [s] = rep.swapped
    assert (s.name, s.crossover, s.rows, s.algorithm) == ("0", 1024, 1024, "winograd")
    assert model[0].crossover == 1024 and "crossover=1024" in repr(model[0])
    assert [d.rows for d in s.decisions] == [1024, 1536, 2048, 3072, 4096, 6144, 8192]
    assert [d.runs for d in s.decisions][3] == "vendor"
    assert {k[3][0] for k in s.kernels} == {r for r in rep.grid if r >= 1024 and r != 3072}
    text = str(rep)
    assert "from rows" in text and "1024" in text and "winograd 1.082x" in text   # at 8192 rows

    monkeypatch.setattr(ops, "plan", _planner(lambda m: False))
    rep = optimize(nn.Sequential(nn.Linear(300, 400)), max_rows=2048)
    [k] = rep.skipped
    assert k.reason == "no win" and "256-2048 rows" in k.why and not rep.changed


def test_rows_decides_at_exactly_those_row_counts(monkeypatch):
    monkeypatch.setattr(ops, "plan", _planner(lambda m: m >= 2000))
    rep = optimize(nn.Sequential(nn.Linear(300, 400), nn.Linear(400, 300)), rows=[512, 4096])
    assert rep.grid == (512, 4096) and [s.crossover for s in rep.swapped] == [4096, 4096]
    assert optimize(nn.Sequential(nn.Linear(300, 400)), rows=512).skipped[0].reason == "no win"
    with pytest.raises(LcmacError, match="not both"):
        optimize(nn.Sequential(nn.Linear(300, 400)), rows=512, max_rows=1024)
    with pytest.raises(ShapeError, match="max_rows"):
        optimize(nn.Sequential(nn.Linear(300, 400)), max_rows=0)
    with pytest.raises(ShapeError, match="warmup"):
        optimize(nn.Sequential(nn.Linear(300, 400)), warmup=[-1])


def test_under_its_crossover_a_layer_runs_torch_linear_with_no_planning(monkeypatch, stand_in):
    torch.manual_seed(0)
    ref = nn.Linear(K, N)
    lin = Linear.from_linear(ref, algo="strassen")
    lin.crossover = 8

    def no_planning(*a, **kw):
        raise AssertionError("planned under the crossover")
    monkeypatch.setattr(ops, "plan", no_planning)
    x = torch.randn(2, 3, K)                              # 6 rows < 8
    with torch.no_grad():
        assert torch.equal(lin(x), F.linear(x, ref.weight, ref.bias))
    assert not stand_in
    monkeypatch.undo()
    monkeypatch.setattr(ops, "kernel", lambda algo, *rest: _Kernel(algo, stand_in))
    with torch.no_grad():
        big = torch.randn(4, 3, K)                        # 12 rows: lcmac
        assert torch.allclose(lin(big), ref(big), atol=1e-5) and stand_in

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    compiled = torch.compile(lin, backend=backend, fullgraph=True)
    with torch.no_grad():
        for rows in (6, 12):
            x = torch.randn(rows, K)
            assert torch.allclose(compiled(x), ref(x), atol=1e-5)
    uses_lcmac = [any("lcmac" in str(n.target) for n in g.graph.nodes if n.op == "call_function")
                  for g in graphs]
    assert uses_lcmac[0] is False and uses_lcmac[-1] is True


def test_forced_algorithm_runs_at_every_row_count(stand_in):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(K, N), nn.ReLU(), nn.Linear(N, 8))
    ref = copy.deepcopy(model)
    rep = optimize(model, algo="strassen", min_size=32)
    [s] = rep.swapped
    assert s.crossover == 0 and model[0].crossover == 0 and "all" in str(rep)
    with torch.no_grad():
        x = torch.randn(1, K)                             # one row (decode)
        assert torch.allclose(model(x), ref(x), atol=1e-5)
    assert stand_in == [(256, K)]                         # padded into the smallest bucket


def test_report_saves_json_and_export_builds_exactly_its_kernels(tmp_path, monkeypatch, capsys):
    rep = optimize(nn.Sequential(nn.Linear(K, N), nn.Linear(N, 40)), algo="strassen",
                   min_size=32, max_rows=600)
    path = rep.save(tmp_path / "report.json")
    d = json.loads(path.read_text())
    assert d["schema"] == export_api.REPORT_SCHEMA and d["rows"] == 600
    assert [s["crossover"] for s in d["swapped"]] == [0, 0]
    named = {(k["algorithm"], tuple(k["shape"])) for s in d["swapped"] for k in s["kernels"]}
    assert named == {("strassen", (b, n, k)) for b in (512, 256) for n, k in ((N, K), (40, N))}

    built = {}

    def build_specs(specs, t, dtype, *, out_dir, progress=None, config=None, extra=None):
        built.update(specs=specs, target=t.name, dtype=dtype, config=config)
        return tmp_path / "bundle.json"
    monkeypatch.setattr(export_api, "build_specs", build_specs)
    report = export_api.report_from_json(path)
    assert export_api.export_report(report, tmp_path) == tmp_path / "bundle.json"
    got = {(s.algorithm, shp) for s in built["specs"] for shp in bucket_shapes(s.rule, s.rows)}
    assert got == named and built["dtype"] == "float32" and built["config"] is None
    assert (tmp_path / "lcmac.h").is_file()
    with pytest.raises(LcmacError, match="of float64"):
        export_api.export_report(report, tmp_path, dtype="float64")
    (tmp_path / "shapes.json").write_text('["64x64x64"]')
    assert export_api.report_from_json(tmp_path / "shapes.json") is None
    assert main(["export", "--from", str(path), "96x80x64", "-o", str(tmp_path / "b")]) != 0
    assert "builds the kernels it names" in capsys.readouterr().err


def test_warm_up_compiles_in_parallel_so_the_first_forward_compiles_nothing(monkeypatch):
    compiled = []
    both = threading.Barrier(2, timeout=30)             # two compiles must run at once

    class Hit:
        manifest = "stand-in"

    def cached_build(algo, target, dtype, shape, **kw):
        if len(compiled) < 2:
            compiled.append((algo, tuple(shape)))
            both.wait()
        else:
            compiled.append((algo, tuple(shape)))
        return Hit()
    monkeypatch.setattr(ops, "_kernels", call_args.LoadedKernels())
    monkeypatch.setattr(call_args, "cached_build", cached_build)
    monkeypatch.setattr(call_args, "load", lambda manifest: _Kernel("strassen"))
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(K, N))
    ref = copy.deepcopy(model)
    rep = optimize(model, algo="strassen", min_size=32, warmup=[M, 600], workers=2)
    assert sorted(compiled) == [("strassen", (256, N, K)), ("strassen", (512, N, K))]
    assert sorted(k[3] for k in rep.warmed) == [(256, N, K), (512, N, K)]
    assert "warmed up for 66, 600 rows: 2 kernels" in str(rep)
    assert {k[3] for k in rep.swapped[0].kernels} == {(256, N, K), (512, N, K)}
    compiled.clear()
    with torch.no_grad():
        for rows in (M, 600):
            x = torch.randn(rows, K)
            assert torch.allclose(model(x), ref(x), atol=1e-4)
    assert compiled == []                                # every kernel was loaded before
    assert warm_up(model, [M]) == [("strassen", ops.target_for("cpu"), "float32", (256, N, K))]
    assert compiled == []


def test_encoder_fast_path_does_not_bypass_swapped_layers(stand_in):
    torch.manual_seed(3)
    layer = nn.TransformerEncoderLayer(64, 2, 128, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    ref = copy.deepcopy(enc)
    rep = optimize(enc, algo="strassen", min_size=16)
    assert sorted(s.name for s in rep.swapped) == [f"layers.{i}.linear{j}" for i in (0, 1)
                                                   for j in (1, 2)]
    assert rep.fast_path_off == ["layers.0", "layers.1"]
    assert {k.name: k.reason for k in rep.skipped} == {
        f"layers.{i}.self_attn.{p}": "not effective" for i in (0, 1)
        for p in ("in_proj_weight", "out_proj")}
    assert "fused encoder path turned off" in str(rep)
    x = torch.randn(2, 5, 64)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():                          # eval + no_grad: where the fast path runs
        assert torch.allclose(enc(x), ref(x), atol=1e-5)
        assert len(stand_in) == 4                  # each swapped layer ran through lcmac
        y, r = enc(x, src_key_padding_mask=pad), ref(x, src_key_padding_mask=pad)
    assert len(stand_in) == 8
    assert torch.allclose(y[0], r[0], atol=1e-5) and torch.allclose(y[1, :3], r[1, :3], atol=1e-5)


def test_tiny_llama_matches_the_plain_model(stand_in):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(4)
    plain = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 7))
    with torch.no_grad():
        want = plain(ids).logits
        exact = copy.deepcopy(plain).double()(ids).logits

    model = copy.deepcopy(plain)
    rep = optimize(model, algo="strassen", min_size=16)
    assert len(rep.swapped) == 15 and not rep.skipped     # 7 per layer and lm_head
    with torch.no_grad():
        got = model(ids).logits
    assert len(stand_in) == 15                            # each swapped layer ran once
    # The stand-in runs Strassen in float32, so the logits differ from the plain model's only
    # by rounding: a float32 product of length ≤ 160 is off by ~1e-7 relative, Strassen by a
    # small multiple of that (the report predicts ≤ 1.6×).  Against the float64 model its error
    # stays within float32's default error budget (4× the plain model's); a wiring mistake (a
    # lost bias, a transposed weight, rows mixed up) changes the logits by O(1).
    scale = want.abs().max()
    assert (got - want).abs().max() <= 1e-5 * scale
    assert (got.double() - exact).abs().max() <= 4 * (want.double() - exact).abs().max()

    model = copy.deepcopy(plain)
    rep = optimize(model, min_size=16, max_rows=1024)     # "auto": nothing wins at these sizes
    assert not rep.changed and {k.reason for k in rep.skipped} == {"no win"}
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_warm_up_with_a_real_kernel_leaves_the_cache_untouched_by_forward(monkeypatch):
    ops.release_kernels()
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(K, N))
    ref = copy.deepcopy(model)
    rep = optimize(model, algo="strassen", min_size=32, warmup=[M])
    assert [k[3] for k in rep.warmed] == [(256, N, K)]
    before = [e.key for e in cache.entries()]
    asked = []
    real = call_args.cached_build
    monkeypatch.setattr(call_args, "cached_build",
                        lambda *a, **kw: asked.append(a) or real(*a, **kw))
    with torch.no_grad():
        x = torch.randn(M, K)
        assert torch.allclose(model(x), ref(x), atol=1e-4)
    assert asked == [] and [e.key for e in cache.entries()] == before
