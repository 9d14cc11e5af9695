"""One definition of a round's generation counts: `rounds.n_proposed = n_accepted + n_rejected`,
where rejected means a candidate refused (validation or the probe); a generator that crashes or
times out is an error, counted apart. The `rounds` row and the `generator_yield` view agree."""

from __future__ import annotations

from pathlib import Path

from generators import run_generators
from sentinel.record import RoundRecord
from task_store import Store
from tests.test_generators import Garbage, Junk, MyGen, MyGenConfig, Raising, context, nothing_known


def test_round_counts_agree_with_generator_yield(tmp_path: Path) -> None:
    generators = [Raising(), Garbage(), Junk(), MyGen(MyGenConfig(type="mine"))]
    tasks, rejections, stats = run_generators(
        generators, context([], []), known_task_ids=nothing_known)
    assert any(r.reason == "generator_error" for r in rejections)  # the case that split them
    record = RoundRecord(round=1, tasks={t.task_id: t for t in tasks}, rejections=rejections,
                         generated=stats, metrics={"heldout_success": 0.5})
    row = record.row()
    assert row["n_proposed"] == row["n_accepted"] + row["n_rejected"] == 5
    assert row["n_rejected"] == 2  # junk's two non-candidates; not the two generator errors
    assert row["metrics"]["generator_errors"] == 2
    assert "2 generator errors" in record.summary(row)

    store = Store.create(tmp_path / "sentinel.duckdb", run_id="run-counts", config={})
    store.record_round(1, row, tasks=[t.to_row() for t in tasks],
                       rejections=[x.to_row() for x in rejections])
    _, (view,) = store.query("SELECT sum(proposed), sum(accepted), sum(rejected), sum(errors) "
                             "FROM generator_yield")
    _, (rounds,) = store.query("SELECT n_proposed, n_accepted, n_rejected, "
                               "metrics.generator_errors::INT FROM rounds")
    assert view == rounds == (5, 3, 2, 2)
