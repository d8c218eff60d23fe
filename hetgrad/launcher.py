"""What started this process, read from the environment before any world is joined: a
launcher's rank (mpirun, srun, horovodrun with MPI or Gloo) or nobody (a command typed as is)."""
from __future__ import annotations

import os

# (rank, size) variables that launchers set in every rank: Horovod's, Open MPI's, PMI-2's
# (srun --mpi=pmi2, MPICH's hydra), PMIx's (srun --mpi=pmix), Slurm's own
RANK_VARIABLES = (("HOROVOD_RANK", "HOROVOD_SIZE"),
                  ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                  ("PMI_RANK", "PMI_SIZE"), ("PMIX_RANK", "SLURM_NTASKS"),
                  ("SLURM_PROCID", "SLURM_NTASKS"))


def gloo_launch() -> bool:
    """True when Horovod runs on Gloo (``horovodrun --gloo`` sets this for every worker)."""
    return os.environ.get("HOROVOD_CONTROLLER", "").lower() == "gloo"


def mpirun_launch() -> bool:
    """True under Open MPI's ``mpirun`` (its ORTE daemons; not ``srun``): a job whose rank
    exits non-zero is torn down after two ``odls_base_sigkill_timeout`` waits (2 s), one that
    calls ``MPI_Abort`` at once."""
    return "OMPI_MCA_orte_hnp_uri" in os.environ


def launched() -> bool:
    """Whether a launcher started this process as a rank of a world (a Slurm batch script's
    own process is not one: SLURM_PROCID alone does not count)."""
    return any(rank in os.environ for rank, _ in RANK_VARIABLES[:-1])


def rank_and_size() -> tuple[int, int]:
    """This rank and the world size as the launcher set them (0 and 1 without one)."""
    for rank, size in RANK_VARIABLES:
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ.get(size, 1))
    return 0, 1
