"""`sentinel report`: one self-contained HTML page that shows what a run did.

Design:
- Every number is aggregated in SQL over the store's base tables (`rounds`, `tasks`,
  `trajectories`, `failures`, `rejections`, `evals`, `runs`), never over views, so the page does
  not depend on which views a store version has. One read-only connection serves all queries and
  is closed before rendering, so a running loop waits at most for the queries (the store's lock
  rules, docs/schema.md).
- Many rounds are bucketed in SQL: line and area plots get at most `MAX_POINTS` points, heatmaps
  at most `MAX_COLUMNS` columns. Round 0 (the SFT baseline) always stays its own bucket. Text from
  rollouts is cut at `MAX_TEXT` characters. So the page stays small and fast for long runs.
- Plots are inline SVG drawn here (no plotting library, no JavaScript library, no external URL):
  the file opens offline. A few lines of inline JS only check that every plot has content and
  set `data-rendered="ok"` (or `"error"` with a console error) on `<body>`; tests read it.
- Model output is untrusted: the jinja2 template autoescapes, and the SVG builders here escape
  every label they write (`_esc`); only their own markup is marked safe.

Simplifications: no interactivity beyond SVG `<title>` tooltips; a bucket's value is the mean of
its rounds (held-out/train success) or the pooled rate of its rollouts (failure shares, skills);
the lineage gallery shows at most `GALLERY_SIZE` failures, one failure mode after another.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup

from sentinel.env.parser import ANSWER_OPEN, BLOCK_RE, TOOL_CALL_OPEN
from task_store.schema import RECOVER_PREFIX

MAX_POINTS = 200
MAX_BARS = 40
MAX_COLUMNS = 60
MAX_SKILLS = 30
MAX_TEXT = 1200
GALLERY_SIZE = 4
CHILDREN_PER_FAILURE = 3
PHASES = ("sft", "rollout", "train", "eval", "analyze", "generate", "store")
TRAIN_METRICS = ("reward", "loss", "kl", "entropy", "clip_ratio", "grad_norm")
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#8c564b")
ACCEPTED = "#59a14f"  # green; no rejection reason shares it
MAX_FIXES = 12
MAX_RECOVERY_ROWS = 25  # rows (rounds or buckets of rounds) of the recovery table
W, H = 760, 260
ML, MR, MT, MB = 52, 16, 14, 34


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _bucket_sql(size: int, column: str = "round") -> str:
    """SQL expression mapping a round to its bucket's first round; round 0 stays alone."""
    if size <= 1:
        return column
    return f"(CASE WHEN {column} = 0 THEN 0 ELSE ({column} - 1) // {size} * {size} + 1 END)"


def _bucket_size(n_rounds: int, limit: int) -> int:
    return max(1, math.ceil(max(n_rounds - 1, 0) / (limit - 1))) if n_rounds > limit else 1


