"""DDP or FSDP2 over a BlockAttnRes model on two CPU processes (gloo); rank 0 checks the parameters' gradients
against one process over both ranks' data. The model: one BlockAttnRes layer, or the example language model,
whose forward drives a ResidualStream. Run by tests/test_distributed.py: python distributed_worker.py
RENDEZVOUS_FILE ddp|fsdp2 layer|stream (a file rendezvous: no port to race for)."""

from __future__ import annotations

import faulthandler
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attnres_ge
from attnres_ge.examples.model import BlockAttnResLM


class Layer(torch.nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(hidden, hidden)
        self.attn_res = attnres_ge.BlockAttnRes(hidden)
        with torch.no_grad():
            self.attn_res.proj_weight.normal_(0, 0.5)

    def forward(self, tokens, blocks):
        return self.attn_res(self.linear(tokens), blocks)


def make_model(kind: str) -> torch.nn.Module:
    """The same weights on every call (and rank)."""
    if kind == "layer":
        return Layer()
    torch.manual_seed(0)
    return BlockAttnResLM(layers=3, layers_per_block=2)  # seals in layers 0 and 2: two blocks


def rank_data(kind: str, rank: int):
    generator = torch.Generator().manual_seed(100 + rank)
    if kind == "layer":
        return torch.randn(2, 3, 16, generator=generator), torch.randn(2, 3, 2, 16, generator=generator)
    return (torch.randint(0, 64, (2, 5), generator=generator),)  # token ids [B, S]


def worker(rank: int, rendezvous_file: str, wrapper: str, kind: str) -> None:
    faulthandler.dump_traceback_later(120, exit=True)  # a hang fails with every thread's stack
    dist.init_process_group("gloo", init_method=f"file://{rendezvous_file}", rank=rank, world_size=2)
    torch.set_num_threads(1)  # two processes on what may be a two-core host
    model = make_model(kind)
    if wrapper == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        wrapped = fully_shard(model)
    wrapped(*rank_data(kind, rank)).square().mean().backward()
    grads = {name: getattr(p.grad, "full_tensor", lambda g=p.grad: g)() for name, p in model.named_parameters()}
    if rank == 0:
        reference = make_model(kind)
        for data_rank in range(2):
            (reference(*rank_data(kind, data_rank)).square().mean() / 2).backward()
        for name, parameter in reference.named_parameters():
            torch.testing.assert_close(grads[name], parameter.grad, rtol=1e-5, atol=1e-6)
        print(f"{wrapper} {kind}: gradients match", flush=True)
    # The wrapper's communication state goes before its process group, on both ranks together.
    del wrapped, model, grads
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: process group destroyed", flush=True)
    # Skip the interpreter's finalization: there gloo's threads have aborted a rank now and then ("terminate
    # called without an active exception", SIGABRT) after everything above had passed (the torch teardown
    # symptom of pytorch/pytorch#190489, seen here after destroy_process_group). What this test checks is done.
    os._exit(0)


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=2)
