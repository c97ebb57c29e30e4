"""A search's seen-set cut into parts, each kept by an owner of its own: local processes or Ray actors.

`Partitions(parts)` starts `parts` owners. The coordinator routes a key to owner
`hash(key) % parts` (its own process's hash: only the coordinator routes, so a key's owner never
changes), and talks to the owners once per level, in batches:

    seen(keys)             which of a level's distinct keys an earlier level numbered (every owner
                           asked at once, each about its part)
    insert(keys, numbers)  the keys a level's walk numbered, with their numbers
    forget(number)         every key numbered `number` or later (a level walked again)

An owner holds a dict of its keys; the coordinator then holds none of the search's keys between
levels, only the level's own. Every owner appends what it is told to change to a log (a file in
`directory`) before it answers: an owner that dies is replaced by one that reads the log back, and
the command it did not answer is sent again (each is idempotent), so a dead owner changes no
answer. On Ray an owner is an actor that Ray restarts, reading the same log (the directory must
then be one every node reaches).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import shutil
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

RESTARTS = 3  # owners started in one part's place before its loss is the search's


class OwnerLost(RuntimeError):
    """An owner died on every restart."""


class Owner:
    """One part of the seen-set: its keys and their numbers, and the log that rebuilds them."""

    def __init__(self, log: str) -> None:
        self.log = Path(log)
        self.numbers: dict[Any, int] = {}
        if self.log.exists():
            with self.log.open("rb+") as records:
                good = 0
                while True:
                    try:
                        self._apply(pickle.load(records))
                    except (EOFError, pickle.UnpicklingError, ValueError, IndexError):
                        break  # the end, or a record cut short by a death: its command is sent again
                    good = records.tell()
                records.truncate(good)

    def seen(self, keys: Sequence[Any]) -> list[bool]:
        """For each key, whether it is numbered."""
        numbers = self.numbers
        return [key in numbers for key in keys]

    def insert(self, keys: Sequence[Any], numbers: Sequence[int]) -> int:
        """Number `keys`; how many keys this owner holds."""
        return self._change(("insert", list(keys), list(numbers)))

    def forget(self, number: int) -> int:
        """Forget every key numbered `number` or later; how many keys this owner holds."""
        return self._change(("forget", number))

    def size(self) -> int:
        return len(self.numbers)

    def cpu(self) -> float:
        """The CPU seconds of this owner's process so far."""
        return time.process_time()

    def _change(self, record: tuple[Any, ...]) -> int:
        with self.log.open("ab") as records:
            pickle.dump(record, records)
        self._apply(record)
        return len(self.numbers)

    def _apply(self, record: tuple[Any, ...]) -> None:
        if record[0] == "insert":
            self.numbers.update(zip(record[1], record[2], strict=True))
        else:
            self.numbers = {key: number for key, number in self.numbers.items() if number < record[1]}


def serve(connection: Connection, log: str) -> None:
    """A local owner's process: answer the coordinator's commands until it says stop."""
    owner = Owner(log)
    while True:
        command, arguments = connection.recv()
        if command == "stop":
            return
        connection.send(getattr(owner, command)(*arguments))