def _nice_ticks(lo: float, hi: float, n: int = 4, integer: bool = False) -> list[float]:
    """About `n` round-numbered ticks covering [lo, hi] (whole numbers when `integer`)."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1, round(step))
    first = math.ceil(lo / step - 1e-9)
    return [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def _short(label: str, n: int = 20) -> str:
    """A row label that fits the left margin; the full text goes in a `<title>`."""
    return label if len(label) <= n else label[: n - 1] + "…"


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    return f"{v:.2g}" if abs(v) < 0.01 or abs(v) >= 1000 else f"{v:.3g}"


@dataclass
class Plot:
    """One figure: inline SVG markup plus its legend entries (label, colour)."""

    id: str
    svg: Markup
    legend: list[tuple[str, str]] = field(default_factory=list)


class _Frame:
    """Axes of one chart: maps data to pixels and draws ticks and grid."""

    def __init__(self, xs: Sequence[float], ymin: float, ymax: float, width: int = W,
                 height: int = H) -> None:
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        self.data_x = (self.x0, self.x1)  # tick range: only rounds that exist
        if self.x0 == self.x1:
            self.x0, self.x1 = self.x0 - 1, self.x1 + 1
        self.ymin, self.ymax = ymin, ymax if ymax > ymin else ymin + 1
        self.w, self.h, self.ml = width, height, ML

    def px(self, x: float) -> float:
        return self.ml + (x - self.x0) / (self.x1 - self.x0) * (self.w - self.ml - MR)

    def py(self, y: float) -> float:
        return MT + (1 - (y - self.ymin) / (self.ymax - self.ymin)) * (self.h - MT - MB)

    def axes(self, yticks: Sequence[float], xlabel: str = "round") -> list[str]:
        out = []
        for t in yticks:
            y = self.py(t)
            out.append(f'<line x1="{self.ml}" x2="{self.w - MR}" y1="{y:.1f}" y2="{y:.1f}" '
                       'class="grid"/>')
            out.append(f'<text x="{self.ml - 6}" y="{y + 4:.1f}" class="tick" '
                       f'text-anchor="end">{_esc(_fmt(t))}</text>')
        for t in _nice_ticks(*self.data_x, 6, integer=True) or [self.x0]:
            out.append(f'<text x="{self.px(t):.1f}" y="{self.h - MB + 16}" class="tick" '
                       f'text-anchor="middle">{_esc(_fmt(t))}</text>')
        out.append(f'<text x="{self.w - MR}" y="{self.h - 4}" class="tick" '
                   f'text-anchor="end">{_esc(xlabel)}</text>')
        out.append(f'<line x1="{self.ml}" x2="{self.w - MR}" y1="{self.py(self.ymin):.1f}" '
                   f'y2="{self.py(self.ymin):.1f}" class="axis"/>')
        return out


def _svg(plot_id: str, body: list[str], width: int = W, height: int = H,
         label: str = "") -> Markup:
    return Markup(f'<svg class="plot" id="{_esc(plot_id)}" viewBox="0 0 {width} {height}" '
                  f'width="{width}" height="{height}" role="img" aria-label="{_esc(label)}" '
                  f'xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>")


def line_chart(plot_id: str, xs: Sequence[float], series: dict[str, Sequence[float | None]], *,
               ymax: float | None = None, baseline_x: float | None = None,
               baseline_y: float | None = None, width: int = W,
               height: int = H, label: str = "") -> Plot:
    """Lines over rounds; `None` values leave gaps. `ymax=None` scales to the data; dashed lines
    mark `baseline_x` (the SFT round) and `baseline_y` (its held-out success)."""
    values = [v for s in series.values() for v in s if v is not None]
    lo = min([0.0, *values])
    hi = ymax if ymax is not None else max([0.0, *values]) * 1.05
    if hi - lo < 1e-12:  # a flat series (e.g. clip ratio 0): still draw a readable axis
        hi = lo + 1.0
    frame = _Frame(xs, lo, hi, width, height)
    body = frame.axes(_nice_ticks(lo, hi, 4 if height > 200 else 3))
    if baseline_x is not None:
        x = frame.px(baseline_x)
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MT}" y2="{height - MB}" '
                    'class="baseline"/>')
        body.append(f'<text x="{x + 4:.1f}" y="{MT + 10}" class="tick">SFT (round 0)</text>')
    if baseline_y is not None:
        y = frame.py(baseline_y)
        body.append(f'<line x1="{ML}" x2="{width - MR}" y1="{y:.1f}" y2="{y:.1f}" '
                    'class="baseline"><title>SFT baseline (round 0 held-out): '
                    f'{baseline_y:.3f}</title></line>')
    legend = []
    for i, (name, ys) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        legend.append((name, colour))
        segment: list[str] = []
        segments = [segment]
        for x, y in zip(xs, ys, strict=True):
            if y is None:
                segment = []
                segments.append(segment)
            else:
                segment.append(f"{frame.px(x):.1f},{frame.py(y):.1f}")
        for seg in segments:
            if len(seg) > 1:
                body.append(f'<polyline points="{" ".join(seg)}" fill="none" '
                            f'stroke="{colour}" stroke-width="2"/>')
        if len(xs) <= 40:  # markers only when they stay readable
            body += [f'<circle cx="{frame.px(x):.1f}" cy="{frame.py(y):.1f}" r="3" '
                     f'fill="{colour}"><title>{_esc(name)} · round {x:g}: {y:.3f}</title></circle>'
                     for x, y in zip(xs, ys, strict=True) if y is not None]
    return Plot(plot_id, _svg(plot_id, body, width, height, label), legend)


def stacked_area(plot_id: str, xs: Sequence[float], layers: dict[str, Sequence[float]], *,
                 ymax: float | None = None, colours: dict[str, str] | None = None,
                 label: str = "") -> Plot:
    """Layers stacked bottom-up in the given order (each a value per x). Up to `MAX_BARS` x
    positions it draws stacked bars (rounds are discrete; an area would invent values between
    them); beyond, stacked areas."""
    totals = [sum(layer[i] for layer in layers.values()) for i in range(len(xs))]
    hi = ymax if ymax is not None else max([*totals, 1e-9]) * 1.05
    bars = len(xs) <= MAX_BARS
    frame = _Frame([min(xs) - 0.5, max(xs) + 0.5] if bars else xs, 0.0, hi)
    frame.data_x = (min(xs), max(xs))
    body = frame.axes(_nice_ticks(0.0, hi, 4))
    legend = []
    below = [0.0] * len(xs)
    width = min(40.0, 0.7 * (frame.px(1) - frame.px(0)))
    for i, (name, vals) in enumerate(layers.items()):
        colour = (colours or {}).get(name, PALETTE[i % len(PALETTE)])
        legend.append((name, colour))
        above = [b + v for b, v in zip(below, vals, strict=True)]
        if bars:
            body += [f'<rect x="{frame.px(x) - width / 2:.1f}" y="{frame.py(a):.1f}" '
                     f'width="{width:.1f}" height="{frame.py(b) - frame.py(a):.1f}" '
                     f'fill="{colour}"><title>{_esc(name)} · round {x:g}: {v:.3g}</title></rect>'
                     for x, a, b, v in zip(xs, above, below, vals, strict=True) if v > 0]
        else:
            top = [f"{frame.px(x):.1f},{frame.py(y):.1f}" for x, y in zip(xs, above, strict=True)]
            bottom = [f"{frame.px(x):.1f},{frame.py(y):.1f}"
                      for x, y in zip(reversed(xs), reversed(below), strict=True)]
            body.append(f'<polygon points="{" ".join(top + bottom)}" fill="{colour}" '
                        f'fill-opacity="0.85"><title>{_esc(name)}</title></polygon>')
        below = above
    return Plot(plot_id, _svg(plot_id, body, label=label), legend)


def _heat_colour(rate: float) -> str:
    """Red (0) -> yellow (0.5) -> green (1)."""
    rate = min(max(rate, 0.0), 1.0)
    if rate < 0.5:
        r, g, b = 215, int(48 + (rate / 0.5) * (200 - 48)), 39
    else:
        t = (rate - 0.5) / 0.5
        r, g, b = int(215 - t * (215 - 26)), int(200 - t * (200 - 152)), int(39 + t * (80 - 39))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(plot_id: str, rows: Sequence[str], cols: Sequence[int],
            cells: dict[tuple[str, int], tuple[float, int]], *, bucket: int,
            label: str = "") -> Plot:
    """Rows × round-bucket columns; a cell is (success rate, samples); empty cells stay blank."""
    ml, cell_h = 130, 16
    height = MT + cell_h * max(len(rows), 1) + MB
    cw = (W - ml - MR) / max(len(cols), 1)
    col_x = {c: ml + i * cw for i, c in enumerate(cols)}
    body = []
    for j, row in enumerate(rows):
        y = MT + j * cell_h
        body.append(f'<text x="{ml - 6}" y="{y + cell_h - 4}" class="tick" '
                    f'text-anchor="end">{_esc(_short(row))}<title>{_esc(row)}</title></text>')
    for (row, col), (rate, n) in cells.items():
        if row not in rows or col not in col_x:
            continue
        y = MT + rows.index(row) * cell_h
        span = f"round {col}" if bucket == 1 or col == 0 else f"rounds {col}–{col + bucket - 1}"
        body.append(f'<rect x="{col_x[col]:.1f}" y="{y}" width="{cw + 0.3:.1f}" '
                    f'height="{cell_h - 1}" fill="{_heat_colour(rate)}"><title>{_esc(row)} · '
                    f'{span}: {rate:.2f} (n={n})</title></rect>')
    step = max(1, math.ceil(len(cols) / 12))
    for i, c in enumerate(cols):
        if i % step == 0:
            body.append(f'<text x="{col_x[c] + cw / 2:.1f}" y="{height - MB + 14}" class="tick" '
                        f'text-anchor="middle">{c}</text>')
    body.append(f'<text x="{W - MR}" y="{height - 4}" class="tick" text-anchor="end">round</text>')
    legend = [(f"{v:g}", _heat_colour(v)) for v in (0.0, 0.25, 0.5, 0.75, 1.0)]
    return Plot(plot_id, _svg(plot_id, body, W, height, label), legend)


def hbars(plot_id: str, rows: Sequence[str], segments: dict[str, Sequence[float]], *,
          colours: dict[str, str] | None = None, label: str = "") -> Plot:
    """One horizontal stacked bar per row; `segments[name][i]` is row i's share of `name`."""
    ml, bar_h = 130, 22
    height = MT + bar_h * max(len(rows), 1) + MB
    totals = [sum(s[i] for s in segments.values()) for i in range(len(rows))]
    vmax = max([*totals, 1e-9])
    scale = (W - ml - MR - 40) / vmax
    body, legend = [], []
    left = [float(ml)] * len(rows)
    for k, (name, vals) in enumerate(segments.items()):
        colour = (colours or {}).get(name, PALETTE[k % len(PALETTE)])
        legend.append((name, colour))
        for i, v in enumerate(vals):
            if v <= 0:
                continue
            body.append(f'<rect x="{left[i]:.1f}" y="{MT + i * bar_h}" width="{v * scale:.1f}" '
                        f'height="{bar_h - 4}" fill="{colour}"><title>{_esc(rows[i])} · '
                        f'{_esc(name)}: {v:g}</title></rect>')
            left[i] += v * scale
    for i, row in enumerate(rows):
        y = MT + i * bar_h + bar_h - 9
        body.append(f'<text x="{ml - 6}" y="{y}" class="tick" text-anchor="end">'
                    f'{_esc(_short(row))}<title>{_esc(row)}</title></text>')
        body.append(f'<text x="{left[i] + 4:.1f}" y="{y}" class="tick">{totals[i]:g}</text>')
    return Plot(plot_id, _svg(plot_id, body, W, height, label), legend)


