"""Tasks that start from a revealed prefix (`Task.prefix`) and the `restart` generator that mines
them: the environment replays the prefix untrained, the reward and the analyzer never charge it,
GRPO gets nothing from its tokens, validation refuses prefixes that leave the policy nothing,
and the store and a resumed curriculum keep the prefix. Real tiny policy, real environment, real
DuckDB file; the last test runs the loop with `restart` for two rounds."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from generators import GenerationContext, Replay, RestartConfig, RestartGenerator
from generators.validate import validate_candidates
from sentinel.analyzer import FailureAnalyzer
from sentinel.config import CurriculumConfig
from sentinel.curriculum import Curriculum
from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode, FaultConfig, replay
from sentinel.env.parser import HermesParser, format_answer, format_call
from sentinel.rewards import RewardConfig, score
from sentinel.rollout import Rollouts, build_backend
from sentinel.tasks.arith import ArithFamily
from sentinel.types import Candidate, Task, Trajectory, canonical_json, task_id_for
from task_store import Store
from tests.test_loop_fast import config as fast_config
from tests.test_loop_fast import run_loop
from trainers.grpo import GRPOConfig, GRPOTrainer

ENV = EnvConfig(max_turns=4, max_tokens=256, max_turn_tokens=24)
REWARD = RewardConfig()
EXPR = "(3+4)*5"  # reference: 3+4 -> 7, 7*5 -> 35
TIMEOUT = [{"type": "timeout", "call": 0}]


def call(expression: str) -> str:
    return format_call("calculator", {"expression": expression})


def with_prefix(task: Task, prefix: list[str]) -> Task:
    return dataclasses.replace(task, prefix=list(prefix), task_id="")


def nothing_known(ids: Any) -> set[str]:
    return set()


def scripted(task: Task, turns: list[str], arith: ArithFamily, chat: ChatFormat,
             parser: HermesParser) -> Trajectory:
    """`turns` played through the real environment after `task`'s prefix, scored."""
    traj = replay(task, turns, arith.tool_map(task.spec), chat, parser, ENV)
    traj.reward, traj.reward_terms, traj.success = score(task, traj, arith, REWARD)
    return traj


def context(task: Task, arith: ArithFamily, chat: ChatFormat, parser: HermesParser) -> list[int]:
    """The ids of the prompt and the replayed prefix with its observations: the policy's start."""
    return replay(task, [], arith.tool_map(task.spec), chat, parser, ENV).token_ids


# -- core type ------------------------------------------------------------------------------------


def test_the_prefix_is_part_of_the_task_id_and_an_empty_one_keeps_the_old_id(arith) -> None:
    task = arith.make_task({"expr": EXPR})
    old = hashlib.sha256(f"arith\x00{canonical_json(task.spec)}".encode()).hexdigest()[:16]
    assert task.task_id == task_id_for("arith", task.spec, []) == f"arith-{old}"
    one, two = with_prefix(task, [call("3+4")]), with_prefix(task, [call("3+5")])
    assert len({task.task_id, one.task_id, two.task_id}) == 3
    assert one.task_id == with_prefix(task, [call("3+4")]).task_id
    assert Task.from_row(one.to_row()) == one
    assert Task.from_row(task.to_row()) == task and task.to_row()["prefix"] is None


# -- environment, reward, analyzer ----------------------------------------------------------------


def test_policy_rollouts_start_after_the_untrained_prefix(tiny_policy, chat, arith,
                                                           parser) -> None:
    """Real rollouts of the tiny policy: every token of the prompt and the replayed prefix turn
    (and its observation) has mask 0 and log-prob 0.0; the policy's first turn starts right after
    it with mask 1; the revealed step is marked; prompt_len is still the prompt's."""
    model, tokenizer = tiny_policy
    task = arith.make_task({"expr": EXPR})
    prefixed = with_prefix(task, [call("3+4")])
    start = context(prefixed, arith, chat, parser)
    plain = Episode(task, arith.tool_map(task.spec), chat, parser, ENV, random.Random(0))
    rollouts = Rollouts(build_backend("hf", model, tokenizer, batch_size=8), chat, parser,
                        {"arith": arith}, ENV, REWARD, temperature=1.0, rng=random.Random(0))
    trajs = rollouts.run([prefixed], 4, split="train", round=1, group_prefix="g")
    for traj in trajs:
        n = len(start)
        assert traj.token_ids[:n] == start
        assert traj.loss_mask[:n] == [0] * n and traj.logprobs[:n] == [0.0] * n
        assert traj.loss_mask[n] == 1 and traj.n_policy_tokens > 0
        assert traj.prompt_len == plain.prompt_len < n
        assert traj.steps[0].revealed and traj.steps[0].observation == "7"
        assert not any(s.revealed for s in traj.steps[1:]) and traj.steps[1].turn == 1


