"""The real-target regions of docs/dflash.md that the estimate scripts write hold what their
``--render`` writes around the tables they hold (``benchmarks/memory_estimate.py``,
``benchmarks/time_estimate.py``)."""

from __future__ import annotations

from _scripts import load_script


def test_the_stage_memory_region_is_what_render_writes():
    mem = load_script("memory_estimate")
    body, about, table = mem.saved_region("dflash-stage-memory")
    assert body == "\n" + "\n".join(mem.stage_docs(about, table)) + "\n", \
        "run python benchmarks/memory_estimate.py --render"
    assert len(table) == 2 + sum(len(shapes) for shapes in mem.STAGE_SHAPES.values())


def test_the_time_regions_are_what_render_writes():
    script = load_script("time_estimate")
    mem = script.mem
    body, about, lines = mem.saved_region("dflash-regenerate-time")
    load = float(script.LOAD.search(body)[1])
    assert body == "\n" + "\n".join(script.regenerate_docs(about, load, lines)) + "\n", \
        "run python benchmarks/time_estimate.py --render"
    assert len(lines) == 2 + len(script.REGEN_SHAPES)
    body, about, lines = mem.saved_region("dflash-run-time")
    assert body == "\n" + "\n".join(script.run_docs(about, lines)) + "\n", \
        "run python benchmarks/time_estimate.py --render"
    assert len(lines) == 2 + len(script.SHAPES)