# -- data ----------------------------------------------------------------------------------------

def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f" … [{len(text) - MAX_TEXT} more]"


def chat_turns(messages_json: str | None, first_error_step: int | None) -> list[dict[str, Any]]:
    """Messages of a trajectory as render-ready turns: role, segments (kind, text) splitting
    assistant text into `call` / `answer` / `text`, the assistant step index and whether it is the
    failure's first erroneous step."""
    turns, step = [], 0
    for msg in json.loads(messages_json or "[]"):
        role, content = msg.get("role", "?"), _cut(str(msg.get("content", "")))
        turn: dict[str, Any] = {"role": role, "step": None, "first_error": False}
        if role == "assistant":
            turn["step"], turn["first_error"] = step, step == first_error_step
            step += 1
            parts = [p for p in BLOCK_RE.split(content) if p]
            turn["segments"] = [("call" if p.startswith(TOOL_CALL_OPEN) else
                                 "answer" if p.startswith(ANSWER_OPEN) else "text", p)
                                for p in parts]
        else:
            turn["segments"] = [("obs" if role == "tool" else "text", content)]
        turns.append(turn)
    return turns


def _rows(con: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
    return con.execute(sql, list(params)).fetchall()


def _mode_colours(modes: Sequence[str]) -> dict[str, str]:
    from sentinel.types import FAILURE_MODES

    known = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(FAILURE_MODES)}
    extra = [m for m in modes if m not in known]
    return {**known, **{m: PALETTE[(len(known) + i) % len(PALETTE)] for i, m in enumerate(extra)}}


