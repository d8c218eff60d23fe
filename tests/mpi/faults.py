"""Inject one fault on rank 1 while the other ranks wait in a collective.

Usage: faults.py raise|exit|sleep
"""
import os
import sys
import time

from hetgrad.runtime import fail_fast, init

fault = sys.argv[1]
comm = init()
rank = comm.rank
with fail_fast():
    if rank == 1 and fault == "raise":
        raise RuntimeError("injected failure in the probe")
    if rank == 1 and fault == "exit":
        os._exit(3)
    if rank == 1 and fault == "sleep":
        time.sleep(120)
    comm.gather_with_timeout({"rank": rank}, timeout=5.0)
    comm.barrier()
