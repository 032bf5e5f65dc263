"""The table of `scripts/real-size-rows.sh`'s log: for each config and side (wick threads,
wick processes, torch), tokens/s and the peaks as the median [min-max] of the rounds.

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
            side = f["impl"] + (" " + f["transport"] if f["impl"] == "wick" else " FSDP2")
            rows[(key, side)]["tokens_per_s"].append(float(f["tokens_per_s"]))
        elif line.split()[1] == "rss_peak":
            rows[(key, side)]["peak_gb"].append(float(f["peak_mb"]) / 1000)
            rows[(key, side)]["together_gb"].append(float(f["together_mb"]) / 1000)
    print("| config | side | tokens/s | peak, sum of the ranks' (GB) | peak at one moment (GB) |")
    print("| --- | --- | --- | --- | --- |")
    for (config, side), v in rows.items():
        print(f"| {config} | {side} | {cell(v['tokens_per_s'], 1)} | {cell(v['peak_gb'], 2)} "
              f"| {cell(v['together_gb'], 2)} |")


if __name__ == "__main__":
    main()