def collect(con: Any) -> dict[str, Any]:
    """Everything the template shows, queried over one open (read-only) DuckDB connection."""
    ctx: dict[str, Any] = {"plots": {}}
    run = _rows(con, "SELECT run_id, created_at, config, schema_version FROM runs "
                     "ORDER BY created_at LIMIT 1")
    ctx["run"] = ({"run_id": run[0][0], "created_at": run[0][1], "schema_version": run[0][3],
                   "config": json.dumps(json.loads(run[0][2] or "null"), indent=2)}
                  if run else None)
    n_rounds, last_round, n_grpo = _rows(
        con, "SELECT count(*), max(round), count(*) FILTER (WHERE round > 0) FROM rounds")[0]
    # Round 0 is the SFT cold start: the header counts GRPO rounds, and names round 0 apart.
    ctx["n_rounds"], ctx["last_round"], ctx["n_grpo_rounds"] = n_rounds, last_round, n_grpo
    ctx["has_round_0"] = bool(_rows(con, "SELECT 1 FROM rounds WHERE round = 0"))
    ctx["totals"] = dict(zip(
        ("train_rollouts", "heldout_rollouts", "failures", "generated", "rejected"),
        _rows(con, """SELECT (SELECT count(*) FROM trajectories WHERE split = 'train'),
                             (SELECT count(*) FROM trajectories WHERE split = 'eval'),
                             (SELECT count(*) FROM failures),
                             (SELECT count(*) FROM tasks WHERE origin = 'generated'),
                             (SELECT count(*) FROM rejections)""")[0], strict=True))
    if not n_rounds:
        return ctx
    b = _bucket_size(last_round + 1, MAX_POINTS)
    ctx["bucket"] = b
    bk = _bucket_sql(b)

    # Success per round, and training metrics from rounds.metrics JSON.
    rows = _rows(con, f"""SELECT {bk} AS x, avg(heldout_success), avg(heldout_greedy),
                                 avg(train_success) FROM rounds GROUP BY x ORDER BY x""")
    xs = [r[0] for r in rows]
    ctx["first"] = _rows(con, "SELECT heldout_success, heldout_greedy FROM rounds "
                              "ORDER BY round LIMIT 1")[0]
    ctx["last"] = _rows(con, "SELECT heldout_success, heldout_greedy, train_success FROM rounds "
                             "ORDER BY round DESC LIMIT 1")[0]
    ctx["plots"]["success"] = line_chart(
        "plot-success", xs, {"held-out (sampled)": [r[1] for r in rows],
                             "held-out (greedy)": [r[2] for r in rows],
                             "train": [r[3] for r in rows]},
        ymax=1.0, baseline_x=0 if 0 in xs else None,
        baseline_y=rows[0][1] if xs and xs[0] == 0 else None, label="success per round")
    metric_rows = _rows(con, f"""
        SELECT {bk} AS x, j.key, avg(TRY_CAST(j.value AS DOUBLE))
        FROM rounds, json_each(rounds.metrics) AS j
        WHERE list_contains(?, j.key) GROUP BY ALL ORDER BY x""", [list(TRAIN_METRICS)])
    by_metric: dict[str, dict[int, float]] = defaultdict(dict)
    for x, key, v in metric_rows:
        if v is not None:
            by_metric[key][x] = v
    train_xs = sorted({x for d in by_metric.values() for x in d})
    ctx["plots"]["metrics"] = [
        line_chart(f"plot-metric-{k}", train_xs, {k: [by_metric[k].get(x) for x in train_xs]},
                   width=370, height=170, label=k)
        for k in TRAIN_METRICS if len(by_metric.get(k, {})) >= 1]

    # Failure modes per round as a share of the round's train rollouts.
    rows = _rows(con, f"""
        WITH n AS (SELECT {bk} AS x, count(*) AS n FROM trajectories WHERE split = 'train'
                   GROUP BY x),
             f AS (SELECT {bk} AS x, mode, count(*) AS k FROM failures GROUP BY ALL)
        SELECT f.x, f.mode, f.k / n.n FROM f JOIN n USING (x) ORDER BY f.x""")
    fxs = sorted({r[0] for r in rows})
    modes = sorted({r[1] for r in rows})
    shares = {m: [0.0] * len(fxs) for m in modes}
    for x, mode, share in rows:
        shares[mode][fxs.index(x)] = share
    totals = {m: sum(v) for m, v in shares.items()}
    layers = {m: shares[m] for m in sorted(modes, key=lambda m: -totals[m])}
    if fxs:
        ctx["plots"]["failures"] = stacked_area("plot-failures", fxs, layers,
                                                colours=_mode_colours(modes),
                                                label="failure modes per round")

    # Skill mastery: skill × round bucket, train rollouts and held-out evals.
    hb = _bucket_size(last_round + 1, MAX_COLUMNS)
    hk = _bucket_sql(hb, "r.round")
    skills = [r[0] for r in _rows(con, """
        SELECT s.skill FROM trajectories r
        JOIN (SELECT task_id, unnest(skills) AS skill FROM tasks) s USING (task_id)
        GROUP BY s.skill ORDER BY count(*) DESC, s.skill LIMIT ?""", [MAX_SKILLS])]
    skills.sort()
    for name, sql in (
        ("train", f"""SELECT {hk} AS x, s.skill, avg(r.success::INT), count(*)
                      FROM trajectories r JOIN (SELECT task_id, unnest(skills) AS skill
                      FROM tasks) s USING (task_id) WHERE r.split = 'train' GROUP BY ALL"""),
        ("heldout", f"""SELECT {hk} AS x, s.skill, sum(r.successes) / sum(r.k), sum(r.k)
                        FROM evals r JOIN (SELECT task_id, unnest(skills) AS skill
                        FROM tasks) s USING (task_id) GROUP BY ALL"""),
    ):
        rows = _rows(con, sql)
        cols = sorted({r[0] for r in rows})
        if rows:
            ctx["plots"][f"skills_{name}"] = heatmap(
                f"plot-skills-{name}", skills, cols,
                {(r[1], r[0]): (r[2], r[3]) for r in rows}, bucket=hb,
                label=f"skill mastery ({name})")

    # Generator yield: accepted, rejected by reason, later success of their tasks and parents.
    accepted = dict(_rows(con, "SELECT generator, count(*) FROM tasks WHERE origin = 'generated' "
                               "GROUP BY ALL"))
    rejected = _rows(con, "SELECT generator, reason, count(*) FROM rejections GROUP BY ALL "
                          "ORDER BY 3 DESC")
    later = {g: (rate, n) for g, rate, n in _rows(con, """
        SELECT t.generator, avg(r.success::INT), count(*) FROM tasks t JOIN trajectories r
        ON r.task_id = t.task_id AND r.round > t.created_round AND r.split = 'train'
        WHERE t.origin = 'generated' GROUP BY ALL""")}
    parents = {g: (rate, n) for g, rate, n in _rows(con, """
        WITH p AS (SELECT generator, parent_task_id AS task_id, min(created_round) AS since
                   FROM tasks WHERE origin = 'generated' AND parent_task_id IS NOT NULL
                   GROUP BY ALL)
        SELECT p.generator, avg(r.success::INT), count(*) FROM p JOIN trajectories r
        ON r.task_id = p.task_id AND r.round > p.since AND r.split = 'train' GROUP BY ALL""")}
    generators = sorted({*accepted, *(r[0] for r in rejected)}, key=str)
    reasons = sorted({r[1] for r in rejected}, key=str)
    rej = {(g, reason): n for g, reason, n in rejected}
    ctx["generators"] = [{
        "name": g, "accepted": accepted.get(g, 0),
        "rejected": {r: rej[(g, r)] for r in reasons if (g, r) in rej},
        "proposed": accepted.get(g, 0) + sum(rej.get((g, r), 0) for r in reasons),
        "later": later.get(g), "parents": parents.get(g),
    } for g in generators]
    if generators:
        segments = {"accepted": [accepted.get(g, 0) for g in generators]}
        segments |= {f"rejected: {r}": [rej.get((g, r), 0) for g in generators] for r in reasons}
        others = [c for c in PALETTE if c != ACCEPTED]
        colours = {"accepted": ACCEPTED} | {f"rejected: {r}": others[i % len(others)]
                                            for i, r in enumerate(reasons)}
        ctx["plots"]["generators"] = hbars("plot-generators", [str(g) for g in generators],
                                           segments, colours=colours, label="generator yield")

    # Recovery from tool faults: held-out recovery per fault type, plotted and tabled.
    points = _recovery(con, b)
    if points:
        types = sorted({t for rates in points.values() for t in rates})
        rxs = sorted(points)
        series = {"mean": [_mean_rate(points[x]) for x in rxs]}
        series |= {t: [points[x][t][0] if t in points[x] else None for x in rxs] for t in types}
        ctx["plots"]["recovery"] = line_chart(
            "plot-recovery", rxs, series, ymax=1.0, baseline_x=0 if 0 in rxs else None,
            label="held-out recovery per fault type")
        rb = _bucket_size(last_round + 1, MAX_RECOVERY_ROWS)
        rows_by = _recovery(con, rb)
        ctx["recovery"] = {"types": types, "bucket": rb, "rows": [
            {"round": x, "last": min(x + rb - 1, last_round) if rb > 1 and x > 0 else x,
             "mean": _mean_rate(rates), "rates": rates} for x, rates in sorted(rows_by.items())]}

    ctx["fixes"] = _fixes(con)
    ctx["gallery"] = _gallery(con)

    # Timing per phase: seconds per round (bucket mean) and totals.
    rows = _rows(con, f"""
        WITH n AS (SELECT {bk} AS x, count(*) AS n FROM rounds GROUP BY x),
             t AS (SELECT {bk} AS x, j.key, sum(TRY_CAST(j.value AS DOUBLE)) AS s
                   FROM rounds, json_each(rounds.timings) AS j GROUP BY ALL)
        SELECT x, t.key, t.s / n.n FROM t JOIN n USING (x) ORDER BY x""")
    txs = sorted({r[0] for r in rows})
    found = {r[1] for r in rows}
    phases = [p for p in PHASES if p in found] + sorted(found - set(PHASES))
    per_phase = {p: [0.0] * len(txs) for p in phases}
    for x, phase, v in rows:
        per_phase[phase][txs.index(x)] = v or 0.0
    if txs:
        ctx["plots"]["timing"] = stacked_area("plot-timing", txs, per_phase,
                                              label="seconds per phase per round")
    ctx["timing_totals"] = _rows(con, """
        SELECT j.key, sum(TRY_CAST(j.value AS DOUBLE)), count(*) FROM rounds,
        json_each(rounds.timings) AS j GROUP BY ALL ORDER BY 2 DESC""")
    return ctx


