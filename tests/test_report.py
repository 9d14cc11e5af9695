"""`sentinel report` and `sentinel status --watch`, on real DuckDB stores: a synthetic one built in
bulk SQL (any size, in a second or two) and, for the browser check, a real run of the loop with
the tiny policy, opened in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sentinel.report import MAX_COLUMNS, MAX_POINTS, build_report, chat_turns
from task_store import Store

EVIL = "<script>alert('pwned')</script>"
EVIL_SKILL = "<img src=x onerror=alert(1)>"
MODES = ["wrong_answer", "format_error", "premature_answer", "no_answer", "loop"]


def synth_store(path: Path, rounds: int, *, train: int = 32, seeds: int = 200, evals: int = 16,
                generated: int = 4) -> Store:
    """A store with `rounds` rounds (0 = SFT, no train rollouts), written by bulk
    `INSERT ... SELECT` from `range()`: success rises with the round, failures get one of `MODES`,
    the first `generated` failures of each round each give a generated task (trained on in the
    next round), every trajectory's messages hold `EVIL` and one skill is `EVIL_SKILL`."""
    store = Store.create(path, run_id="run-synth", config={"rounds": rounds, "note": EVIL})
    with store.connect(read_only=False) as con:
        con.execute("BEGIN")
        con.execute(f"""
            INSERT INTO rounds (round, started_at, finished_at, n_train_rollouts, train_success,
                train_reward, heldout_success, heldout_greedy, n_proposed, n_accepted, n_rejected,
                metrics, timings)
            SELECT r, TIMESTAMP '2026-01-01' + to_seconds(r * 60),
                   TIMESTAMP '2026-01-01' + to_seconds(r * 60 + 50),
                   CASE WHEN r = 0 THEN 0 ELSE {train} END,
                   CASE WHEN r = 0 THEN NULL ELSE 0.3 + 0.5 * r / {rounds} END, 0.5,
                   0.25 + 0.5 * r / {rounds}, 0.3 + 0.5 * r / {rounds}, {generated + 2},
                   {generated}, 2,
                   CASE WHEN r = 0 THEN json_object('sft/loss', 0.5, 'sft/grad_norm', 1.0)
                        ELSE json_object('loss', 0.01 * sin(r), 'kl', 0.001 * r,
                             'clip_ratio', 0.02, 'entropy', 0.5 - 0.3 * r / {rounds},
                             'grad_norm', 0.5 + 0.1 * cos(r), 'reward', 0.5) END,
                   CASE WHEN r = 0 THEN json_object('sft', 30.0, 'eval', 4.0)
                        ELSE json_object('rollout', 20.0 + r % 5, 'train', 15.0, 'eval', 4.0,
                             'analyze', 0.1, 'generate', 0.2, 'store', 0.3) END
            FROM range({rounds}) t(r)""")
        ops = "['add', 'sub', 'mul', 'div']"
        con.execute(f"""
            INSERT INTO tasks (task_id, family, spec, prompt, answer, skills, difficulty, origin,
                created_round)
            SELECT 'seed-' || i, 'arith', json_object('i', i),
                   json_array(json_object('role', 'user', 'content', 'Compute ' || i || '+1')),
                   (i + 1)::VARCHAR,
                   CASE WHEN i = 0 THEN ['{EVIL_SKILL}']
                        ELSE ['op:' || {ops}[i % 4 + 1], 'steps:' || (i % 3 + 1)] END,
                   0.5, 'seed', 0
            FROM range({seeds}) t(i)
            UNION ALL
            SELECT 'eval-' || i, 'arith', json_object('e', i),
                   json_array(json_object('role', 'user', 'content', 'Compute ' || i || '*2')),
                   (i * 2)::VARCHAR, ['op:' || {ops}[i % 4 + 1], 'steps:' || (i % 3 + 1)],
                   0.5, 'eval', 0
            FROM range({evals}) t(i)""")
        messages = json.dumps([
            {"role": "user", "content": "Compute 1+2"},
            {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": '
                                             '{"expression": "1+2"}}</tool_call>'},
            {"role": "tool", "content": EVIL},
            {"role": "assistant", "content": "<answer>4</answer>"},
        ])
        con.execute(f"""
            INSERT INTO trajectories (traj_id, round, split, task_id, group_id, sample_idx,
                messages, token_ids, loss_mask, prompt_len, n_tokens, n_policy_tokens, n_turns,
                finish_reason, answer, reward, reward_terms, success)
            SELECT 'tr-' || r || '-' || k, r, 'train',
                   CASE WHEN k % 2 = 0 OR r < 2 THEN 'seed-' || ((r * {train} + k) % {seeds})
                        ELSE 'gen-' || (r - 1) || '-' || (k % {generated} + 1) END,
                   'g-' || r || '-' || k // 4, k % 4, ?, [1, 2, 3], [0, 1, 1], 1, 3, 2, 2,
                   'answer', '4', 0.5, '{{"outcome": 0.0}}',
                   hash(r * 7919 + k) % 100 < 30 + 50 * r / {rounds}
            FROM range(1, {rounds}) a(r), range({train}) b(k)""", [messages])
        con.execute(f"""
            INSERT INTO failures (failure_id, traj_id, task_id, round, mode, first_error_step,
                evidence, skills, family)
            SELECT 'fail-' || traj_id, traj_id, task_id, round,
                   {MODES}[(hash(traj_id) % {len(MODES)})::BIGINT + 1], 1, 'evidence ' || ?,
                   [], 'arith'
            FROM trajectories WHERE NOT success""", [EVIL])
        con.execute(f"""
            INSERT INTO tasks (task_id, family, spec, prompt, answer, skills, difficulty, origin,
                created_round, parent_task_id, failure_ids, generator)
            SELECT 'gen-' || round || '-' || rn, 'arith', json_object('g', failure_id),
                   json_array(json_object('role', 'user', 'content', 'Compute ' || rn || '-1')),
                   (rn - 1)::VARCHAR, ['op:sub', 'steps:1'], 0.5, 'generated', round, task_id,
                   [failure_id], CASE WHEN rn % 2 = 0 THEN 'mutate' ELSE 'decompose' END
            FROM (SELECT *, row_number() OVER (PARTITION BY round ORDER BY failure_id) AS rn
                  FROM failures)
            WHERE rn <= {generated}""")
        con.execute("""
            INSERT INTO rejections (rejection_id, round, generator, family, spec, reason, detail)
            SELECT 'rej-' || r || '-' || j, r, CASE WHEN j = 0 THEN 'mutate' ELSE 'decompose' END,
                   'arith', '{}', ['duplicate', 'answer_mismatch', 'unsolvable'][(r + j) % 3 + 1],
                   'detail'
            FROM range(1, ?) a(r), range(2) b(j)""", [rounds])
        con.execute(f"""
            INSERT INTO evals (round, task_id, k, successes, success_rate, greedy_success)
            SELECT r, 'eval-' || i, 4, s, s / 4, s >= 2
            FROM (SELECT r, i, least(4, (hash(r * 31 + i) % 3) + (4 * r) // {rounds}) AS s
                  FROM range({rounds}) a(r), range({evals}) b(i))""")
        con.execute("COMMIT")
    return store


