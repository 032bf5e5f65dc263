"""The table of `scripts/real-size-rows.sh`'s log: for each config and side (wick threads,
wick processes, torch eager and compiled), tokens/s and the peaks (the run's and the
steady-state step's) as the median [min-max] of the rounds, and the largest size of the
processes a rank started (torch.compile's compile workers), not counted in the ranks'.

usage: python scripts/real_size_table.py LOG
"""
import re
import statistics
import sys
from collections import defaultdict


def fields(line):
    return dict(re.findall(r"(\w+)=(\S+)", line))


def cell(values, digits=0):
    if not values:
        return ""
    fmt = f"{{:.{digits}f}}"
    return (f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def main():
    rows = defaultdict(lambda: defaultdict(list))
    side = None
    for line in open(sys.argv[1]):
        f = fields(line)
        key = f.get("config")
        if "impl" in f:
            side = (f"wick {f['transport']}" if f["impl"] == "wick"
                    else f"torch FSDP2 {f['mode']}")
            rows[(key, side)]["tokens_per_s"].append(float(f["tokens_per_s"]))
        elif line.split()[1] == "rss_peak":
            rows[(key, side)]["peak_gb"].append(float(f["peak_mb"]) / 1000)
            rows[(key, side)]["together_gb"].append(float(f["together_mb"]) / 1000)
            if "steady_mb" in f:
                rows[(key, side)]["steady_gb"].append(float(f["steady_mb"]) / 1000)
            if "helpers_mb" in f:
                rows[(key, side)]["helpers_gb"].append(float(f["helpers_mb"]) / 1000)
    print("| config | side | tokens/s | peak, sum of the ranks' (GB) | peak at one moment (GB) "
          "| steady-state step peak, sum of the ranks' (GB) | helpers at one moment (GB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (config, side), v in rows.items():
        print(f"| {config} | {side} | {cell(v['tokens_per_s'], 1)} | {cell(v['peak_gb'], 2)} "
              f"| {cell(v['together_gb'], 2)} | {cell(v['steady_gb'], 2)} "
              f"| {cell(v['helpers_gb'], 2)} |")


if __name__ == "__main__":
    main()
