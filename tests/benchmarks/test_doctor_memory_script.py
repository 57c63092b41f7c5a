"""``benchmarks/doctor_memory.py`` on small logs: each size measured in its own process."""

from __future__ import annotations

import json

from _scripts import load_script


def test_the_memory_benchmark_measures_the_doctor_on_its_simulated_logs(tmp_path):
    script = load_script("doctor_memory")
    log = tmp_path / "micro.jsonl"
    script.write_log(log, 2_000)
    lines = log.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0])["view"] == "micro-batch" and len(lines) == 2_001
    assert [json.loads(x)["step"] for x in lines[1:4]] == [1, 2, 3]
    result = script.measure(log)
    assert result["rc"] == 0 and result["levels_lines"] > 0 and result["peak_kib"] > 0
    page = script.render([{"lines": 2_000, "log_mib": 0.1, **result}],
                         {"peak_kib": result["peak_kib"] // 2}, " --lines 2000")
    assert "`python benchmarks/doctor_memory.py --lines 2000`" in page
    assert page.splitlines()[-1].startswith("| 2,000 | 0 |")
