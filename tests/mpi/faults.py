"""Inject one fault on rank 1 while the other ranks wait in a collective (of hetgrad's control
channel, as the start-up checks and the probe's timed gather use it: under mpirun without
TensorFlow, under horovodrun --gloo on Horovod's world).

Usage: faults.py raise|exit|sleep
"""
import os
import sys
import time

from hetgrad.runtime import control, fail_fast

fault = sys.argv[1]
comm = control()
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
