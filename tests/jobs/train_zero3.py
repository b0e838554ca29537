"""A tiny DeepSpeed ZeRO-3 training job (about 1.3M parameters) for the capture tests.

Runs on CPU with gloo (`DS_ACCELERATOR=cpu`) under any launcher: deepspeed, torchrun, or two loopback
"nodes". It knows nothing about overlapcheck. Options:
  --steps N        optimizer steps to run (default 6)
  --fail-at K      exit with code 3 after step K (tests that a failing job's exit code is returned)
  --fail-rank R    only rank R fails (default: every rank)
  --step-times F   rank 0 appends one line per step to F: "<step> <seconds>" (the overhead benchmark)
"""

import argparse
import os
import sys
import time

import deepspeed
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--step-times", default="")
    parser.add_argument("--config", default=os.path.join(HERE, "ds_zero3.json"))
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--local_rank", type=int, default=-1)  # passed by the deepspeed launcher
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    w = args.width
    model = torch.nn.Sequential(
        torch.nn.Linear(w, w),
        torch.nn.ReLU(),
        torch.nn.Linear(w, w),
        torch.nn.ReLU(),
        torch.nn.Linear(w, w),
        torch.nn.ReLU(),
        torch.nn.Linear(w, w),
        torch.nn.ReLU(),
        torch.nn.Linear(w, w),
        torch.nn.ReLU(),
        torch.nn.Linear(w, 8),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=args.config)
    rank = torch.distributed.get_rank()
    batch = engine.train_micro_batch_size_per_gpu()
    times = open(args.step_times, "a") if args.step_times and rank == 0 else None  # noqa: SIM115
    for step in range(args.steps):
        started = time.perf_counter()
        x = torch.randn(batch, w)
        y = torch.randint(0, 8, (batch,))
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        if times is not None:
            times.write(f"{step} {time.perf_counter() - started:.6f}\n")
        if step == args.fail_at:
            torch.distributed.barrier()  # every rank has exported its window (in its step call) before one fails
        if step == args.fail_at and args.fail_rank in (-1, rank):
            print(f"rank {rank}: failing on purpose after step {step}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
    if times is not None:
        times.close()
    torch.distributed.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
