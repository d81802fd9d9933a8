"""A process's packed figures (process_keys.figures): compressed when written, and those an earlier version wrote
plain still read."""

from __future__ import annotations

import msgspec

from jaxcache.service.ingestion import figures


def _figures(n: int) -> figures.Figures:
    rows = [(f"jit_f{i % 7}-{i:064x}", f"jit_f{i % 7}", "hit", i, 0, 0, None, None, 0.01 * i, 1.5, 0.0, None,
             1000.0 + i, 2000.0 + i) for i in range(n)]
    return figures.of_rows(rows)


def test_figures_are_stored_compressed_and_read_back():
    fig = _figures(200)
    plain = msgspec.msgpack.encode(fig)
    packed = figures.encode(fig)
    assert len(packed) < len(plain) / 2
    assert figures.decode(packed) == fig


def test_figures_stored_plain_by_an_earlier_version_still_read():
    for n in (0, 1, 200):
        fig = _figures(n)
        assert figures.decode(msgspec.msgpack.encode(fig)) == fig