@pytest.fixture(scope="module")
def small_report(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("report")
    synth_store(out / "sentinel.duckdb", rounds=12)
    return build_report(out).read_text()


def test_report_has_every_section_and_plot(small_report):
    for anchor in ("success", "failures", "skills", "generators", "lineage", "timing", "config"):
        assert f'id="{anchor}"' in small_report
    for plot in ("plot-success", "plot-failures", "plot-skills-train", "plot-skills-heldout",
                 "plot-generators", "plot-timing", "plot-metric-loss", "plot-metric-kl"):
        assert f'id="{plot}"' in small_report, plot
    # The SFT baseline (round 0) is marked on the success plot.
    assert "SFT (round 0)" in small_report
    # Generators: both, with rejection reasons; lineage shows chat turns and generated tasks.
    assert "decompose" in small_report and "answer_mismatch" in small_report
    assert small_report.count('class="lineage"') >= 2
    assert "latest pass rate" in small_report and "first error" in small_report
    for phase in ("sft", "rollout", "train", "eval", "analyze", "generate", "store"):
        assert f"<td>{phase}</td>" in small_report


def test_report_escapes_model_output_and_is_self_contained(small_report):
    assert EVIL not in small_report and EVIL_SKILL not in small_report
    assert "&lt;script&gt;alert(" in small_report
    assert "&lt;img src=x onerror=alert(1)&gt;" in small_report
    assert small_report.count("<script>") == 1  # only the page's own self-check
    # Nothing to fetch: the only URL is the SVG namespace name, which is never loaded.
    urls = set(re.findall(r"(?:https?:)?//[\w.-]+[^\s\"'<>]*", small_report))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert not re.search(r"<(link|img|iframe)\b|src=\"", small_report)


def test_chat_turns_split_calls_answers_and_mark_the_first_error():
    messages = json.dumps([
        {"role": "user", "content": "Compute 2*3"},
        {"role": "assistant", "content": 'ok <tool_call>{"name": "calculator"}</tool_call>'},
        {"role": "tool", "content": "6"},
        {"role": "assistant", "content": "<answer>7</answer>"},
    ])
    turns = chat_turns(messages, first_error_step=1)
    assert [t["role"] for t in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[1]["segments"] == [("text", "ok "),
                                    ("call", '<tool_call>{"name": "calculator"}</tool_call>')]
    assert turns[2]["segments"] == [("obs", "6")]
    assert [t["first_error"] for t in turns] == [False, False, False, True]
    assert turns[3]["step"] == 1


def test_lineage_follows_parent_links_when_a_generator_names_no_failures(tmp_path):
    store = synth_store(tmp_path / "sentinel.duckdb", rounds=4)
    with store.connect(read_only=False) as con:
        (task_id, rnd), = con.execute("SELECT task_id, round FROM failures "
                                      "ORDER BY failure_id LIMIT 1").fetchall()
        for i in (1, 2):  # two children: more than any other failure has
            con.execute("""
                INSERT INTO tasks (task_id, family, spec, prompt, answer, skills, origin,
                    created_round, parent_task_id, failure_ids, generator)
                VALUES (?, 'arith', '{}', ?, '0', ['op:add'], 'generated', ?, ?, NULL,
                        'parent_only')""",
                        [f"orphan-{i}", json.dumps([{"role": "user", "content": f"Child {i}"}]),
                         rnd, task_id])
        con.execute("""
            INSERT INTO trajectories (traj_id, round, split, task_id, group_id, sample_idx,
                messages, token_ids, loss_mask, prompt_len, n_tokens, n_policy_tokens, n_turns,
                finish_reason, answer, reward, reward_terms, success)
            SELECT 'orphan-tr-' || i, ? + 1, 'train', 'orphan-1', 'go', i, '[]', [1], [0], 1, 1,
                   0, 1, 'answer', '0', 0.0, '{}', true FROM range(3) t(i)""", [rnd])
    page = build_report(tmp_path).read_text()
    lineage = page[page.index('id="lineage"'):page.index('id="timing"')]
    assert "orphan-1" in lineage and "orphan-2" in lineage and "parent_only" in lineage


def test_empty_store_renders(tmp_path):
    Store.create(tmp_path / "sentinel.duckdb", run_id="run-empty", config={})
    page = build_report(tmp_path).read_text()
    assert "No round has been committed yet" in page


@pytest.mark.slow
def test_report_of_a_1000_round_run_is_small_and_downsampled(tmp_path):
    """What keeps a long run's report cheap (benchmarks/report.py times it against a short
    run's): every plot downsampled, the page a few MB at most."""
    synth_store(tmp_path / "sentinel.duckdb", rounds=1000)
    out = build_report(tmp_path, tmp_path / "big.html")
    assert out.stat().st_size < 5_000_000
    page = out.read_text()
    success = page[page.index('id="plot-success"'):]
    success = success[:success.index("</svg>")]
    for points in re.findall(r'<polyline points="([^"]*)"', success):
        assert len(points.split()) <= MAX_POINTS
    heat = page[page.index('id="plot-skills-train"'):]
    heat = heat[:heat.index("</svg>")]
    assert len(set(re.findall(r'<rect x="([\d.]+)"', heat))) <= MAX_COLUMNS
    assert "buckets of" in page


def sentinel(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sentinel", *args], capture_output=True,
                          text=True, timeout=120, **kwargs)


def test_cli_report_writes_the_file(tmp_path):
    synth_store(tmp_path / "sentinel.duckdb", rounds=4)
    proc = sentinel("report", "--run-dir", str(tmp_path), "--out", str(tmp_path / "r.html"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r.html").stat().st_size > 10_000
    assert "r.html" in proc.stdout
    missing = sentinel("report", "--run-dir", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no store at" in missing.stderr


def test_status_shows_training_metrics(tmp_path):
    synth_store(tmp_path / "sentinel.duckdb", rounds=3)
    proc = sentinel("status", "--run-dir", str(tmp_path), env={**os.environ, "COLUMNS": "300"})
    assert proc.returncode == 0, proc.stderr
    assert "training metrics" in proc.stdout
    assert "grad_norm=" in proc.stdout and "clip_ratio=0.02" in proc.stdout
    assert "sft/loss=0.5" in proc.stdout  # round 0 shows the cold start's metrics


def test_status_watch_follows_new_rounds_and_exits_on_ctrl_c(tmp_path):
    import threading

    store = synth_store(tmp_path / "sentinel.duckdb", rounds=2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "status", "--run-dir", str(tmp_path), "--watch",
         "--interval", "0.3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "300"})
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()

    try:
        # Live output to a pipe is only flushed at exit; the watch announces itself on stderr
        # when it starts, so Ctrl-C is never sent into the interpreter's start-up (on a loaded
        # machine that took longer than a fixed wait).
        started = proc.stderr.readline()
        assert "watching" in started and "Ctrl-C" in started, started
        # A loop commits while status watches: the watcher only ever holds read-only
        # connections briefly, so the write goes through.
        store.record_round(7, {"heldout_success": 0.777, "metrics": {"loss": 0.123}})
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
        reader.join(timeout=10)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(chunks)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "0.777" in out and "loss=0.123" in out


# -- the real run in a real browser -------------------------------------------------------------

SCREENSHOT = Path(tempfile.gettempdir()) / "sentinel-report" / "report.png"

TINY_RUN = {
    "seed": 3,
    "rounds": 1,
    "policy": {"tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 4}},
    "families": [{"type": "arith", "max_operands": 3}],
    "env": {"max_turns": 3, "max_tokens": 192, "max_turn_tokens": 24},
    "sft": {"steps": 8, "batch_size": 16, "num_examples": 32},
    "batch": {"steps_per_round": 1, "tasks_per_step": 6, "group_size": 2},
    "eval": {"num_tasks": 3, "samples": 2},
    "generators": [{"type": "mutate", "per_failure": 1}],
}


@pytest.fixture(scope="module")
def chromium() -> str:
    """Path of a headless Chromium. The suite never installs it: `make test` does, once, where
    apt-get and root allow (see the Makefile), else this skips."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (`make test` installs it with apt-get as root; "
                    "or `apt-get install chromium`)")
    return found


def headless(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_report_of_a_real_run_renders_in_headless_chromium(tmp_path_factory, chromium):
    from sentinel.config import load_config
    from sentinel.loop import Loop

    run_dir = tmp_path_factory.mktemp("real-run")
    Loop(load_config(data=json.loads(json.dumps(TINY_RUN))), run_dir).run()
    page = build_report(run_dir)
    html = page.read_text()
    n_plots = html.count('<svg class="plot"')
    assert n_plots >= 6  # success, >=1 metric, failures, 2 skill maps, timing (+ generators)

    profile = tmp_path_factory.mktemp("chromium-profile")
    dom = headless(chromium, profile, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body, dom.stdout[:2000]
    assert 'data-rendered="ok"' in body.group(0), body.group(0)
    assert f'data-plots="{n_plots}"' in body.group(0)
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    # Every plot survived parsing with its marks (the DOM, not just our source text).
    for svg in re.findall(r'<svg class="plot".*?</svg>', dom.stdout, re.DOTALL):
        assert len(re.findall(r"<(polyline|polygon|rect|circle)\b", svg)) >= 1

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.unlink(missing_ok=True)
    shot = headless(chromium, profile, f"--screenshot={SCREENSHOT}", "--window-size=900,4200",
                    "--hide-scrollbars", page.as_uri())
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert SCREENSHOT.stat().st_size > 20_000
    print(f"screenshot: {SCREENSHOT}")


# -- numbers that agree, and a report that answers its question (issue #20 §5) -----------------

def _legend(page: str, plot_id: str) -> list[tuple[str, str]]:
    """(colour, label) of each legend entry of the figure holding `plot_id`."""
    figure = page[page.index(f'id="{plot_id}"'):]
    figure = figure[:figure.index("</figure>")]
    return re.findall(r'<i style="background:(#[0-9a-f]{6})"></i>([^<]*)</span>', figure)


def test_every_generator_outcome_has_its_own_colour(tmp_path):
    store = synth_store(tmp_path / "sentinel.duckdb", rounds=3)
    with store.connect(read_only=False) as con:
        con.execute("""
            INSERT INTO rejections (rejection_id, round, generator, family, spec, reason, detail)
            SELECT 'extra-' || i, 1, 'mutate', 'arith', '{}',
                   ['too_easy', 'too_hard', 'schema', 'probe_budget', 'unparseable'][i + 1], ''
            FROM range(5) t(i)""")
    legend = _legend(build_report(tmp_path).read_text(), "plot-generators")
    labels = [label for _, label in legend]
    assert "accepted" in labels and "rejected: too_easy" in labels
    assert len({colour for colour, _ in legend}) == len(legend), legend


def test_header_counts_grpo_rounds_and_splits_rollouts(tmp_path):
    store = synth_store(tmp_path / "sentinel.duckdb", rounds=3)  # round 0 (SFT), rounds 1-2
    with store.connect(read_only=False) as con:
        con.execute("""
            INSERT INTO trajectories (traj_id, round, split, task_id, group_id, sample_idx,
                messages, token_ids, loss_mask, prompt_len, n_tokens, n_policy_tokens, n_turns,
                finish_reason, answer, reward, reward_terms, success)
            SELECT 'ev-' || i, 2, 'eval', 'eval-0', 'ge', i, '[]', [1], [0], 1, 1, 0, 1,
                   'answer', '0', 0.0, '{}', false FROM range(5) t(i)""")
    page = build_report(tmp_path).read_text()
    kpis = page[page.index('class="kpis"'):]
    kpis = re.sub(r"\s+", " ", kpis[:kpis.index("</div>\n</div>")])
    assert "GRPO rounds<b>2</b>" in kpis and "after the SFT round 0" in kpis
    assert "train / held-out rollouts<b>64 / 5</b>" in kpis, kpis


def test_did_it_fix_the_failure_gives_each_clusters_share_before_and_after(tmp_path):
    from sentinel.report import collect

    store = synth_store(tmp_path / "sentinel.duckdb", rounds=4)
    with store.connect(read_only=True) as con:
        fixes = collect(con)["fixes"]
    _, failures = store.query("SELECT failure_id, round, mode FROM failures")
    _, train = store.query("SELECT round, count(*) FROM trajectories WHERE split = 'train' "
                           "GROUP BY round")
    _, links = store.query("SELECT unnest(failure_ids), created_round, task_id FROM tasks "
                           "WHERE origin = 'generated'")
    _, rollouts = store.query("SELECT task_id, round FROM trajectories WHERE split = 'train'")
    n_train = dict(train)
    mode_of = {fid: mode for fid, _, mode in failures}
    mined: dict[str, int] = {}
    kids: dict[str, set[str]] = {}
    for fid, created, task_id in links:
        mined[mode_of[fid]] = min(created, mined.get(mode_of[fid], created))
        kids.setdefault(mode_of[fid], set()).add(task_id)
    assert {f["mode"] for f in fixes} == set(mined)
    for fix in fixes:
        g = mined[fix["mode"]]
        later = [r for r in n_train if r > g]

        def share(rounds: list[int], mode: str = fix["mode"]) -> float | None:
            n = sum(n_train[r] for r in rounds)
            return sum(1 for _, r, m in failures if m == mode and r in rounds) / n if n else None

        assert fix["round"] == g and fix["n_tasks"] == len(kids[fix["mode"]])
        assert fix["trained_rollouts"] == sum(1 for t, r in rollouts
                                              if t in kids[fix["mode"]] and r > g)
        assert fix["before"] == pytest.approx(share([g]))
        if later:
            assert fix["after"] == pytest.approx(share(later))
        else:
            assert fix["after"] is None
    trained = [f for f in fixes if f["trained_rollouts"] > 0]
    assert trained
    page = build_report(tmp_path).read_text()
    section = page[page.index('id="fixed"'):page.index('id="lineage"')]
    assert f"{trained[0]['before']:.3f}" in section and f"{trained[0]['after']:.3f}" in section


def test_gallery_prefers_failures_whose_tasks_were_trained(tmp_path):
    store = synth_store(tmp_path / "sentinel.duckdb", rounds=4)
    with store.connect(read_only=False) as con:
        # The last round's failures get the most generated tasks, which no round trains.
        last = con.execute("SELECT failure_id, task_id FROM failures WHERE round = 3 "
                           "ORDER BY failure_id LIMIT 3").fetchall()
        for fid, task_id in last:
            for i in (1, 2, 3):
                con.execute("""
                    INSERT INTO tasks (task_id, family, spec, prompt, answer, skills, origin,
                        created_round, parent_task_id, failure_ids, generator)
                    VALUES (?, 'arith', '{}', '[]', '0', ['op:add'], 'generated', 3, ?, [?],
                            'mutate')""", [f"late-{fid}-{i}", task_id, fid])
    page = build_report(tmp_path).read_text()
    lineage = page[page.index('id="lineage"'):page.index('id="timing"')]
    first = lineage[:lineage.index('class="lineage"', lineage.index('class="lineage"') + 1)]
    assert "latest pass rate: <b>" in first  # its generated tasks have been trained on
