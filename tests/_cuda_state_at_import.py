"""A workload module that marks torch's CUDA state initialised when imported, as ``torch.cuda.init()`` would on a
GPU machine (tests/launch/test_forks.py: on the CPU, the fork server must refuse it just the same)."""

import torch

torch.cuda._initialized = True

loss = torch.nn.CrossEntropyLoss
