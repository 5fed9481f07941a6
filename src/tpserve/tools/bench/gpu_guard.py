"""GPU guard for benchmarks: samples SM clock, temperature and clock-throttle reasons of every
local GPU through NVML (the optional `nvidia-ml-py` package) during a run. A run during which
any GPU was slowed by power, thermal or hardware limits is flagged as throttled.

No NVML (no package, no driver, a CPU machine): the guard reports "no GPU" and flags nothing.
It watches the GPUs of the machine it runs on, so it only means something when the client
runs beside the server.
"""

from __future__ import annotations

import threading
import time

# nvmlClocksThrottleReason* bits that mean "slower than it could be" (not idle, not app clocks)
THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


def _load_nvml():
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return None, "no GPU (nvidia-ml-py not installed)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
        return None, f"no GPU (NVML: {exc})"
    return pynvml, None


class GpuGuard:
    """Use as a context manager around the run; `summary()` afterwards."""

    def __init__(self, interval_s: float = 0.5, nvml=None):
        self.interval = interval_s
        self.nvml, self.note = (nvml, None) if nvml is not None else _load_nvml()
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = None
        self.handles = []
        if self.nvml is not None:
            n = self.nvml.nvmlDeviceGetCount()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            if not self.handles:
                self.nvml, self.note = None, "no GPU (NVML sees none)"

    def sample(self) -> None:
        nv, now = self.nvml, time.time()
        for i, h in enumerate(self.handles):
            reasons = _reasons(nv, h)
            self.samples.append({
                "t": now, "gpu": i,
                "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "sm_clock_max_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
                "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                "throttle": [name for bit, name in THROTTLE_BITS.items() if reasons & bit],
            })

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> GpuGuard:
        if self.nvml is not None:
            self._thread = threading.Thread(target=self._loop, name="gpu-guard", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self.sample()

    def summary(self) -> dict:
        if self.nvml is None:
            return {"gpu": False, "note": self.note, "throttled": False}
        s = self.samples
        reasons = sorted({r for x in s for r in x["throttle"]})
        return {"gpu": True, "gpus": len(self.handles), "samples": len(s), "throttled": bool(reasons),
                "throttle_reasons": reasons,
                "sm_clock_mhz_min": min((x["sm_clock_mhz"] for x in s), default=None),
                "sm_clock_mhz_max": max((x["sm_clock_mhz"] for x in s), default=None),
                "sm_clock_max_mhz": max((x["sm_clock_max_mhz"] for x in s), default=None),
                "temperature_c_max": max((x["temperature_c"] for x in s), default=None)}

    def line(self) -> str:
        s = self.summary()
        if not s["gpu"]:
            return f"GPU guard: {s['note']}"
        flag = f"THROTTLED ({', '.join(s['throttle_reasons'])})" if s["throttled"] else "not throttled"
        return (f"GPU guard: {s['gpus']} GPU(s), {s['samples']} samples, SM clock {s['sm_clock_mhz_min']}-"
                f"{s['sm_clock_mhz_max']} MHz (max {s['sm_clock_max_mhz']}), up to {s['temperature_c_max']} C: {flag}")


def _reasons(nv, handle) -> int:
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        if fn is not None:
            try:
                return int(fn(handle))
            except Exception:  # noqa: BLE001 - not supported on this GPU
                return 0
    return 0
