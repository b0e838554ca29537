"""A tiny DeepSpeed ZeRO-3 job whose model has several module types (embedding, GRU, sequential MLP), for the
per-module attribution test (tests/test_capture_modules.py).

Runs on CPU with gloo (`DS_ACCELERATOR=cpu`) under torchrun or the deepspeed launcher; it knows nothing about
overlapcheck. Options: --steps N (default 6).
"""

import argparse
import os
import sys

import deepspeed
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(torch.nn.Module):
    def __init__(self, vocab: int, width: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.rnn = torch.nn.GRU(width, width, batch_first=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width),
            torch.nn.ReLU(),
            torch.nn.Linear(2 * width, width),
            torch.nn.ReLU(),
        )
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(self.mlp(hidden))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--config", default=os.path.join(HERE, "ds_zero3.json"))
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--local_rank", type=int, default=-1)  # passed by the deepspeed launcher
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    model = Net(args.vocab, args.width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=args.config)
    batch = engine.train_micro_batch_size_per_gpu()
    for _ in range(args.steps):
        tokens = torch.randint(0, args.vocab, (batch, 16))
        logits = engine(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens.reshape(-1))
        engine.backward(loss)
        engine.step()
    torch.distributed.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
