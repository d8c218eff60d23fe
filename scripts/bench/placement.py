"""Where a benchmark's local ranks run: each pinned to a core (``taskset``) and, when given a
share, capped at that share of a core in its own cgroup (cgroup v1 cpu quota). Real,
controlled compute heterogeneity on one machine. (``hetgrad.placement`` records where a rank
ran; this decides it.)"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator, Sequence

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
# 4 ms: the cap holds within a step (default 100 ms would not); a capped rank's steps then
# take whole periods (a step needing 1.01 periods' quota waits for the second to end)
QUOTA_PERIOD_US = int(os.environ.get("HETGRAD_BENCH_QUOTA_PERIOD_US", "4000"))
Placement = Sequence[tuple[int, float | None]]   # rank -> (core, share of it or None)


def profile(name: str) -> tuple[int, list[str], "Placement | None"]:
    """Ranks, extra ``hetgrad train`` args and placement of a speed profile: ``1,8``
    (emulated speeds), ``1,1,2,4@1e-4`` (emulated, that many seconds per sample at speed 1)
    or ``quota:1,0.25`` (rank r on core r % 2 at that CPU share)."""
    if name.startswith("quota:"):
        shares = [float(s) for s in name[len("quota:"):].split(",")]
        return len(shares), [], [(r % 2, s) for r, s in enumerate(shares)]
    speeds, _, unit = name.partition("@")
    return (len(speeds.split(",")), ["--emulate-speeds", speeds,
                                     *(["--emulate-unit", unit] if unit else [])], None)


@contextlib.contextmanager
def placed(placement: Placement | None) -> Iterator[list[str] | None]:
    """The command prefix that puts local rank ``r`` on core ``placement[r][0]`` and, when
    ``placement[r][1]`` is a share, in its own cgroup capped at that share of a core (period
    :data:`QUOTA_PERIOD_US`); the cgroups are removed on exit, also on failure. None: no
    prefix."""
    if not placement:
        yield None
        return
    root = CPU_CGROUP / f"hetgrad-bench-{os.getpid()}"
    shares = {r: s for r, (_, s) in enumerate(placement) if s}
    made: list[Path] = []
    try:
        for r, share in shares.items():
            group = _new_group(root / f"rank{r}")
            made.insert(0, group)
            (group / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(round(share * QUOTA_PERIOD_US)))
        cases = " ".join(
            f"{r}) c={core};" + (f" echo $$ > {root}/rank{r}/cgroup.procs || exit 97;"
                                  if r in shares else "") + ";"
            for r, (core, _) in enumerate(placement))
        yield ["sh", "-c", f'case $OMPI_COMM_WORLD_RANK in {cases} esac; '
                           f'exec taskset -c $c "$@"', "sh"]
    finally:
        for group in made + ([root] if made else []):
            try:
                group.rmdir()
            except OSError as exc:   # a rank still inside: say so, never hide the run's error
                print(f"bench: warning: cannot remove {group}: {exc}", file=sys.stderr)


def _new_group(group: Path) -> Path:
    """``group`` made (a new cgroup), or a SystemExit saying what CPU shares need."""
    try:
        group.mkdir(parents=True)
    except OSError as exc:
        raise SystemExit(f"bench: cannot create {group} ({exc}); CPU shares need root and "
                         "cgroup v1's cpu controller") from None
    return group
