"""Runs a command and measures its processes' memory from outside, the same way whatever
they are (wick's ranks as threads of one process or as processes under mpirun, PyTorch's
processes under multiprocessing): every 10 ms, the resident size (VmRSS) of every process
in the command's tree. Passes the command's output through, then prints

    rss_peak ranks=<n> peak_mb=<sum of each rank's largest resident size>
             together_mb=<the largest sum of the ranks' sizes at one moment>
             steady_mb=<sum of each rank's largest size from the line `rss_peak steady` on>

where the ranks are the processes whose command line matches RANKS (a launcher, mpirun or
PyTorch's parent, is not a rank; nor is a matching process started by a rank, such as
torch.compile's compile workers: their largest sum at one moment is `helpers_mb`, printed
when there are any). Each process's own largest size is what `/usr/bin/time
-v` would report as its maximum resident set. The command prints `rss_peak steady` when its
measured steps begin (wick's `throughput --hf` and `torch_baseline.py --hf` do, on rank 0):
the steady-state step's peak is taken over the samples after it, so that loading and the
first steps' allocations are left out the same way on both sides (without the line,
steady_mb is not printed).

usage: python scripts/rss_peak.py RANKS -- COMMAND...
       (RSS_PEAK_VERBOSE=1: each counted process, its peak and command line, on stderr)
"""
import os
import re
import subprocess
import sys
import threading
import time

STEADY = "rss_peak steady"


def tree(root):
    """The pids of `root` and its descendants."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
    return found


def rss_cmd_and_parent(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(l.split(":", 1) for l in f if ":" in l)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        rss = int(status.get("VmRSS", "0 kB").split()[0]) * 1024
        return rss, cmd, int(status["PPid"])
    except (OSError, KeyError, ValueError):
        return None


def main():
    ranks = re.compile(sys.argv[1])
    command = sys.argv[sys.argv.index("--") + 1:]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1)
    steady = threading.Event()

    def forward():
        for line in child.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.strip() == STEADY:
                steady.set()

    reader = threading.Thread(target=forward)
    reader.start()
    peaks, steady_peaks, together, helpers, cmds = {}, {}, 0, 0, {}
    while child.poll() is None:
        now, helpers_now = 0, 0
        in_steady = steady.is_set()
        found = {pid: rss_cmd_and_parent(pid) for pid in tree(child.pid)}
        matching = {pid for pid, got in found.items() if got and ranks.search(got[1])}
        for pid in matching:
            rss, cmd, parent = found[pid]
            if parent in matching:
                helpers_now += rss
                continue
            peaks[pid] = max(peaks.get(pid, 0), rss)
            if in_steady:
                steady_peaks[pid] = max(steady_peaks.get(pid, 0), rss)
            cmds[pid] = cmd
            now += rss
        together = max(together, now)
        helpers = max(helpers, helpers_now)
        time.sleep(0.01)
    reader.join()
    if os.environ.get("RSS_PEAK_VERBOSE"):
        for pid, peak in peaks.items():
            print(f"rss_peak pid={pid} peak_mb={peak / 1e6:.0f} cmd={cmds[pid][:160]}",
                  file=sys.stderr)
    if child.returncode != 0:
        sys.exit(child.returncode)
    steady_mb = (f" steady_mb={sum(steady_peaks.values()) / 1e6:.0f}" if steady_peaks else "")
    helpers_mb = f" helpers_mb={helpers / 1e6:.0f}" if helpers else ""
    print(f"rss_peak ranks={len(peaks)} peak_mb={sum(peaks.values()) / 1e6:.0f} "
          f"together_mb={together / 1e6:.0f}{steady_mb}{helpers_mb}", flush=True)


if __name__ == "__main__":
    main()
