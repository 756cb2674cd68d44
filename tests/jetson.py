"""What `agentctl doctor`'s Jetson checks find on an arm64 Debian that is not a Jetson.

The same expectation for the emulated arm64 root of tests/test_deb.py (the real package
under qemu) and for the fake host of tests/test_doctor_jetson.py that stands for it: no
L4T, no GPU nodes, no vendor builds; with the shipped CPU config they are warnings.
"""

from __future__ import annotations

ARM64_DEBIAN_JETSON: dict[str, str] = {
    "L4T": "warn",
    "vendor torch": "skip",
    "vendor vllm": "skip",
    "vendor ctranslate2": "skip",
    "/dev/nvmap": "warn",
    "/dev/nvhost-*": "warn",
    "device policy": "ok",
    "groups video, render": "ok",
}
