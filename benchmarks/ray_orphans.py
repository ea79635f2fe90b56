"""How long the processes of a local Ray cluster outlive a driver killed by SIGKILL (docs/faults.md).

    python benchmarks/ray_orphans.py [--num_cpus=1]

A driver process calls ray.init(include_dashboard=False) as `run.py sweep --launcher=ray` does without --address
(txjax.sweep.ray_launcher.connect), then is sent SIGKILL; every process of its cluster (its descendants, listed
before the kill) is polled every 0.2 s until it has gone (or 240 s, then it is killed). Writes the seconds each
lived on to benchmarks/results/ray_orphans_PLATFORM.json. Ray's gcs_server and raylet share the driver's fate
(PR_SET_PDEATHSIG); the raylet's agents notice their parent's death within about 2 s, then report it to the GCS,
which has gone: ray/_private/utils.py publish_error_to_driver waits 60 s (fixed) before they exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import common
import psutil
import ray

DRIVER = "import ray, sys, time; ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False); print('up', flush=True); time.sleep(600)"  # noqa: E501


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_cpus", type=int, default=1)
    parser.add_argument("--out", help="JSON path (default benchmarks/results/ray_orphans_PLATFORM.json)")
    args = parser.parse_args()
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(args.num_cpus)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert driver.stdout.readline().strip() == "up"
    time.sleep(3)  # the raylet starts its agents and an idle worker
    processes = {p.pid: p for p in psutil.Process(driver.pid).children(recursive=True)}
    names = {pid: _name(p) for pid, p in processes.items()}
    start = time.monotonic()
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    lived, alive = [], dict(processes)
    while alive and time.monotonic() - start < 240:
        for pid, process in list(alive.items()):
            if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
                lived.append({"process": names[pid], "seconds_after_sigkill": round(time.monotonic() - start, 1)})
                del alive[pid]
        time.sleep(0.2)
    for pid, process in alive.items():  # still there after 240 s: killed here
        lived.append({"process": names[pid], "seconds_after_sigkill": None})
        process.kill()
    rows = lived
    print(common.table(rows))
    path = common.save("ray_orphans", {"ray": ray.__version__, "rows": rows}, args.out)
    print(f"wrote {path}")


def _name(process: psutil.Process) -> str:
    """ray::DashboardAgent, gcs_server, raylet, ...: the process title or its program's file name."""
    line = process.cmdline()
    first = line[0] if line else process.name()
    if first.startswith("ray::"):
        return first.split()[0]
    script = next((a for a in line[1:] if a.endswith(".py")), first)
    return os.path.basename(script)


if __name__ == "__main__":
    main()
