"""Running a verification job's shards on many workers: local processes, or a Ray cluster.

A job is a module-level function and a list of shards (picklable values); each shard's result
is a function of the shard alone, so the job's result is the same on one worker or many, here or
on a cluster. `run_shards` hands the shards out and calls `done(index, result)` as each one
finishes, in the order they finish (`Workers` keeps the workers for many jobs):

    workers=N           N local processes (`concurrent.futures`, spawned: nothing of the parent's
                        state leaks into a shard)
    ray="auto"          the Ray cluster this machine belongs to (Ray's own "auto")
    ray="local"         a Ray cluster started here, over this machine's cores
    ray="ray://..."     any address `ray.init` takes

Ray is imported only when asked for (the `ray` extra). A worker that dies mid-shard (killed, out
of memory, a crash in native code) loses nothing: its shard runs again, on a fresh process, up
to `attempts` times in all; a shard that kills its worker every time is a `WorkerLost`.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

S = TypeVar("S")
R = TypeVar("R")

ATTEMPTS = 3  # runs of one shard before its worker's death is the job's


def shard_sizes(examples: int, shard: int) -> list[int]:
    """A campaign of `examples` programs cut into shards of at most `shard`, in seed order (the
    last may be smaller)."""
    return [min(shard, examples - start) for start in range(0, examples, shard)]


class WorkerLost(RuntimeError):
    """A shard's worker died on every attempt."""


class RayMissing(RuntimeError):
    """`ray` was asked for and is not installed."""


def run_shards(
    job: Callable[[S], R],
    shards: Sequence[S],
    done: Callable[[int, R], None],
    *,
    workers: int = 1,
    ray: str | None = None,
    attempts: int = ATTEMPTS,
) -> None:
    """Run `job(shard)` for every shard, `workers` at a time (or on Ray); `done(index, result)`
    as each finishes. A job's own exception propagates (after the running shards are
    cancelled); a dead worker's shard runs again."""
    with Workers(workers, ray=ray, attempts=attempts) as pool:
        pool.run(job, shards, done)


class Workers:
    """Workers kept across many jobs (a search's levels: one pool, not one per level); `run` is
    `run_shards` on them. Local processes are spawned on the first job and replaced when one
    dies; `close` (or leaving the `with`) ends them."""

    def __init__(self, workers: int = 1, *, ray: str | None = None, attempts: int = ATTEMPTS) -> None:
        self.workers, self.ray, self.attempts = workers, ray, attempts
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, job: Callable[[S], R], shards: Sequence[S], done: Callable[[int, R], None]) -> None:
        """`job(shard)` for every shard; `done(index, result)` as each finishes."""
        if self.ray is not None:
            _on_ray(job, shards, done, self.ray, self.attempts)
            return
        pending = dict(enumerate(shards))
        tries = dict.fromkeys(pending, 0)
        while pending:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=multiprocessing.get_context("spawn")
                )
            try:
                finished = _on_processes(self._pool, job, pending, tries, done, self.workers, self.attempts)
            except BaseException:
                self.close()
                raise
            if not finished:
                self.close()  # a worker died: the pool is broken, a fresh one runs what is pending

    def close(self) -> None:
        """End the local processes (a later job starts fresh ones)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def _on_processes(
    pool: ProcessPoolExecutor,
    job: Callable[[S], R],
    pending: dict[int, S],
    tries: dict[int, int],
    done: Callable[[int, R], None],
    workers: int,
    attempts: int,
) -> bool:
    """Run `pending` on `pool` until it is empty (True) or a worker dies (False: the pool is
    broken, and the shards it had not finished stay pending for the next pool). A shard that
    was running when a worker died runs alone next, so a shard that kills its worker is told
    from those beside it."""
    running: dict[Future[R], int] = {}
    queue = sorted(pending, key=lambda index: (tries[index] == 0, index))  # the suspects first
    while queue or running:
        while queue and len(running) < workers and not (tries[queue[0]] and running):
            index = queue.pop(0)
            tries[index] += 1
            running[pool.submit(job, pending[index])] = index
            if tries[index] > 1:
                break  # a suspect runs alone
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        broken: BrokenProcessPool | None = None
        for future in finished:
            index = running.pop(future)
            try:
                result = future.result()
            except BrokenProcessPool as error:
                broken = error
                running[future] = index
                continue
            except BaseException:
                for other in running:
                    other.cancel()
                raise
            del pending[index]
            done(index, result)
        if broken is not None:
            for index in running.values():
                if tries[index] >= attempts:
                    raise WorkerLost(f"shard {index}: its worker died {tries[index]} times") from broken
            return False
    return True


def _on_ray(
    job: Callable[[S], R], shards: Sequence[S], done: Callable[[int, R], None], address: str, attempts: int
) -> None:
    """The shards as Ray tasks (Ray runs a task again when its worker dies: `max_retries`)."""
    started = ray_started(address)
    remote = started.remote(max_retries=attempts - 1)(job)
    running = {remote.remote(shard): index for index, shard in enumerate(shards)}
    while running:
        finished, _ = started.wait(list(running), num_returns=1)
        for reference in finished:
            index = running.pop(reference)
            done(index, started.get(reference))


def ray_started(address: str) -> Any:
    """The `ray` module, connected to the cluster at `address` (`local`: one started here)."""
    try:
        import ray  # an optional extra: kvsched[ray]
    except ImportError as error:
        raise RayMissing("--ray needs Ray: pip install 'kvsched[ray]'") from error
    started: Any = ray
    if not started.is_initialized():
        started.init(address=None if address == "local" else address, log_to_driver=False)
    return started
