"""bench/udf.sh's table: each run's wall and CPU seconds, the cores it kept busy, and the
ratios the targets are about; then a cross-check that every run computed the same results.
usage: udf_report.py OUT_DIR ROWS"""
import glob
import json
import os
import sys

out, rows = sys.argv[1], int(sys.argv[2])
runs = {}
for line in open(os.path.join(out, "results.tsv")):
    name, wall, cpu, rss = line.split("\t")
    runs[name] = (float(wall), float(cpu), int(rss))


def results(name):
    """Revenue per zone and trips per hour, whatever the file layout."""
    zones, hours = {}, {}
    for f in glob.glob(os.path.join(out, name, "zones*")):
        for line in open(f):
            r = json.loads(line)
            zones[r["zone"]] = round(r["revenue"], 4)
    for f in glob.glob(os.path.join(out, name, "hours*")):
        for line in open(f):
            r = json.loads(line)
            start = r["window_start"]
            start = start["micros"] if isinstance(start, dict) else start
            hours[str(start)] = r["trips"]
    return zones, hours


print(f"\n{'run':20} {'wall s':>8} {'CPU s':>8} {'cores':>6} {'rows/s':>12} {'RSS MB':>7}")
for name, (wall, cpu, rss) in runs.items():
    print(f"{name:20} {wall:8.2f} {cpu:8.2f} {cpu / wall:6.2f} {rows / wall:12,.0f} {rss:7}")

print()
sql = runs["riverbank-sql"][0]
print(f"python expressions vs sql:  {runs['riverbank-python'][0] / sql:.2f}x the sql version's time (target <= 1.2)")
if "beam-callable" in runs:
    b = runs["beam-callable"][0]
    print(f"callables vs Beam's YAML runner: {b / runs['riverbank-callable'][0]:.1f}x faster (target >= 20)")
if "beam-python" in runs:
    b = runs["beam-python"][0]
    print(f"python expressions vs Beam's YAML runner: {b / runs['riverbank-python'][0]:.1f}x faster")

base = results("riverbank-sql")
# Hour keys: Riverbank writes window starts as text, Beam as micros; compare the counts in order.
ok = True
for name in runs:
    zones, hours = results(name)
    same_zones = zones.keys() == base[0].keys() and all(
        abs(zones[k] - base[0][k]) <= 1e-6 * max(1.0, abs(base[0][k])) for k in zones)
    same_hours = sorted(hours.values()) == sorted(base[1].values()) and sum(hours.values()) == rows
    ok &= same_zones and same_hours
    print(f"cross-check {name:20} zones {'same' if same_zones else 'DIFFERENT'}, hours {'same' if same_hours else 'DIFFERENT'}")
sys.exit(0 if ok else 1)
