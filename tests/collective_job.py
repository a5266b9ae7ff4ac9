"""A real multi-process torch.distributed job on the CPU (gloo) in which one rank misbehaves, for
the collective-timeout triage tests. Run under torchrun:

    torchrun --nproc-per-node 4 --log-dir LOGS --tee 3 tests/collective_job.py MODE CULPRIT STEP DUMPS

MODE is what rank CULPRIT does at step STEP: ``stall`` (sleeps past the timeout), ``die`` (exits
without a word), ``raise`` (an exception in its own code) or ``diverge`` (a broadcast where the
others all-reduce). Every rank that fails writes its flight-recorder dump to DUMPS as
``nccl_trace_rank_<N>``, as PyTorch's dump-on-timeout does.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

TIMEOUT_S = 5


def main() -> None:
    mode, culprit, at, dumps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    tensor = torch.ones(1024)
    try:
        for step in range(1, 6):
            if rank == culprit and step == at:
                if mode == "stall":
                    time.sleep(TIMEOUT_S * 8)
                elif mode == "die":
                    os._exit(1)
                elif mode == "raise":
                    raise ValueError("batch 17 has 3 labels, expected 4")
                elif mode == "diverge":
                    dist.broadcast(tensor, 0)
                    continue
            dist.all_reduce(tensor)
            print(f"step {step} done", flush=True)
    except Exception:
        from torch._C._distributed_c10d import _dump_fr_trace

        with open(os.path.join(dumps, f"nccl_trace_rank_{rank}"), "wb") as out:
            out.write(_dump_fr_trace(True, True, False))
        raise


if __name__ == "__main__":
    main()
