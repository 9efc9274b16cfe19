"""The environment of a subprocess test that simulates several CPU devices: ours (the suite's
XLA flags and compilation cache, see conftest.py) plus the device count."""

import os


def cpu_devices(n: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) with ``n`` host-platform devices on the CPU backend."""
    env = dict(os.environ if env is None else env)
    flags = env.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count=")]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={n}"])
    env["JAX_PLATFORMS"] = "cpu"
    return env
