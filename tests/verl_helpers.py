"""Shared by the veRL tests (tests/test_verl_*.py): tasks with a fault schedule, an episode
played by a scripted policy (the family's reference turns, tools really run), and one dump line
in veRL's format made from a `compute_score` result."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode
from sentinel.env.parser import HermesParser, format_answer
from sentinel.rewards import RewardConfig
from sentinel.tasks import load_family
from sentinel.tasks.base import TaskFamily
from sentinel.types import Task
from sentinel.verl.version import write_version

ENV = EnvConfig(max_turns=6, max_tokens=400, max_turn_tokens=48)
REWARD = RewardConfig()


def arith_family() -> TaskFamily:
    return load_family("arith", {"fault_types": ["timeout"]})


def tasks_with_fault(family: TaskFamily, n: int, seed: int = 0) -> list[Task]:
    """`n` arith tasks, each with a `timeout` on its first calculator call."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        spec = family.with_fault(family.without_faults(family.sample_spec(rng)), "timeout", rng)
        if spec is not None:
            out.append(family.make_task(spec))
    return out


def write_dataset(path: Path, tasks: list[Task], family: TaskFamily, version: int = 1) -> Path:
    return write_version(path, tasks, version=version, env=ENV, reward=REWARD,
                         families={family.name: family})


def reference_turns(family: TaskFamily, task: Task, *, wrong: bool = False) -> list[str]:
    """The reference assistant turns; `wrong` replaces the final answer with a wrong one."""
    turns = family.solve(task.spec, family.tool_map(task.spec)).assistant_turns()
    if wrong:
        turns[-1] = format_answer(str(int(task.answer) + 1))
    return turns


def scripted_episode(family: TaskFamily, task: Task, chat: ChatFormat, *,
                     wrong: bool = False) -> Episode:
    """`task` played by a policy that writes the reference turns (tools and faults real)."""
    episode = Episode(task, family.tool_map(task.spec), chat, HermesParser(), ENV,
                      random.Random(0))
    for text in reference_turns(family, task, wrong=wrong):
        if episode.done:
            break
        ids = chat.assistant_ids(text)
        episode.add_policy_turn(ids, [-0.5] * len(ids))
    return episode


def dump_line(result: dict[str, Any], *, step: int, ground_truth: str) -> dict[str, Any]:
    """One line as veRL 0.9.1's `RayPPOTrainer._write_generations` writes it: input, output,
    gts, score, step, then every reward_extra_info key."""
    return {"input": "prompt text", "output": "response text", "gts": ground_truth,
            "score": result["score"], "step": step, **result}


def loop_config(python: str, **over: Any) -> dict[str, Any]:
    """A 1-round loop on the tiny policy with `trainer.backend: verl` run by `python`."""
    return {
        "seed": 3, "rounds": 1,
        "policy": {"tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4}},
        "families": [{"type": "arith", "max_operands": 2, "instruction": ""}],
        "env": {"max_turns": 2, "max_tokens": 96, "max_turn_tokens": 24},
        "sft": {"steps": 4, "batch_size": 4, "num_examples": 8},
        "trainer": {"backend": "verl", "verl": {"python": python, "timeout_s": 300,
                                                "max_prompt_length": 256}},
        "batch": {"steps_per_round": 2, "tasks_per_step": 2, "group_size": 2},
        "eval": {"num_tasks": 2, "samples": 1, "greedy": False},
        "generators": [],
    } | over