def test_prefix_turns_count_towards_the_turn_limit(chat, arith, parser) -> None:
    task = with_prefix(arith.make_task({"expr": EXPR}), [call("3+4")])
    env = ENV.model_copy(update={"max_turns": 2})
    episode = Episode(task, arith.tool_map(task.spec), chat, parser, env, random.Random(0))
    assert (episode.turns, episode.done, episode.prefix_problem) == (1, False, None)
    ids = chat.assistant_ids(call("7*5"))
    episode.add_policy_turn(ids, [-0.5] * len(ids))
    assert episode.done and episode.finish_reason == "max_turns"


def test_random_faults_spare_the_prefix_so_every_sample_starts_alike(chat, arith,
                                                                    parser) -> None:
    task = with_prefix(arith.make_task({"expr": EXPR}), [call("3+4")])
    flaky = ENV.model_copy(update={"faults": FaultConfig(rate=1.0)})
    episode = Episode(task, arith.tool_map(task.spec), chat, parser, flaky, random.Random(0))
    assert episode.steps[0].observation == "7"
    ids = chat.assistant_ids(call("7*5"))
    episode.add_policy_turn(ids, [-0.5] * len(ids))
    assert episode.steps[1].error_kind in ("timeout", "tool_error")


def test_revealed_steps_are_never_charged_to_the_policy(chat, arith, parser) -> None:
    """A malformed revealed turn costs neither `format` nor `process`; an unrecovered fault met
    in the prefix is blamed on the policy's first step, not on the revealed one."""
    task = arith.make_task({"expr": EXPR})
    sloppy = with_prefix(task, ["<tool_call>{oops</tool_call>"])
    traj = scripted(sloppy, [call("3+4"), call("7*5"), format_answer("35")], arith, chat, parser)
    assert traj.steps[0].revealed and traj.steps[0].error_kind == "parse"
    assert traj.success and traj.reward_terms == {"outcome": 1.0, "format": 1.0, "process": 1.0}

    faulty = arith.make_task({"expr": EXPR, "faults": TIMEOUT})
    prefixed = with_prefix(faulty, [call("3+4")])
    traj = scripted(prefixed, [format_answer("7")], arith, chat, parser)
    assert traj.steps[0].revealed and traj.steps[0].error_kind == "timeout"
    failure = FailureAnalyzer({"arith": arith}).classify(prefixed, traj)
    assert failure is not None and failure.mode == "tool_error_unrecovered"
    assert failure.first_error_step == 1


# -- the reference continuation and validation ----------------------------------------------------


def test_reference_trajectory_replays_the_prefix_then_the_reference_continuation(
        chat, arith, parser) -> None:
    task = arith.make_task({"expr": EXPR})
    on_path = arith.reference_trajectory(with_prefix(task, [call("3+4")]), chat, parser, ENV)
    assert [(s.arguments, s.revealed) for s in on_path.steps[:2]] == [
        ({"expression": "3+4"}, True), ({"expression": "7*5"}, False)]
    assert on_path.steps[2].answer == "35" and len(on_path.steps) == 3
    # Off the reference's path (a wrong first call): the solver from the state reached.
    off_path = arith.reference_trajectory(with_prefix(task, [call("3+5")]), chat, parser, ENV)
    assert [s.arguments["expression"] for s in off_path.steps[:3]] == ["3+5", "3+4", "7*5"]
    assert off_path.answer == "35"
    for traj in (on_path, off_path):
        n = len(context(with_prefix(task, [traj.steps[0].text]), arith, chat, parser))
        assert set(traj.loss_mask[:n]) == {0} and traj.loss_mask[n] == 1


