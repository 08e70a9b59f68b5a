"""Strict loading of a sweep config (YAML) into typed, keyword-only dataclasses.

Every problem in a file is collected and reported at once, one line each, naming the file, the key path and what
is allowed. Nothing here imports torch: the driver loads configs, and import paths are checked in a subprocess.
"""

from __future__ import annotations

from tunekit.config._checks import ExtraKnob, extra_knobs
from tunekit.config._cpus import CpuBudget, cpu_budget
from tunekit.config._imports import IMPORT_PATH_KEYS, Resolver
from tunekit.config._knobs import KNOB_HELP, MAX_WORKERS_PER_CPU, MIN_WORKER_BOUND, check_knobs, max_workers, parse_knob
from tunekit.config._load import from_dict, load, read_yaml, set_dotted
from tunekit.config._schema import (
    COMPILE_MODES,
    TOP_LEVEL_KEYS,
    Budget,
    Config,
    Cost,
    Fleet,
    Launch,
    Script,
    Search,
    Selection,
    TrialSettings,
    Workload,
    auto_workers,
    cpu_count,
)
from tunekit.errors import ConfigError

__all__ = [
    "Config",
    "Workload",
    "Script",
    "Search",
    "TrialSettings",
    "Selection",
    "Budget",
    "Cost",
    "Fleet",
    "Launch",
    "COMPILE_MODES",
    "load",
    "read_yaml",
    "from_dict",
    "auto_workers",
    "ExtraKnob",
    "extra_knobs",
    "cpu_count",
    "cpu_budget",
    "CpuBudget",
    "set_dotted",
    "max_workers",
    "KNOB_HELP",
    "TOP_LEVEL_KEYS",
    "check_knobs",
    "parse_knob",
    "MAX_WORKERS_PER_CPU",
    "MIN_WORKER_BOUND",
    "IMPORT_PATH_KEYS",
    "Resolver",
    "ConfigError",
]
