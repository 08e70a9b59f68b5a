"""A workload module that initialises CUDA when imported (tests/test_gpu.py: the fork server must refuse it)."""

import torch

torch.cuda.init()

loss = torch.nn.CrossEntropyLoss
