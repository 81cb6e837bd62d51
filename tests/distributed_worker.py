"""DDP or FSDP2 over a BlockAttnRes model on two CPU processes (gloo); rank 0 checks the parameters' gradients
against one process over both ranks' data. Run by tests/test_distributed.py: python distributed_worker.py
RENDEZVOUS_FILE ddp|fsdp2 (a file rendezvous: no port to race for)."""

from __future__ import annotations

import faulthandler
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attnres_ge


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


def rank_data(rank: int):
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(2, 3, 16, generator=generator), torch.randn(2, 3, 2, 16, generator=generator)


def worker(rank: int, rendezvous_file: str, wrapper: str) -> None:
    faulthandler.dump_traceback_later(120, exit=True)  # a hang fails with every thread's stack
    dist.init_process_group("gloo", init_method=f"file://{rendezvous_file}", rank=rank, world_size=2)
    torch.set_num_threads(1)  # two processes on what may be a two-core host
    model = Layer()
    if wrapper == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        wrapped = fully_shard(model)
    wrapped(*rank_data(rank)).square().mean().backward()
    grads = {name: getattr(p.grad, "full_tensor", lambda g=p.grad: g)() for name, p in model.named_parameters()}
    if rank == 0:
        reference = Layer()
        for data_rank in range(2):
            (reference(*rank_data(data_rank)).square().mean() / 2).backward()
        for name, parameter in reference.named_parameters():
            torch.testing.assert_close(grads[name], parameter.grad, rtol=1e-5, atol=1e-6)
        print(f"{wrapper}: gradients match", flush=True)
    # The wrapper's communication state goes before its process group, on both ranks together.
    del wrapped, model, grads
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: process group destroyed", flush=True)  # a failure after this is the interpreter's exit


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2]), nprocs=2)
