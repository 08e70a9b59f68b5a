"""Prefix each line of standard input with the time it arrived."""
import sys
import time

for line in sys.stdin:
    sys.stdout.write(f"{time.time():.3f} {line}")
    sys.stdout.flush()
