"""A tiny single-process torch training loop without DeepSpeed: exercises the optimizer-step fallback."""

import argparse
import sys

import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        loss = model(torch.randn(8, 64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