def _recovery(con: Any, bucket: int) -> dict[int, dict[str, tuple[float, float | None, int]]]:
    """Held-out recovery per round bucket and fault type: bucket -> fault type -> (sampled rate,
    greedy rate or None, samples), pooled over the bucket's `evals` of the tasks carrying the type
    (`recover:T` skills; the definition of the store's `recovery_rates` view, computed here over
    the base tables like every number of the page)."""
    n = len(RECOVER_PREFIX)
    rows = _rows(con, f"""
        WITH f AS (SELECT task_id, skill[{n + 1}:] AS fault_type
                   FROM (SELECT task_id, unnest(skills) AS skill FROM tasks)
                   WHERE starts_with(skill, '{RECOVER_PREFIX}') AND len(skill) > {n})
        SELECT {_bucket_sql(bucket, "e.round")} AS x, f.fault_type,
               sum(e.successes) / NULLIF(sum(e.k), 0), avg(e.greedy_success::INT),
               sum(e.k)::BIGINT
        FROM evals e JOIN f USING (task_id) GROUP BY ALL ORDER BY ALL""")
    out: dict[int, dict[str, tuple[float, float | None, int]]] = defaultdict(dict)
    for x, fault, rate, greedy, k in rows:
        if rate is not None:
            out[x][fault] = (rate, greedy, k)
    return dict(out)


