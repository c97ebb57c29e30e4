"""The machine's owner rules: the external holder (a producer that allocates pages, writes a
prefix into them and publishes it), the prefix store, standalone tables, and every operation
with an out-of-domain value in one argument position."""

from __future__ import annotations

from dataclasses import fields, replace

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from kvsched.spec import events as ev
from kvsched.testing.harness import IDENTITY_COUNT, UNKNOWN_IDENTITY, MachineBase, prefix_history, prefix_identity

# Values outside every argument's domain, and one valid event per operation to put them in.
BAD_VALUES: tuple[object, ...] = (-1, 2**32, 2**64, True, "7", 1.5, None, UNKNOWN_IDENTITY)
TEMPLATES: tuple[ev.Event, ...] = (
    ev.Retain(0),
    ev.Release(0),
    ev.Writable(0),
    ev.Admit(0, None),
    ev.Fork(0, 1),
    ev.EnsureWritable(0, 0),
    ev.PrepareDecodeRound(2),
    ev.MarkPrefillComplete(0),
    ev.SeedDecodeToken(0, 0),
    ev.RecordToken(0),
    ev.RecordTokens(0, 1),
    ev.Finish(0),
    ev.Publish(prefix_identity(0), (0,), 1),
    ev.Remove(prefix_identity(0)),
    ev.Reclaim(1),
    ev.Read(prefix_identity(0), 0, 0, 0),
    ev.NewTable(1),
)
HARNESS_FIELDS = {"views"}  # the harness's own sizes, not API arguments
OUT_OF_DOMAIN: tuple[ev.Event, ...] = tuple(
    replace(template, **{field.name: value})  # type: ignore[arg-type]
    for template in TEMPLATES
    for field in fields(template)
    if field.name not in HARNESS_FIELDS
    for value in BAD_VALUES
    if not (isinstance(template, ev.Writable) and value is None)  # None asks for a new page
)


