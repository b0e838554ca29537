"""A plain torch job whose process starts a helper subprocess that inherits RANK and steps an optimizer of its
own (an evaluation or a distillation helper): only the job's own process may capture rank 0.

    python helper_job.py OUT_PIDS_FILE [--helper]
"""

import os
import subprocess
import sys

import torch


def train(steps: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for _ in range(steps):
        model(torch.randn(4, 32)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def main() -> int:
    pids = sys.argv[1]
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # the step clock: one optimizer throughout
    if "--helper" in sys.argv:
        train(12, model, optimizer)  # a whole window of its own
        with open(pids, "a") as f:
            f.write(f"helper {os.getpid()}\n")
        return 0
    train(12, model, optimizer)  # this process is rank 0 from its first step on; its window is done
    # then a helper that inherits RANK and the capture: without the rank claim it would overwrite rank 0's files
    subprocess.run([sys.executable, __file__, pids, "--helper"], check=True)
    with open(pids, "a") as f:
        f.write(f"main {os.getpid()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
