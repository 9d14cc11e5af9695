"""Dataset versions: what one veRL round trains on, as a file the loop writes and every veRL
process reads.

A version file is JSONL: a header line, then one task per line (`Task.to_row()`), in the order the
curriculum drew them. The header holds everything a veRL process needs to run and score those
tasks without Sentinel's run config: the version (the round), the `env` and `reward` configs and
each family's config. `item(version, i)` is a pure function of the file and `i`, so veRL's
sampler, a resumed job and a test see the same item at the same index.

Each item has the fields veRL's `RLHFDataset.__getitem__` returns (`data_source`, `prompt`,
`raw_prompt`, `reward_model.ground_truth`, `extra_info` with `index`/`tools_kwargs`, `index`,
`tools_kwargs`, `interaction_kwargs`), `agent_name` (Sentinel's agent loop) and, in
`extra_info["sentinel"]`, the task row and the configs (`SentinelContext`), which the agent loop
and the reward rebuild the task and its family from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sentinel.env.environment import EnvConfig
from sentinel.rewards import RewardConfig
from sentinel.tasks.base import TaskFamily
from sentinel.types import Task, canonical_json
from sentinel.verl import AGENT_NAME

FORMAT = "sentinel-verl-dataset"
FORMAT_VERSION = 1


class VersionError(ValueError):
    """A dataset version file that cannot be read as one; the message says why."""


@dataclass
class DatasetVersion:
    version: int
    env: dict[str, Any]
    reward: dict[str, Any]
    families: dict[str, dict[str, Any]]
    tasks: list[dict[str, Any]]
    agent_name: str = AGENT_NAME

    def __len__(self) -> int:
        return len(self.tasks)


def write_version(path: str | Path, tasks: list[Task], *, version: int, env: EnvConfig,
                  reward: RewardConfig, families: dict[str, TaskFamily],
                  agent_name: str = AGENT_NAME) -> Path:
    """Write `tasks` (in order: index i is `tasks[i]`) as dataset version `version`. Every task's
    family must be in `families`; their configs go into the header."""
    missing = sorted({t.family for t in tasks} - families.keys())
    if missing:
        raise VersionError(f"no family config for {', '.join(missing)}")
    header = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "version": version,
        "agent_name": agent_name, "env": env.model_dump(mode="json"),
        "reward": reward.model_dump(mode="json"),
        "families": {name: families[name].config.model_dump(mode="json")
                     for name in sorted({t.family for t in tasks})},
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(header, ensure_ascii=False) + "\n")
        for task in tasks:
            fh.write(json.dumps(task.to_row(), ensure_ascii=False) + "\n")
    tmp.replace(path)  # a veRL process never reads a half-written version
    return path


def read_version(path: str | Path) -> DatasetVersion:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not lines:
        raise VersionError(f"{path} is empty, not a Sentinel dataset version")
    header = json.loads(lines[0])
    if header.get("format") != FORMAT:
        raise VersionError(f"{path} is not a Sentinel dataset version (no {FORMAT!r} header)")
    if header.get("format_version") != FORMAT_VERSION:
        raise VersionError(f"{path} has format_version {header.get('format_version')!r}; this "
                           f"Sentinel reads {FORMAT_VERSION}")
    return DatasetVersion(version=header["version"], env=header["env"], reward=header["reward"],
                          families=header["families"],
                          tasks=[json.loads(line) for line in lines[1:] if line.strip()],
                          agent_name=header.get("agent_name", AGENT_NAME))


def item(version: DatasetVersion, index: int) -> dict[str, Any]:
    """Item `index` of the version, in the layout of veRL's `RLHFDataset.__getitem__` (no tensors:
    the dataset class adds veRL's `dummy_tensor`)."""
    row = version.tasks[index]
    task = Task.from_row(row)
    prompt = [dict(m) for m in task.prompt]
    context = {"version": version.version, "task": row, "env": version.env,
               "reward": version.reward, "family_config": version.families[task.family]}
    extra_info = {"index": index, "task_id": task.task_id, "family": task.family,
                  "version": version.version, "tools_kwargs": {}, "interaction_kwargs": {},
                  "need_tools_kwargs": False, "sentinel": context}
    return {
        "data_source": f"sentinel/{task.family}",
        "prompt": prompt,
        "raw_prompt": prompt,
        "ability": task.family,
        "reward_model": {"style": "rule", "ground_truth": task.answer},
        "extra_info": extra_info,
        "agent_name": version.agent_name,
        "index": index,
        "tools_kwargs": {},
        "interaction_kwargs": {},
    }


@dataclass
class SentinelContext:
    """What `extra_info["sentinel"]` carries, rebuilt: the task, its family, env and reward."""

    task: Task
    family: TaskFamily
    family_config: dict[str, Any]
    env: EnvConfig
    reward: RewardConfig
    version: int


@lru_cache(maxsize=64)
def _family(name: str, config_json: str) -> TaskFamily:
    from sentinel.tasks import load_family

    return load_family(name, json.loads(config_json))


def family_for(name: str, config: dict[str, Any]) -> TaskFamily:
    """The family `name` with `config`, built once per distinct config."""
    return _family(name, canonical_json(config))


def context_of(extra_info: dict[str, Any]) -> SentinelContext:
    """The Sentinel context of an item's `extra_info` (families are built once per config)."""
    try:
        ctx = extra_info["sentinel"]
    except (KeyError, TypeError):
        raise VersionError("extra_info has no 'sentinel' entry: the item does not come from "
                           "sentinel.verl.dataset.SentinelDataset") from None
    task = Task.from_row(ctx["task"])
    return SentinelContext(
        task=task, family=family_for(task.family, ctx["family_config"]),
        family_config=ctx["family_config"], env=EnvConfig(**ctx["env"]),
        reward=RewardConfig(**ctx["reward"]), version=ctx["version"])
