"""Sentinel inside veRL 0.9 (`trainer.backend: verl`, docs/verl.md).

veRL 0.8 removed the curriculum plug-ins (`data.sampler.class_path`, `DynamicGenDataset`), so
Sentinel plugs into what remains, round by round:

- `dataset.SentinelDataset` (`data.custom_cls`): the items of one *dataset version*, a JSONL
  file the loop writes each round (`version.write_version`): a header (version, env, reward and
  family configs) and one `Task.to_row()` per line. Item `i` is a pure function of the file and
  `i`, with `task_id` in `extra_info`.
- `agent_loop.SentinelAgentLoop` (registered as `sentinel_agent`): runs Sentinel's `Episode`
  (tools, fault schedules carried by the task spec) with veRL's server manager generating each
  turn; observations get response mask 0. Its episode record rides to the reward in
  `extra_fields`.
- `reward.compute_score` (`reward.custom_reward_function`): Sentinel's hybrid reward, `score`
  and every term, plus the record the ingest reads back.
- `ingest.ingest_dump` (`sentinel ingest verl-rollouts DIR --run-dir RUN`): the JSONL files
  veRL writes to `trainer.rollout_data_dir`, into the store as a committed round, failures mined.
- `launch.overrides` (the Hydra overrides of `python -m verl.trainer.main_ppo`) and
  `round.run_round` (one round: write the version, launch veRL, ingest).

Only `agent_loop` imports veRL; the rest runs in Sentinel's own environment too.
"""

AGENT_NAME = "sentinel_agent"
