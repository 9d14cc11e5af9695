"""`data.custom_cls` for veRL 0.9: the items of a Sentinel dataset version.

veRL's `create_rl_dataset` (verl/trainer/ppo/utils.py) builds it as

    SentinelDataset(data_files=..., tokenizer=..., processor=..., config=data_config,
                    max_samples=...)

and checks that it is a `torch.utils.data.Dataset`; `data.train_files` names the version file
(`sentinel.verl.version.write_version`). Item `i` is `version.item(version, i)` plus veRL's
`dummy_tensor`, so it is the same for every process that reads the same file. The prompt is not
tokenised here: Sentinel's agent loop renders it with the tools of the task's family, as every
Sentinel rollout does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from sentinel.verl.version import DatasetVersion, VersionError, item, read_version


class SentinelDataset(Dataset):
    """The tasks of one or more dataset version files, in file order (`max_samples > 0` keeps
    the first `max_samples`)."""

    def __init__(self, data_files: str | list[str], tokenizer: Any, config: Any,
                 processor: Any = None, max_samples: int = -1) -> None:
        files = [data_files] if isinstance(data_files, str) else list(data_files)
        if not files:
            raise VersionError("data_files is empty: give the dataset version file")
        self.tokenizer, self.processor, self.config = tokenizer, processor, config
        self.versions: list[DatasetVersion] = [read_version(f) for f in files]
        self._index = [(v, i) for v in self.versions for i in range(len(v))]
        if max_samples is not None and max_samples > 0:
            self._index = self._index[:max_samples]

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, index: int) -> dict[str, Any]:
        version, i = self._index[index]
        row = item(version, i)
        # Across several files the position in this dataset is the item's index.
        row["index"] = row["extra_info"]["index"] = int(index)
        row["dummy_tensor"] = torch.tensor([0], dtype=torch.uint8)
        return row