class OwnerRules(MachineBase):
    """The producer, the store, standalone tables and out-of-domain calls."""

    @precondition(lambda self: len(self.external) < 4)
    @rule()
    def producer_allocate(self) -> None:
        self.run(ev.Allocate())

    @rule(pick=st.integers(0, 9), retain=st.booleans())
    def producer_hold(self, pick: int, retain: bool) -> None:
        """Take one more reference on a page, or drop one of the producer's own."""
        self.hold(self.page(pick), retain)

    def hold(self, page: int, retain: bool) -> None:
        """Retain `page`, or release it when the producer holds it (or nobody does)."""
        if retain:
            self.run(ev.Retain(page))
        elif page in self.external or self.ref_count(page) in (0, None):
            self.run(ev.Release(page))  # never someone else's reference

    @rule(pick=st.integers(0, 3))
    def hold_prefix_page(self, pick: int) -> None:
        """An external holder (an offload copy in flight, say) takes a reference on a prefix page."""
        pages = sorted({p for entry in self.sut.snapshot()[1].entries if entry for p in entry.page_set.pages})
        if pages:
            self.hold(pages[pick % len(pages)], retain=True)

    @precondition(lambda self: bool(self.external))
    @rule(pick=st.integers(0, 3))
    def producer_writable(self, pick: int) -> None:
        """The producer's own copy-on-write of a page it holds."""
        self.run(ev.Writable(sorted(self.external)[pick % len(self.external)]))

    @rule(prefix=st.integers(0, IDENTITY_COUNT - 1), request_id=st.integers(20, 22))
    def admit_at_the_reference_limit(self, prefix: int, request_id: int) -> None:
        """A hot prefix: outside holds fill its last page to the pool's maximum, then a request
        attaches it. Its earlier pages are retained first, so the refused install must undo them."""
        pool, store, _ = self.sut.snapshot()
        identity = prefix_identity(prefix)
        entry = next((e for e in store.entries if e is not None and e.page_set.identity == identity), None)
        last = entry.page_set.pages[-1] if entry is not None and len(entry.page_set.pages) > 1 else None
        if last is None or pool.max_references - pool.refs[last] > 4:
            return  # no such entry, or a maximum the harness cannot reach in a few holds
        for _ in range(pool.max_references - pool.refs[last]):
            self.run(ev.Retain(last))
        self.run(ev.Admit(request_id, identity))

    @rule(prefix=st.integers(0, IDENTITY_COUNT - 1), pages=st.integers(1, 3), tokens=st.integers(1, 6))
    def publish(self, prefix: int, pages: int, tokens: int) -> None:
        """Write a prefix into pages the producer alone holds, then publish them."""
        own = sorted({page for page in self.external if self.ref_count(page) == 1})
        chosen = own[:pages]
        if len(chosen) < pages:
            free = [page for page, count in enumerate(self.sut.snapshot()[0].refs) if count == 0]
            chosen += free[: pages - len(chosen)]  # a free page in the set: publish must refuse it
        if len(chosen) < pages:
            return
        token_count = min(tokens, len(chosen) * self.config.page_size)
        history = prefix_history(prefix, token_count)
        for position in range(token_count):
            page = chosen[position // self.config.page_size]
            if page in own:
                self.ghost.write(page, position, history[: position + 1])
        self.run(ev.Publish(prefix_identity(prefix), tuple(chosen), token_count))

    @precondition(lambda self: len(self.external) < 3)
    @rule(prefix=st.integers(0, IDENTITY_COUNT - 1), sets=st.integers(1, 2), pages=st.integers(1, 2))
    def publish_idle(self, prefix: int, sets: int, pages: int) -> None:
        """Publish `sets` prefixes, each written into fresh pages the producer then hands over to
        the store, so the store often holds several idle entries and reclaim must choose by
        recency."""
        for number in range(prefix, prefix + sets):
            fresh = []
            for _ in range(pages):
                allocated = self.run(ev.Allocate())
                if allocated.error is not None:
                    break
                fresh.append(int(allocated.value))
            token_count = len(fresh) * self.config.page_size - 1
            if fresh:
                history = prefix_history(number % IDENTITY_COUNT, token_count)
                for position in range(token_count):
                    self.ghost.write(fresh[position // self.config.page_size], position, history[: position + 1])
                self.run(ev.Publish(prefix_identity(number % IDENTITY_COUNT), tuple(fresh), token_count))
            for page in fresh:
                self.run(ev.Release(page))

    @rule(prefix=st.integers(0, IDENTITY_COUNT))
    def remove(self, prefix: int) -> None:
        self.run(ev.Remove(UNKNOWN_IDENTITY if prefix == IDENTITY_COUNT else prefix_identity(prefix)))

    @rule(pages=st.integers(-1, 7))
    def reclaim(self, pages: int) -> None:
        self.run(ev.Reclaim(pages))

    @rule()
    def reclaim_one_page(self) -> None:
        """Free exactly one more page: an engine under pressure asks the store for what it needs."""
        self.run(ev.Reclaim(len(self.sut.snapshot()[0].free) + 1))

    # -- standalone tables ---------------------------------------------------------------------

    def table_count(self) -> int:
        """How many standalone tables the system has (0 for a system without them)."""
        return len(getattr(self.sut, "tables", ()))

    def has_tables(self) -> bool:
        """The system has standalone tables, and at least one exists."""
        return self.table_count() > 0

    @precondition(lambda self: hasattr(self.sut, "new_table") and self.table_count() < 3)
    @rule(width=st.integers(0, 4))
    def new_table(self, width: int) -> None:
        self.run(ev.NewTable(width))

    @precondition(lambda self: self.has_tables())
    @rule(table=st.integers(0, 2), logical_page=st.integers(-1, 4))
    def table_writable(self, table: int, logical_page: int) -> None:
        self.run(ev.TableWritable(table % self.table_count(), logical_page))

    @precondition(lambda self: self.has_tables())
    @rule(source=st.integers(0, 2), into=st.integers(0, 2))
    def table_fork(self, source: int, into: int) -> None:
        count = self.table_count()
        self.run(ev.TableFork(source % count, into % count))

    @precondition(lambda self: self.has_tables())
    @rule(table=st.integers(0, 2), picks=st.lists(st.integers(0, 9), max_size=4))
    def table_install(self, table: int, picks: list[int]) -> None:
        self.run(ev.TableInstall(table % self.table_count(), tuple(self.page(pick) for pick in picks)))

    @precondition(lambda self: self.has_tables())
    @rule(table=st.integers(0, 2))
    def table_release(self, table: int) -> None:
        self.run(ev.TableRelease(table % self.table_count()))

    @precondition(lambda self: self.has_tables())
    @rule(table=st.integers(0, 2), prefix=st.integers(-1, IDENTITY_COUNT))
    def attach(self, table: int, prefix: int) -> None:
        identity = None if prefix < 0 else UNKNOWN_IDENTITY if prefix == IDENTITY_COUNT else prefix_identity(prefix)
        self.run(ev.Attach(identity, table % self.table_count()))

    # -- out of domain -------------------------------------------------------------------------

    @rule(event=st.sampled_from(OUT_OF_DOMAIN))
    def out_of_domain(self, event: ev.Event) -> None:
        """An operation with a value outside its domain in one argument position: a typed
        refusal that changes nothing, the same as the reference's."""
        self.run(event)
