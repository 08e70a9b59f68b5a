"""The fork server in script mode (tunekit/worker/script/_forkserver.py): a script forked from it runs as the
interpreter would run it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.worker.script.test_session import SLEEPY_SCRIPT, _script_config, _trial

FACTS = """
import json, os, sys
import numpy
with open(os.path.join(os.getcwd(), "facts.json"), "w") as fh:
    json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "file": __file__,
               "draw": int(numpy.random.randint(2**31))}, fh)
"""


def test_script_trials_are_forked_and_run_as_the_interpreter_would(tmp_path: Path):
    """`python train.py …` and `python -m pkg.train …` run by tunekit's own interpreter are forked from a fork server
    (no interpreter start, no `import torch` per trial) and run as that interpreter would run them: `__main__`, its
    sys.argv, sys.path[0] the script's folder (the working folder with -m); an uncaught exception is the trial's
    failure as in a fresh interpreter; with trial.fork_server off, or under torchrun, the command runs itself."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(FACTS + SLEEPY_SCRIPT)
    raw = _script_config(
        tmp_path, [sys.executable, "-m", "pkg.train", "-j", "{num_workers}", "-b", "{batch_size}"], cwd=tmp_path
    )
    m = _trial(tmp_path, raw, name="module", num_workers=2, prefetch_factor=2, batch_size=8)
    assert m.status == "ok" and m.started_by == "fork server", (m.status, m.reason, m.started_by)
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["name"] == "__main__" and facts["path0"] == str(tmp_path)
    assert facts["argv"] == [str(tmp_path / "pkg" / "train.py"), "-j", "2", "-b", "8"]
    script = tmp_path / "train.py"
    script.write_text(FACTS + SLEEPY_SCRIPT)
    sub = tmp_path / "run"
    sub.mkdir()
    raw = _script_config(tmp_path, [sys.executable, str(script), "-b", "{batch_size}"])
    raw["script"]["cwd"] = str(sub)
    m = _trial(tmp_path, raw, name="path", num_workers=0, batch_size=8)
    assert m.status == "ok" and m.started_by == "fork server", (m.status, m.reason, m.started_by)
    facts = json.loads((sub / "facts.json").read_text())
    assert facts["name"] == "__main__" and facts["path0"] == str(tmp_path) and facts["file"] == str(script)
    assert facts["argv"] == [str(script), "-b", "8"]
    first = facts
    raw["trial"]["fork_server"] = False
    assert _trial(tmp_path, raw, name="fresh", num_workers=0, batch_size=8).started_by == "interpreter"
    # a symlinked script: sys.path[0] is its real folder, __file__ the path it was run by
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.py").write_text(FACTS + SLEEPY_SCRIPT)
    (sub / "linked.py").symlink_to(tmp_path / "real" / "train.py")
    raw = _script_config(tmp_path, [sys.executable, "linked.py"])
    raw["script"]["cwd"] = str(sub)
    m = _trial(tmp_path, raw, name="linked", num_workers=0, batch_size=8)
    assert m.status == "ok" and m.started_by == "fork server", (m.status, m.reason, m.started_by)
    facts = json.loads((sub / "facts.json").read_text())
    assert facts["path0"] == str(tmp_path / "real") and facts["file"] == str(sub / "linked.py")
    assert facts["draw"] != first["draw"]  # the same server forked both: numpy reseeded in each, as at a fresh start
    broken = tmp_path / "broken.py"
    broken.write_text(SLEEPY_SCRIPT.replace("for epoch in", "raise ValueError('bad data path')\nfor epoch in"))
    m = _trial(
        tmp_path, _script_config(tmp_path, [sys.executable, str(broken)]), name="broken", num_workers=0, batch_size=8
    )
    assert m.status == "crashed" and "bad data path" in m.reason and m.started_by == "fork server", m.reason
