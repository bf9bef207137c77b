"""Several `biodistil` commands one after another in one process — or, under `accelerate launch`, in each of its
processes: what test_multiprocess launches once instead of once per command (each launch costs an interpreter,
torch's import and a process group).

    python tests/launched_jobs.py JOBS.json

JOBS.json lists {"name", "cwd", "argv"}; each job runs `biodistil ARGV` in its folder, its standard output kept in
CWD/NAME.rankR.out (R: the process's rank). A job with "interrupt" instead of "argv" leaves an evaluation as a kill
during some of its cells would (see `interrupt`), so that the next job can resume it in the same launch. The process
group stays open between jobs (each command would close it on its way out) and is closed after the last one. Exit
status: the first failing job's."""

import contextlib
import json
import os
import sys
from pathlib import Path

from biodistil.cli import main as cli
from biodistil.training.processes import Launch


def interrupt(cwd: Path, spec: dict) -> None:
    """As a kill during cells `spec["cells"]` (indices into the sorted cell folders of the evaluation `spec["out"]`)
    leaves them: no metrics.json, a checkpoint begun. First the stamps (mtime_ns) of every cell's metrics.json are
    written to `spec["stamps"]`, as `{cell folder: stamp}` in that order, to tell later which cells a resume rewrote.
    The main process does it; the others wait for it (in an evaluation's launch: no process group, its rendezvous
    store)."""
    launch = Launch.current()
    if launch.is_main:
        cells = sorted(path.parent for path in (cwd / spec["out"] / "cells").rglob("metrics.json"))
        stamps = {str(cell): (cell / "metrics.json").stat().st_mtime_ns for cell in cells}
        (cwd / spec["stamps"]).write_text(json.dumps(stamps), encoding="utf-8")
        for index in spec["cells"]:
            (cells[index] / "metrics.json").unlink()
            (cells[index] / "train" / "checkpoints" / "step-0000001").mkdir(parents=True)
    launch.wait()


def run(jobs_file: str) -> int:
    leave_process_group = cli._leave_process_group
    cli._leave_process_group = lambda: None  # the next job reuses the group
    rank = os.environ.get("RANK", "0")
    try:
        for job in json.loads(Path(jobs_file).read_text()):
            cwd = Path(job["cwd"])
            os.chdir(cwd)
            if "interrupt" in job:
                interrupt(cwd, job["interrupt"])
                continue
            with open(cwd / f"{job['name']}.rank{rank}.out", "w", encoding="utf-8") as out, \
                    contextlib.redirect_stdout(out):
                code = cli.main(job["argv"])
            if code != 0:
                print(f"job {job['name']} (rank {rank}): `biodistil {' '.join(job['argv'])}` exited {code}",
                      file=sys.stderr)
                return code
        return 0
    finally:
        leave_process_group()


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