class Partitions:
    """The owners of a seen-set's `parts` (see the module docstring)."""

    def __init__(
        self, parts: int, *, ray: str | None = None, directory: str | None = None, resume: bool = False
    ) -> None:
        """`parts` owners logging in `directory` (default: a temporary one, removed at `close`);
        `resume`: they read back the logs there (else a log left there is removed first)."""
        if parts < 1:
            raise ValueError(f"a seen-set needs 1 or more parts, not {parts}")
        self.parts, self.ray = parts, ray
        self._made = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="kvsched-seen-") if directory is None else directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if not resume:
            for log in self.directory.glob("part-*.log"):
                log.unlink()
        self.processes: list[Any] = [None] * parts
        self._connections: list[Connection | None] = [None] * parts
        self._actors: list[Any] = []
        self.restarts = 0
        if ray is not None:
            from kvsched.testing.workers import ray_started  # an optional extra: kvsched[ray]

            started = ray_started(ray)
            actor = started.remote(max_restarts=RESTARTS, max_task_retries=RESTARTS)(Owner)
            self._actors = [actor.remote(str(self._log(part))) for part in range(parts)]
            self._ray = started

    def __enter__(self) -> Partitions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def part(self, key: Any) -> int:
        return hash(key) % self.parts

    def seen(self, keys: Sequence[Any]) -> list[bool]:
        """For each key, whether an earlier `insert` numbered it (and no `forget` since)."""
        routed: list[list[Any]] = [[] for _ in range(self.parts)]
        where = []
        for key in keys:
            part = self.part(key)
            where.append((part, len(routed[part])))
            routed[part].append(key)
        answers = self._all("seen", [(part_keys,) for part_keys in routed])
        return [answers[part][position] for part, position in where]

    def insert(self, keys: Sequence[Any], numbers: Sequence[int]) -> None:
        routed: list[tuple[list[Any], list[int]]] = [([], []) for _ in range(self.parts)]
        for key, number in zip(keys, numbers, strict=True):
            part_keys, part_numbers = routed[self.part(key)]
            part_keys.append(key)
            part_numbers.append(number)
        self._all("insert", routed)

    def forget(self, number: int) -> None:
        self._all("forget", [(number,)] * self.parts)

    def sizes(self) -> list[int]:
        """How many keys each owner holds."""
        return self._all("size", [()] * self.parts)

    def cpu(self) -> float:
        """The owners' CPU seconds so far, together (a replaced owner's from its start)."""
        return float(sum(self._all("cpu", [()] * self.parts)))

    def close(self) -> None:
        """Stop the owners and remove the logs of a directory this made."""
        for part, connection in enumerate(self._connections):
            if connection is not None:
                with contextlib.suppress(BrokenPipeError, OSError):  # an owner that died needs no stop
                    connection.send(("stop", ()))
                self.processes[part].join(timeout=10)
                connection.close()
        self._connections = [None] * self.parts
        if self._actors:
            for actor in self._actors:
                self._ray.kill(actor)
            self._actors = []
        if self._made:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _log(self, part: int) -> Path:
        return self.directory / f"part-{part}.log"

    def _all(self, command: str, arguments: Sequence[tuple[Any, ...]]) -> list[Any]:
        """`command` on every owner (owner `part` with `arguments[part]`), all at once; the answers."""
        if self._actors:
            calls = [
                getattr(actor, command).remote(*given) for actor, given in zip(self._actors, arguments, strict=True)
            ]
            return list(self._ray.get(calls))
        for part, given in enumerate(arguments):
            self._send(part, command, given)
        return [self._receive(part, command, given) for part, given in enumerate(arguments)]

    def _send(self, part: int, command: str, given: tuple[Any, ...]) -> None:
        connection = self._connections[part] or self._start(part)
        try:
            connection.send((command, given))
        except (BrokenPipeError, OSError):
            self._restart(part).send((command, given))

    def _receive(self, part: int, command: str, given: tuple[Any, ...]) -> Any:
        for _ in range(RESTARTS + 1):
            connection = self._connections[part]
            assert connection is not None
            try:
                return connection.recv()
            except (EOFError, OSError):
                self._restart(part).send((command, given))  # its log holds what it had done
        raise OwnerLost(f"the owner of part {part} died {RESTARTS + 1} times")

    def _start(self, part: int) -> Connection:
        mine, theirs = multiprocessing.get_context("spawn").Pipe()
        process = multiprocessing.get_context("spawn").Process(
            target=serve, args=(theirs, str(self._log(part))), daemon=True
        )
        process.start()
        theirs.close()
        self.processes[part], self._connections[part] = process, mine
        return mine

    def _restart(self, part: int) -> Connection:
        self.restarts += 1
        if self.restarts > RESTARTS * self.parts:
            raise OwnerLost(f"owners died {self.restarts} times")
        old = self._connections[part]
        if old is not None:
            old.close()
        process = self.processes[part]
        if process is not None:
            process.join(timeout=10)
        return self._start(part)
