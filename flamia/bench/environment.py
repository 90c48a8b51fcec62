"""What a result was measured on: device, library versions, GPU clocks, date, command."""
import datetime
import importlib.metadata
import platform
import re
import subprocess

import torch

# distribution names whose versions a report records (absent ones are left out)
DISTRIBUTIONS = ("torch", "triton", "numpy", "nvidia-cudnn-frontend", "flashinfer-python", "flash-attn-4",
                 "nvidia-cutlass-dsl", "sageattention", "flamia")
CLOCK_FIELDS = ("name", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.draw",
                "power.limit", "temperature.gpu", "driver_version")


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"cpu ({platform.machine()})"


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    if torch.cuda.is_available():
        found["cuda"] = torch.version.cuda
        found["cudnn (torch)"] = str(torch.backends.cudnn.version())
    return found


def gpu_clocks() -> "dict[str, str] | None":
    """nvidia-smi's view of GPU 0 at the time of the call, or None without it."""
    try:
        result = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(CLOCK_FIELDS)}", "--format=csv,noheader",
                                 "--id=0"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return dict(zip(CLOCK_FIELDS, (v.strip() for v in result.stdout.strip().split(","))))


def header(device: str, argv: list[str], protocol: dict, workloads: dict) -> dict:
    """The JSON header of a run: device, versions, date (UTC, ISO 8601), command, GPU
    clocks, the timing protocol and the workloads as run (name -> lengths, heads, ...)."""
    return {
        "device": device_name(device),
        "versions": versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["flamia", "bench", *argv]),
        "clocks": gpu_clocks() if device == "cuda" else None,
        "protocol": protocol,
        "workloads": workloads,
    }


def results_dirname(head: dict) -> str:
    """<date>-<device>, e.g. 2026-11-29-NVIDIA-H200."""
    device = re.sub(r"[^A-Za-z0-9]+", "-", head["device"]).strip("-")
    return f"{head['date'][:10]}-{device}"