def test_validation_replays_prefixes_and_rejects_those_that_leave_nothing(
        chat, arith, parser) -> None:
    task = arith.make_task({"expr": EXPR})
    two = [call("3+4"), call("7*5")]
    tight = ENV.model_copy(update={"max_tokens": len(context(with_prefix(task, two), arith,
                                                                 chat, parser)) + 2})

    def check(prefix: Any, env: EnvConfig | None = ENV) -> tuple[list[Task], list]:
        candidate = Candidate(family="arith", spec=task.spec, prefix=prefix,
                              parent_task_id=task.task_id)
        return validate_candidates([candidate], generator="restart", families={"arith": arith},
                                   known_task_ids=nothing_known, round=1,
                                   replay=None if env is None else Replay(chat, parser, env))

    (accepted,), none = check(two)
    assert none == [] and accepted.prefix == two and accepted.origin == "generated"
    assert accepted.task_id == task_id_for("arith", task.spec, two) != task.task_id
    for prefix, env, why in [([format_answer("35")], ENV, "ended the episode (answer)"),
                             (two, tight, "ended the episode (max_tokens)"),
                             (two, None, "no environment"),
                             ([call("3+4"), "so the answer is 7"], ENV, "(stop)")]:
        tasks, (rejection,) = check(prefix, env)
        assert tasks == [] and rejection.reason == "bad_prefix" and why in rejection.detail
        assert json.dumps(prefix[0])[1:-1] in rejection.detail  # the prefix is on record
    assert check(two, tight.model_copy(update={"max_tokens": tight.max_tokens + 8}))[0]
    tasks, (rejection,) = check([3])
    assert rejection.reason == "not_a_candidate" and "prefix" in rejection.detail


# -- the generator ---------------------------------------------------------------------------------


def generate(failures: list, tasks: list[Task], trajs: list[Trajectory], arith: ArithFamily,
             mastered: list[Task] | None = None, **options: Any) -> list[Candidate]:
    ctx = GenerationContext(round=1, failures=failures, tasks={t.task_id: t for t in tasks},
                            families={"arith": arith}, rng=random.Random(0), budget=16,
                            mastered=mastered or [], trajectories={t.traj_id: t for t in trajs})
    return list(RestartGenerator(RestartConfig(**options)).generate(ctx))


def failed(task: Task, turns: list[str], arith, chat, parser) -> tuple[Any, Trajectory]:
    traj = scripted(task, turns, arith, chat, parser)
    failure = FailureAnalyzer({"arith": arith}).classify(task, traj)
    assert failure is not None
    return failure, traj


def test_restart_reveals_the_turns_before_the_first_error(chat, arith, parser) -> None:
    task = arith.make_task({"expr": EXPR})
    # Two calls in the first turn (steps 0 and 1), the copy error in the second (step 2).
    turns = [call("3+4") + call("3+4"), call("7*6"), format_answer("42")]
    failure, traj = failed(task, turns, arith, chat, parser)
    assert failure.first_error_step == 2
    (candidate,) = generate([failure], [task], [traj], arith)
    assert candidate.prefix == turns[:1]
    assert (candidate.spec, candidate.parent_task_id, candidate.failure_ids) == (
        task.spec, task.task_id, [failure.failure_id])

    # The first turn was already wrong: nothing to reveal.
    failure, traj = failed(task, [call("3+5"), call("8*5"), format_answer("40")], arith, chat,
                           parser)
    assert (failure.mode, failure.first_error_step) == ("wrong_answer", 0)
    assert generate([failure], [task], [traj], arith) == []


def test_restart_starts_right_after_a_fault_met_in_the_first_turn(chat, arith, parser) -> None:
    task = arith.make_task({"expr": EXPR, "faults": TIMEOUT})
    turns = [call("3+4"), format_answer("7")]
    failure, traj = failed(task, turns, arith, chat, parser)
    assert (failure.mode, failure.first_error_step) == ("tool_error_unrecovered", 0)
    (candidate,) = generate([failure], [task], [traj], arith)
    assert candidate.prefix == [call("3+4")]
    # The restart task failing again at its first own turn reveals nothing new.
    restarted = with_prefix(task, candidate.prefix)
    again, traj = failed(restarted, [format_answer("7")], arith, chat, parser)
    assert again.first_error_step == 1
    assert generate([again], [restarted], [traj], arith) == []


def test_restart_shrinks_the_prefix_of_a_task_the_policy_now_solves(chat, arith, parser) -> None:
    task = arith.make_task({"expr": EXPR})
    two = with_prefix(task, [call("3+4"), call("7*5")])
    solved = [scripted(two, [format_answer("35")], arith, chat, parser) for _ in range(3)]
    failure, wrong = failed(two, [format_answer("36")], arith, chat, parser)
    rollouts = [*solved, wrong]  # pass rate 0.75
    assert generate([failure], [two], rollouts, arith) == []  # not above shrink_above 0.75
    (shrunk,) = generate([failure], [two], rollouts, arith, shrink_above=0.5)
    assert (shrunk.prefix, shrunk.spec, shrunk.parent_task_id) == ([call("3+4")], task.spec,
                                                                   two.task_id)
    # Down to the empty prefix (the plain task), for a mastered task rolled out this round.
    one = with_prefix(task, [call("3+4")])
    ran = [scripted(one, [call("7*5"), format_answer("35")], arith, chat, parser)]
    (empty,) = generate([], [], ran, arith, mastered=[one])
    assert empty.prefix == [] and empty.parent_task_id == one.task_id
    assert generate([], [], [], arith, mastered=[one]) == []  # not rolled out this round
    (plain,), _ = validate_candidates([empty], generator="restart", families={"arith": arith},
                                      known_task_ids=nothing_known, round=2)
    assert plain.task_id == task.task_id


