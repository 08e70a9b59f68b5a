"""The script's own clock, from its output time-stamped line by line (stamp.py): the rate over whole epochs (from
one evaluation's end to the next: training, evaluation and checkpoints), and the rate inside an epoch in windows of
about 3 s between its progress lines (every --print-freq iterations), with their noise. Usage: clock.py LOG ITEMS"""
import re
import statistics
import sys


def main() -> None:
    lines = [line.split(" ", 1) for line in open(sys.argv[1]) if re.match(r"^\d+\.\d+ ", line)]
    items = int(sys.argv[2])
    ends = [float(t) for t, text in lines if "Acc@1" in text and text.startswith("Test:")]
    whole = [items / (b - a) for a, b in zip(ends, ends[1:])]
    print("epochs ended at", [round(t - ends[0], 2) for t in ends])
    print("whole-epoch rates (epochs 1..):", [round(r) for r in whole], "mean", round(statistics.fmean(whole)) if whole else None)
    windows = []
    for epoch in range(1, len(ends) + 1):
        progress = [(float(t), int(m.group(1)), int(m.group(2))) for t, text in lines
                    if (m := re.match(rf"Epoch: \[{epoch}\]\s+\[\s*(\d+)/(\d+)\]", text))]
        progress = progress[1:]  # the first line follows the epoch's first batch (the workers' start)
        start = progress[0] if progress else None
        for t, i, n in progress[1:]:
            if t - start[0] >= 3.0:
                windows.append((i - start[1]) / (t - start[0]))
                start = (t, i, n)
    if len(windows) > 1:
        cv = statistics.stdev(windows) / statistics.fmean(windows)
        print(f"inside an epoch: {len(windows)} windows of ~3 s, {statistics.fmean(windows):.2f} batches/s, noise {cv:.1%}")


if __name__ == "__main__":
    main()
