"""A script command's grammar (tunekit/command.py): placeholders filled, or left out with their flag, and what a
fork server runs for a command."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tunekit import command as command_mod


def test_what_a_fork_server_runs_for_a_command(tmp_path: Path):
    """Only this interpreter running a script or a module without interpreter options is forked; the modules it
    imports at its top level are preloaded, but none of its own folder (another module of that name would be taken
    for it)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import argparse, torch\nfrom torch.utils.data import DataLoader\nfrom data import load\n"
        "from . import nothing\n\ndef main():\n    import yaml\n"
    )
    (tmp_path / "data.py").write_text("")
    entry = command_mod.script_entry([sys.executable, "train.py", "-b", "8"], str(tmp_path), None, sys.executable)
    assert entry == {"path": str(script), "args": ["-b", "8"], "cwd": str(tmp_path)}
    assert command_mod.script_imports(entry) == ["argparse", "torch", "torch.utils.data"]
    assert command_mod.script_entry([sys.executable, "-m", "pkg.train"], str(tmp_path), None, sys.executable) == {
        "module": "pkg.train",
        "args": [],
        "cwd": str(tmp_path),
    }
    other = tmp_path / "python3"  # another interpreter of that name
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    for command in (
        [str(other), "train.py"],
        [sys.executable, "-u", "train.py"],
        [sys.executable, "missing.py"],
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "train.py"],
    ):
        assert command_mod.script_entry(command, str(tmp_path), None, sys.executable) is None, command
    assert command_mod.script_entry(["python3", "train.py"], str(tmp_path), str(tmp_path), sys.executable) is None
    venv = tmp_path / "venv" / "bin"  # a virtualenv's python: a symlink to this interpreter, another environment
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    assert command_mod.script_entry([str(venv / "python"), "train.py"], str(tmp_path), None, sys.executable) is None
    # a script that sets the environment or sys.path up before its imports runs itself: the server imported torch
    # before it ran
    for name, head in (
        ("threads.py", "import os\nos.environ['OMP_NUM_THREADS'] = '1'\nimport torch\n"),
        ("src.py", "import sys\nsys.path.insert(0, '../src')\nimport mylib\n"),
        ("env.py", "from os import environ\nenviron.setdefault('MKL_NUM_THREADS', '1')\nimport torch\n"),
        ("put.py", "import os\nos.putenv('KMP_AFFINITY', 'compact')\nimport torch\n"),
    ):
        (tmp_path / name).write_text(head + "print('train')\n")
        assert command_mod.script_entry([sys.executable, name], str(tmp_path), None, sys.executable) is None, name
    # after its imports it may, and reading them first is no setting up
    (tmp_path / "late.py").write_text(
        "import os, sys\nprint(os.environ.get('HOME'), sys.path[0])\nimport torch\n"
        "os.environ['WANDB_MODE'] = 'offline'\n"
    )
    assert command_mod.script_entry([sys.executable, "late.py"], str(tmp_path), None, sys.executable) is not None
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import os\nos.environ['OMP_NUM_THREADS'] = '1'\nimport torch\n")
    assert command_mod.script_entry([sys.executable, "-m", "pkg.train"], str(tmp_path), None, sys.executable) is None
    # a symlinked script runs from its real folder (sys.path[0]): that folder's modules are its own, not preloaded
    real = tmp_path / "shared"
    real.mkdir()
    (real / "utils.py").write_text("")
    (real / "train.py").write_text("import torch\nimport utils\n")
    (tmp_path / "linked.py").symlink_to(real / "train.py")
    linked = command_mod.script_entry([sys.executable, "linked.py"], str(tmp_path), None, sys.executable)
    assert command_mod.script_imports(linked) == ["torch"]


def test_fill_command_leaves_out_a_placeholder_without_a_value_with_its_flag():
    command = "python train.py --data /d -j {num_workers} --batch={batch_size} --amp"
    assert command_mod.fill_command(command, {"num_workers": 4, "batch_size": 64}) == [
        "python",
        "train.py",
        "--data",
        "/d",
        "-j",
        "4",
        "--batch=64",
        "--amp",
    ]
    assert command_mod.fill_command(command, {}) == ["python", "train.py", "--data", "/d", "--amp"]
    assert command_mod.placeholders(textwrap.dedent(command)) == {"num_workers", "batch_size"}