def _mean_rate(rates: dict[str, tuple[float, float | None, int]]) -> float:
    """The mean held-out recovery rate: unweighted over the fault types present."""
    return sum(r for r, _, _ in rates.values()) / len(rates)


# (failure_id, task_id) of each generated task and the failure it came from: its `failure_ids`,
# or, for a generator that names only the parent, the parent's failures in the creation round.
_LINKS = """
    SELECT u.failure_id, t.task_id FROM tasks t, UNNEST(t.failure_ids) AS u(failure_id)
    WHERE t.origin = 'generated'
    UNION
    SELECT f.failure_id, t.task_id FROM tasks t
    JOIN failures f ON f.task_id = t.parent_task_id AND f.round = t.created_round
    WHERE t.origin = 'generated' AND len(coalesce(t.failure_ids, [])) = 0"""


def _fixes(con: Any) -> list[dict[str, Any]]:
    """Did training on the generated tasks fix the failures they came from? Per failure cluster
    (family, mode, sorted skills: what `failures.cluster_id` hashes, so older stores work too)
    that generated tasks came from: `round`, the first round its failures were mined in; `before`,
    its failures as a share of that round's train rollouts; `after`, the same share pooled over
    the later rounds, whose curriculum trains on those tasks (None while there is none);
    `trained_rollouts` on those tasks in the later rounds. As `generator_yield`'s
    `clusters_shrank`, per cluster rather than per generator. The `MAX_FIXES` clusters with the
    most failures in their mining round come first."""
    rows = _rows(con, f"""
        WITH fc AS (SELECT failure_id, round, family, mode, list_sort(skills) AS skills
                    FROM failures),
        mined AS (
          SELECT fc.family, fc.mode, fc.skills, min(t.created_round) AS g,
                 list(DISTINCT t.task_id) AS kids
          FROM ({_LINKS}) l JOIN fc USING (failure_id) JOIN tasks t USING (task_id)
          GROUP BY ALL),
        n AS (SELECT round, count(*) AS n FROM trajectories WHERE split = 'train'
              GROUP BY round),
        k AS (SELECT family, mode, skills, round, count(*) AS k FROM fc GROUP BY ALL)
        SELECT m.family, m.mode, m.skills, m.g,
               (SELECT sum(k.k) FROM k WHERE (k.family, k.mode, k.skills)
                   = (m.family, m.mode, m.skills) AND k.round = m.g)
                 / (SELECT sum(n.n) FROM n WHERE n.round = m.g) AS before,
               coalesce((SELECT sum(k.k) FROM k WHERE (k.family, k.mode, k.skills)
                   = (m.family, m.mode, m.skills) AND k.round > m.g), 0)
                 / (SELECT sum(n.n) FROM n WHERE n.round > m.g) AS after,
               (SELECT count(*) FROM trajectories r WHERE r.split = 'train' AND r.round > m.g
                   AND list_contains(m.kids, r.task_id)) AS trained,
               len(m.kids) AS n_tasks
        FROM mined m ORDER BY before DESC NULLS LAST, m.mode, m.family LIMIT ?""", [MAX_FIXES])
    return [{"family": family, "mode": mode, "skills": skills or [], "round": g,
             "before": before, "after": after, "trained_rollouts": trained, "n_tasks": n_tasks}
            for family, mode, skills, g, before, after, trained, n_tasks in rows]


