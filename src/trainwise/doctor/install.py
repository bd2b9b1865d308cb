"""Install guidance, decided from facts: which PyTorch wheel fits this driver and these cards, and how to
get the NVIDIA driver on this OS. Pure functions; the commands are the ones NVIDIA and PyTorch document.
"""
from __future__ import annotations

# Minimum Linux driver per CUDA toolkit (NVIDIA CUDA release notes, "CUDA Toolkit and Corresponding Driver
# Versions"). Within one major version, older drivers still run newer minor versions (minor-version
# compatibility) from the major's first release on.
DRIVER_FOR_CUDA: dict[tuple[int, int], str] = {
    (11, 0): "450.80.02", (11, 8): "520.61.05",
    (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03", (12, 3): "545.23.06",
    (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
    (12, 9): "575.51.03", (13, 0): "580.65.06",
}
# PyTorch wheel indexes (https://download.pytorch.org/whl/<tag>), oldest first, with the compute
# capabilities each one has kernels for (cu118 wheels end with torch 2.7; CUDA 13 dropped cards below 7.5).
TORCH_WHEELS: list[tuple[str, tuple[int, int], tuple[int, int], tuple[int, int]]] = [
    # tag, CUDA, lowest card, highest card
    ("cu118", (11, 8), (3, 7), (9, 0)),
    ("cu126", (12, 6), (5, 0), (9, 0)),
    ("cu128", (12, 8), (7, 0), (12, 0)),
    ("cu130", (13, 0), (7, 5), (12, 0)),
]
TORCH_INDEX = "https://download.pytorch.org/whl"
# NVIDIA's CUDA network repositories: (os id, version id) -> repo name.
NVIDIA_REPOS: dict[tuple[str, str], str] = {
    ("ubuntu", "20.04"): "ubuntu2004", ("ubuntu", "22.04"): "ubuntu2204", ("ubuntu", "24.04"): "ubuntu2404",
    ("debian", "11"): "debian11", ("debian", "12"): "debian12", ("debian", "13"): "debian13",
    ("rhel", "8"): "rhel8", ("rhel", "9"): "rhel9", ("rocky", "8"): "rhel8", ("rocky", "9"): "rhel9",
    ("almalinux", "8"): "rhel8", ("almalinux", "9"): "rhel9",
}


def parse_version(text: str | None) -> tuple[int, int] | None:
    """"12.4" -> (12, 4); None stays None."""
    if not text:
        return None
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def driver_for(cuda: tuple[int, int]) -> str | None:
    """The oldest driver that fully supports CUDA `cuda` (the closest listed toolkit at or below it)."""
    known = [v for v in DRIVER_FOR_CUDA if v <= cuda and v[0] == cuda[0]]
    return DRIVER_FOR_CUDA[max(known)] if known else None


def pick_torch_wheel(driver_cuda: tuple[int, int] | None,
                     capabilities: list[tuple[int, int]]) -> str | None:
    """The wheel index to install: kernels for every card, and a CUDA this driver runs. Prefers the newest
    CUDA the driver fully supports; otherwise the closest one of the driver's major version, which runs by
    minor-version compatibility (how PyTorch's own wheels are meant to be used)."""
    fitting = [(tag, cuda) for tag, cuda, lowest, highest in TORCH_WHEELS
               if all(lowest <= cc and cc[0] <= highest[0] for cc in capabilities)]
    if driver_cuda is None:
        return fitting[-1][0] if fitting else None
    full = [(tag, cuda) for tag, cuda in fitting if cuda <= driver_cuda]
    if full and full[-1][1][0] == driver_cuda[0]:
        return full[-1][0]
    same_major = [(tag, cuda) for tag, cuda in fitting if cuda[0] == driver_cuda[0]]
    if same_major:
        return same_major[0][0]
    return full[-1][0] if full else None


def torch_install_command(tag: str | None) -> str:
    tag = tag or "cpu"
    return f"pip install --force-reinstall torch --index-url {TORCH_INDEX}/{tag}"


def driver_install_steps(os_id: str | None, version_id: str | None, machine: str) -> str:
    """The shell steps that install the NVIDIA driver from NVIDIA's repository on this OS."""
    repo = NVIDIA_REPOS.get((os_id or "", _major_release(os_id, version_id)))
    arch = {"x86_64": "x86_64", "aarch64": "sbsa"}.get(machine, machine)
    if repo is None:
        return ("Install the NVIDIA driver for your distribution: "
                "https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/ ; then reboot.")
    base = f"https://developer.download.nvidia.com/compute/cuda/repos/{repo}/{arch}"
    if repo.startswith("rhel"):
        return (f"sudo dnf config-manager --add-repo {base}/cuda-{repo}.repo && sudo dnf clean all && "
                "sudo dnf -y install cuda-drivers && sudo reboot")
    return (f"wget {base}/cuda-keyring_1.1-1_all.deb && sudo dpkg -i cuda-keyring_1.1-1_all.deb && "
            "sudo apt-get update && sudo apt-get install -y cuda-drivers && sudo reboot")


def _major_release(os_id: str | None, version_id: str | None) -> str:
    # Ubuntu is keyed by "22.04"; Debian and RHEL-likes by their major number ("9.4" -> "9")
    if not version_id:
        return ""
    return version_id if os_id == "ubuntu" else version_id.split(".")[0]
