"""Runs a command and measures its processes' memory from outside, the same way whatever
they are (wick's ranks as threads of one process or as processes under mpirun, PyTorch's
processes under multiprocessing): every 10 ms, the resident size (VmRSS) of every process
in the command's tree. Passes the command's output through, then prints

    rss_peak ranks=<n> peak_mb=<sum of each rank's largest resident size>
             together_mb=<the largest sum of the ranks' sizes at one moment>

where the ranks are the processes whose command line matches RANKS (a launcher, mpirun or
PyTorch's parent, is not a rank). Each process's own largest size is what `/usr/bin/time
-v` would report as its maximum resident set.

usage: python scripts/rss_peak.py RANKS -- COMMAND...
       (RSS_PEAK_VERBOSE=1: each counted process, its peak and command line, on stderr)
"""
import os
import re
import subprocess
import sys
import time


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


def rss_and_cmd(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:")), 0)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        return rss, cmd
    except OSError:
        return None


def main():
    ranks = re.compile(sys.argv[1])
    command = sys.argv[sys.argv.index("--") + 1:]
    child = subprocess.Popen(command)
    peaks, together, cmds = {}, 0, {}
    while child.poll() is None:
        now = 0
        for pid in tree(child.pid):
            got = rss_and_cmd(pid)
            if got and ranks.search(got[1]):
                peaks[pid] = max(peaks.get(pid, 0), got[0])
                cmds[pid] = got[1]
                now += got[0]
        together = max(together, now)
        time.sleep(0.01)
    if os.environ.get("RSS_PEAK_VERBOSE"):
        for pid, peak in peaks.items():
            print(f"rss_peak pid={pid} peak_mb={peak / 1e6:.0f} cmd={cmds[pid][:160]}",
                  file=sys.stderr)
    if child.returncode != 0:
        sys.exit(child.returncode)
    print(f"rss_peak ranks={len(peaks)} peak_mb={sum(peaks.values()) / 1e6:.0f} "
          f"together_mb={together / 1e6:.0f}", flush=True)


if __name__ == "__main__":
    main()
