"""Shape rules and how a shape is cut into bucket pieces (pure Python)."""
import pytest

from lcmac.core.errors import ShapeError
from lcmac.spec.shape_rules import (
    ShapeRule, bucket_shapes, check_ladder, parse_rule, row_pieces, tiles)


@pytest.mark.parametrize("text, rule", [
    ("4096x4096x4096", ShapeRule("exact", 4096, 4096, 4096)),
    ("exact:3x5x7", ShapeRule("exact", 3, 5, 7)),
    ((3, 5, 7), ShapeRule("exact", 3, 5, 7)),
    ("?x4096x1024", ShapeRule("rows", None, 4096, 1024)),
    ("rows:?x4096x1024", ShapeRule("rows", None, 4096, 1024)),
    ("?x?x?", ShapeRule("any")), ("any", ShapeRule("any")), ("any:?x?x?", ShapeRule("any")),
    (None, ShapeRule("any")),
])
def test_parse_rule(text, rule):
    assert parse_rule(text) == rule
    assert parse_rule(rule.text) == rule           # the canonical text reads back


@pytest.mark.parametrize("bad", ["4096x?x4096", "?x?x4096", "?x0x3", "3x5", "fast", "0x1x1"])
def test_bad_rules_say_what_a_rule_is(bad):
    with pytest.raises(ShapeError, match="shape rule|must be"):
        parse_rule(bad)


def test_admits():
    r = parse_rule("?x64x32")
    assert r.admits(1, 64, 32) and r.admits(10**6, 64, 32) and not r.admits(5, 32, 64)
    assert parse_rule(None).admits(3, 5, 7) and not parse_rule("3x5x7").admits(3, 5, 8)


def test_row_pieces_cover_the_rows_largest_bucket_first():
    ps = row_pieces(5000, (256, 4096, 1024))                 # the ladder is sorted here
    assert [(p.start, p.rows, p.bucket) for p in ps] == [
        (0, 4096, 4096), (4096, 256, 256), (4352, 256, 256), (4608, 256, 256), (4864, 136, 256)]
    assert [p.padded for p in ps] == [False] * 4 + [True]
    for M in (1, 255, 256, 257, 1023, 4096, 9999):
        ps = row_pieces(M, (4096, 1024, 256))
        assert sum(p.rows for p in ps) == M
        assert all(a.start + a.rows == b.start for a, b in zip(ps, ps[1:]))
        assert sum(p.padded for p in ps) <= 1 and all(p.rows == p.bucket or p is ps[-1] for p in ps)


def test_tiles_and_bucket_shapes():
    assert tiles(2500, 1024) == [(0, 1024), (1024, 1024), (2048, 452)]
    assert tiles(5, 8) == [(0, 5)]
    assert bucket_shapes(parse_rule("?x64x32"), (512, 128)) == [(512, 64, 32), (128, 64, 32)]
    assert bucket_shapes(parse_rule(None), (512,), (256, 128)) == [(512, 256, 128)]
    with pytest.raises(ShapeError):
        check_ladder([])
    with pytest.raises(ShapeError):
        check_ladder([256, 0])
