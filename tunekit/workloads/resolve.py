"""``python -m tunekit.workloads.resolve '{"key": "module:attr"}'`` prints which import paths do not resolve.

Config validation runs this in a subprocess so that the driver never imports torch.
"""

from __future__ import annotations

import json
import sys

from tunekit.workloads import check_paths

if __name__ == "__main__":
    print(json.dumps(check_paths(json.loads(sys.argv[1]))))