def _gallery(con: Any) -> list[dict[str, Any]]:
    """A few failed rollouts (one failure mode after another; first those whose generated tasks
    were trained on, so their pass rate answers "did it fix the failure?", then those that led to
    the most generated tasks), each with the tasks generated from it and their latest pass rate.
    """
    picked = _rows(con, f"""
        WITH kids AS ({_LINKS}),
        trained AS (SELECT DISTINCT task_id FROM trajectories WHERE split = 'train'),
        counted AS (
          SELECT f.failure_id, any_value(f.traj_id) AS traj_id, any_value(f.task_id) AS task_id,
                 any_value(f.round) AS round, any_value(f.mode) AS mode,
                 any_value(f.evidence) AS evidence,
                 any_value(f.first_error_step) AS first_error_step, count(k.task_id) AS n_kids,
                 count(tr.task_id) AS n_trained
          FROM failures f LEFT JOIN kids k USING (failure_id)
          LEFT JOIN trained tr ON tr.task_id = k.task_id GROUP BY f.failure_id),
        ranked AS (
          SELECT *, row_number() OVER (PARTITION BY mode
                                       ORDER BY n_trained DESC, n_kids DESC, failure_id) AS rn
          FROM counted)
        SELECT r.failure_id, r.traj_id, r.task_id, r.round, r.mode, r.evidence,
               r.first_error_step, r.n_kids, t.messages, t.reward, t.finish_reason, t.answer
        FROM ranked r JOIN trajectories t USING (traj_id)
        WHERE r.rn <= ? ORDER BY r.rn, r.n_trained DESC, r.n_kids DESC, r.failure_id LIMIT ?""",
                   [GALLERY_SIZE, GALLERY_SIZE])
    if not picked:
        return []
    ids = [p[0] for p in picked]
    children = _rows(con, f"""
        SELECT l.failure_id, t.task_id, t.generator, t.created_round, t.prompt, t.answer, t.skills
        FROM ({_LINKS}) l JOIN tasks t USING (task_id)
        WHERE list_contains(?, l.failure_id) ORDER BY t.created_round, t.task_id""", [ids])
    child_ids = sorted({c[1] for c in children})
    latest = {r[0]: r[1:] for r in _rows(con, """
        SELECT task_id, arg_max(rate, round), max(round), arg_max(n, round) FROM (
          SELECT task_id, round, avg(success::INT) AS rate, count(*) AS n FROM trajectories
          WHERE list_contains(?, task_id) GROUP BY ALL) GROUP BY task_id""", [child_ids])}
    by_failure: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for fid, task_id, generator, created, prompt, answer, skills in children:
        if len(by_failure[fid]) >= CHILDREN_PER_FAILURE:
            continue
        text = " ".join(str(m.get("content", "")) for m in json.loads(prompt or "[]")
                        if m.get("role") == "user")
        rate, at, n = latest.get(task_id, (None, None, 0))
        by_failure[fid].append({"task_id": task_id, "generator": generator,
                                "created_round": created, "prompt": _cut(text),
                                "answer": answer, "skills": skills or [], "pass_rate": rate,
                                "pass_round": at, "pass_n": n})
    return [{"failure_id": fid, "traj_id": traj_id, "task_id": task_id, "round": rnd,
             "mode": mode, "evidence": evidence, "first_error_step": fes, "n_kids": n_kids,
             "turns": chat_turns(messages, fes), "reward": reward, "finish_reason": finish,
             "answer": answer, "children": by_failure.get(fid, [])}
            for (fid, traj_id, task_id, rnd, mode, evidence, fes, n_kids, messages, reward, finish,
                 answer) in picked]


def render_html(ctx: dict[str, Any]) -> str:
    """The page for `collect`'s context (autoescaped jinja2 template)."""
    from jinja2 import Environment, PackageLoader

    env = Environment(loader=PackageLoader("sentinel", "templates"), autoescape=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["pct"] = lambda v: "–" if v is None else f"{v:.3f}"
    return env.get_template("report.html.j2").render(**ctx)


def build_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of the run in `run_dir` (or a `.duckdb` file) to `out` (default
    `<run_dir>/report.html`) and return its path. Reads the store through one short read-only
    connection."""
    from task_store import Store

    store = Store(run_dir)
    with store.connect(read_only=True) as con:
        ctx = collect(con)
    ctx["store_path"] = str(store.path)
    out_path = Path(out) if out is not None else store.path.parent / "report.html"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render_html(ctx), encoding="utf-8")
    return out_path
