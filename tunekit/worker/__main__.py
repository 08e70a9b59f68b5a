import os
import sys

from tunekit.worker import main

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: loader workers and CUDA are already done, and a slow teardown is not the trial.
    os._exit(code)