# -- GRPO ------------------------------------------------------------------------------------------


def test_grpo_gets_nothing_from_prefix_tokens(tiny_policy, chat, arith, parser) -> None:
    """Prefix-task rollouts: loss and gradients are the same with the prompt+prefix shared per
    group as with every row run whole, and the same when the log-prob targets of the prefix
    tokens are changed (they carry no loss)."""
    model, tokenizer = tiny_policy
    tasks = [with_prefix(arith.make_task({"expr": EXPR}), [call("3+4")]),
             with_prefix(arith.make_task({"expr": "2*3+1"}), [call("2*3")])]
    rollouts = Rollouts(build_backend("hf", model, tokenizer, batch_size=8), chat, parser,
                        {"arith": arith}, ENV, REWARD, temperature=1.0, rng=random.Random(1))
    batch = rollouts.run(tasks, 3, split="train", round=1, group_prefix="g")
    adv = [0.9, -0.4, 0.3, -1.1, 0.6, 0.2]
    starts = [len(context(tasks[i // 3], arith, chat, parser)) for i in range(6)]
    moved = [dataclasses.replace(t, logprobs=[-4.0] * s + t.logprobs[s:])
             for t, s in zip(batch, starts, strict=True)]

    def gradients(trajs: list[Trajectory], share: bool) -> tuple[float, dict[str, torch.Tensor]]:
        cfg = GRPOConfig(share_prefix=share, temperature=1.0, loss_agg="token-mean")
        trainer = GRPOTrainer(model, cfg, tokenizer.pad_token_id)
        loss = trainer.accumulate_gradients(trajs, adv)["loss"]
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        trainer.optimizer.zero_grad(set_to_none=True)
        return loss, grads

    base_loss, base = gradients(batch, share=False)
    assert any(g.abs().sum() > 0 for g in base.values())
    for trajs, share in [(batch, True), (moved, False), (moved, True)]:
        loss, grads = gradients(trajs, share)
        assert loss == pytest.approx(base_loss, abs=1e-6)
        for name, g in base.items():
            assert torch.allclose(grads[name], g, atol=1e-5), name


# -- store and resume ------------------------------------------------------------------------------


def test_store_keeps_the_prefix_and_the_revealed_steps(tmp_path: Path, chat, arith,
                                                       parser) -> None:
    task = arith.make_task({"expr": EXPR})
    prefixed = with_prefix(task, [call("3+4")])
    traj = scripted(prefixed, [call("7*5"), format_answer("35")], arith, chat, parser)
    store = Store.create(tmp_path / "s.duckdb", run_id="run-1", config={})
    store.record_round(1, {"round": 1}, tasks=[task.to_row(), prefixed.to_row()],
                       trajectories=[traj.to_row()],
                       steps=[s.to_row(traj.traj_id) for s in traj.steps])
    back = {row["task_id"]: Task.from_row(row) for row in store.load_tasks()}
    assert back == {task.task_id: task, prefixed.task_id: prefixed}
    assert store.query("SELECT prefix IS NULL FROM tasks ORDER BY prefix IS NULL")[1] == [
        (False,), (True,)]
    assert store.query("SELECT step, turn, revealed FROM steps ORDER BY step")[1] == [
        (0, 0, True), (1, 1, False), (2, 2, False)]


def test_an_upgraded_store_reads_old_rows_as_tasks_and_steps_without_prefix(
        tmp_path: Path) -> None:
    from tests.test_store import v1_store

    path = v1_store(tmp_path / "old.duckdb")
    store = Store(path)
    store.upgrade()
    assert store.query("SELECT traj_id, turn, revealed FROM steps ORDER BY traj_id")[1] == [
        ("t1", None, False), ("t2", None, False)]
    tasks = [Task.from_row(row) for row in store.load_tasks()]
    assert [(t.task_id, t.prefix) for t in tasks] == [("arith-a", []), ("arith-b", [])]


def test_a_resumed_curriculum_samples_the_same_prefix_tasks(tmp_path: Path, tiny_policy,
                                                            arith) -> None:
    """The curriculum's state goes through a real checkpoint file and back: the mined prefix
    tasks come back whole (prefix and id), and the resumed sampler draws as the original."""
    from trainers.checkpoint import load_checkpoint, save_checkpoint

    model, tokenizer = tiny_policy
    task = arith.make_task({"expr": EXPR})
    mined = [with_prefix(task, [call("3+4")]), with_prefix(task, [call("3+4"), call("7*5")])]

    def curriculum() -> Curriculum:
        return Curriculum.from_config(CurriculumConfig(mined_fraction=1.0), arith.sample_task,
                                      seed=3, excluded_ids=set())

    original = curriculum()
    original.add_mined(mined)
    trainer = GRPOTrainer(model, GRPOConfig(), tokenizer.pad_token_id)
    save_checkpoint(tmp_path / "ckpt.pt", model, trainer,
                    extra={"curriculum": original.state_dict()})
    resumed = curriculum()
    resumed.load_state_dict(load_checkpoint(tmp_path / "ckpt.pt", model, trainer)["curriculum"])
    assert {t: resumed.tasks[t] for t in resumed.mined} == {t.task_id: t for t in mined}
    drawn = [original.sample(2) for _ in range(3)]
    assert [resumed.sample(2) for _ in range(3)] == drawn
    assert {len(t.prefix) for batch in drawn for t in batch} == {1, 2}


# -- the loop --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def restart_run(tmp_path_factory) -> Path:
    """Two rounds with `restart` on faulted 2-operand tasks (every task's one call times out):
    round 1 mines restart tasks from its failures, round 2 trains on them."""
    cfg = fast_config()
    cfg.update(rounds=2, generators=[{"type": "restart"}],
               families=[{"type": "arith", "max_operands": 2, "fault_share": 1.0,
                          "fault_types": ["timeout"]}],
               env={"max_turns": 4, "max_tokens": 160, "max_turn_tokens": 24},
               curriculum={"drop_zero_variance": False})
    run_dir = tmp_path_factory.mktemp("restart-loop")
    run_loop(cfg, run_dir)
    return run_dir


def test_the_loop_mines_restart_tasks_and_trains_on_them(restart_run: Path) -> None:
    from sentinel.policy import load_policy

    store = Store(restart_run / "sentinel.duckdb")
    rows = store.load_tasks(origin="generated")
    mined = [Task.from_row(r) for r in rows if r["generator"] == "restart"]
    assert mined and all(t.prefix and t.created_round == 1 for t in mined[:1])
    round1 = [t for t in mined if t.created_round == 1]
    assert round1 and all(t.failure_ids and t.parent_task_id for t in round1)
    ids = [t.task_id for t in round1]
    trained = store.query(
        "SELECT task_id, token_ids, loss_mask FROM trajectories WHERE round = 2 AND "
        "split = 'train' AND list_contains(?, task_id)", [ids])[1]
    assert trained
    _, tokenizer = load_policy(restart_run / "policy")
    chat = ChatFormat(tokenizer)
    family = ArithFamily(ArithFamily.config_model(max_operands=2, fault_share=1.0,
                                                  fault_types=["timeout"]))
    env = EnvConfig(max_turns=4, max_tokens=160, max_turn_tokens=24)
    by_id = {t.task_id: t for t in round1}
    for task_id, token_ids, loss_mask in trained:
        task = by_id[task_id]
        start = replay(task, [], family.tool_map(task.spec), chat, HermesParser(), env).token_ids
        assert list(token_ids[:len(start)]) == start
        assert set(loss_mask[:len(start)]) == {0} and loss_mask[len(start)] == 1
    revealed = store.query(
        "SELECT count(*) FROM steps s JOIN trajectories t USING (traj_id) "
        "WHERE t.round = 2 AND s.revealed")[1][0][0]
    assert revealed >= len(trained)
    # Trained on: the trainer's batch held every round-2 rollout's policy tokens, theirs too.
    (metrics,) = store.query("SELECT metrics FROM rounds WHERE round = 2")[1][0]
    total = store.query("SELECT sum(list_sum(loss_mask)) FROM trajectories "
                        "WHERE round = 2 AND split = 'train'")[1][0][0]
    assert json.loads(metrics)["n_tokens"] == total
    assert all(sum(mask) > 0 for _, _, mask in trained)
