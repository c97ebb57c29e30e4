"""The catalogue of known bugs: each written once, with every layer where it is realised and the
check expected to catch it there.

A bug is one sentence about what goes wrong. Its realisations live beside the code they break:

- `variant`: a broken spec system (`kvsched.testing.variants.VARIANTS`), which the stateful
  machine and the explorer, with no reference beside them, must both catch with `kind`;
  `tests/bugs/golden/<id>.out` holds the explorer's failure and its shortest program;
- `mutant`: a broken impl class (`devtools.mutants_corpus.MUTANTS`, patches that match code and
  ignore comments), which the machine in lockstep with the spec must catch with `mutant_kind`
  and, where `explored`, the explorer in lockstep too (the others need a plain-int-free id, two
  store entries or more decoding states than its bounds hold);
- `encoding`: a broken z3 transition encoding (`kvsched.proofs.broken`), which the inductive
  proofs refute (or, for a drifted one, the conformance test rejects);
- `contracts`: broken CrossHair targets (`devtools.broken_contracts`), for each of which the
  gate must find a counterexample (`make contracts`; `COUNTEREXAMPLES` pins one, replayed in the tests);
- `engine`: a broken engine (`kvsched.testing.engine_variants.ENGINE_VARIANTS`), which the engine
  machine catches with the variant's named checks (its pinned programs: `tests/engine/golden/`)
  and, where the explorer can see it, the engine explorer too (`tests/proofs/test_engine_explorer.py`);
- `slots`: a broken z3 encoding of the engine's state-slot transitions
  (`kvsched.proofs.engine_slots.broken`), which the bounded check refutes;
- `cache`: a broken z3 encoding of the prefix cache's conservation
  (`kvsched.proofs.cache_conservation.broken`), which its proof refutes;
- `reserve`: a wrong evictable reserve (`devtools.vllm.variants.VARIANTS`), which the reserve's
  machine and explorer in lockstep with the spec tell apart (and `make vllm`'s own tests fail);
- `reserve_encoding`: a broken z3 encoding of the reserve (`kvsched.proofs.reserve_safety.broken`),
  which its proof refutes;
- `manager`: a page manager broken for one safety-mode check (`devtools.broken_managers.MANAGERS`),
  which safety mode catches with that check on the manager's pinned calls;
- `tiers`: a broken tiered cache (`kvsched.testing.tier_variants.VARIANTS`, one per upstream bug),
  which its named check catches on a pinned program and the tiers' explorer in lockstep tells apart
  (`tests/impl/test_tiers.py`);
- `tiers_encoding`: a broken z3 encoding of the tiered cache's holders (`kvsched.proofs.tier_safety.broken`),
  which its proof refutes;
- `router_index`: a broken router index (`kvsched.testing.index_variants.VARIANTS`, one per upstream
  bug), which the check against the scripted engines catches on a pinned program and the index's
  explorer in lockstep tells apart (`tests/impl/test_router_index.py`);
- `index_encoding`: a broken z3 encoding of the index's fold (`kvsched.proofs.index_fold.broken`),
  which its proof refutes;
- `groups`: broken KV groups (`kvsched.testing.group_variants.VARIANTS`, one per upstream hybrid-KV
  bug), which its named check catches on a pinned program (`tests/impl/test_kv_groups.py`: the
  check is the test's `PROGRAMS` entry; the machine beside the spec finds every one unaided; the
  six the adapter protocol sees, `kvsched check` finds at its defaults through
  `kvsched.testing.adapters.kvsched_groups`: `tests/testing/test_check_groups.py`);
- `groups_encoding`: a broken z3 encoding of the groups' ownership (`kvsched.proofs.group_safety.broken`),
  which its proof refutes.

This module and its golden files live with the tests: none of it is in the wheel.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.testing.checks import FailureKind

ATOMICITY, EXCLUSIVE, INVARIANT, LIFO, LOCKSTEP = (
    FailureKind.ATOMICITY,
    FailureKind.EXCLUSIVE,
    FailureKind.INVARIANT,
    FailureKind.LIFO,
    FailureKind.LOCKSTEP,
)


@dataclass(frozen=True, slots=True)
class Bug:
    """One known bug and where it is realised (names into each layer's corpus)."""

    id: str
    sentence: str
    variant: str | None = None
    kind: FailureKind | None = None  # what the machine and the explorer report on the variant
    mutant: str | None = None
    mutant_kind: FailureKind = LOCKSTEP
    explored: bool = True  # the explorer in lockstep catches the mutant within the catalogue's bounds
    encoding: str | None = None
    contracts: tuple[str, ...] = ()
    engine: str | None = None
    slots: str | None = None
    cache: str | None = None  # a broken form the prefix cache's z3 proofs refute
    reserve: str | None = None
    reserve_encoding: str | None = None
    manager: str | tuple[str, ...] | None = None
    tiers: str | None = None  # a broken tiered cache (host tier, copies, leases, two phases)
    tiers_encoding: str | None = None
    router_index: str | None = None  # a broken router index (KV events folded wrongly)
    index_encoding: str | None = None  # a broken z3 encoding of the index's fold
    groups: str | None = None  # broken KV groups (windows, recurrent state, drafts)
    groups_encoding: str | None = None  # a broken z3 encoding of the groups' ownership


CATALOGUE: tuple[Bug, ...] = (
    # -- the pool --------------------------------------------------------------------------------
    Bug(
        "fifo-reuse",
        "Freed pages are reused first-in-first-out, so the page freed last is not the next one handed out.",
        variant="pages reused first-in-first-out",
        kind=LIFO,
        mutant="freed pages reused first-in-first-out",
        encoding="FifoAllocate",
    ),
    Bug(
        "release-never-frees",
        "A page whose last reference is dropped never goes back on the free stack.",
        mutant="release never frees a page at zero",
        encoding="ReleaseSkipsPush",
        contracts=("pool_release",),
        reserve_encoding="free_leaves_it_off_the_queue",
    ),
    Bug(
        "cow-skipped",
        "Copy-on-write is skipped for a page two owners share, so one writes the other's page.",
        mutant="copy-on-write skipped at refcount 2",
        encoding="WriteSharedInPlace",
        contracts=("pool_writable",),
        manager=("cow_in_place", "offload_cow_above_2"),
    ),
    Bug(
        "cow-release-first",
        "Copy-on-write drops the source's reference before the copy is allocated; refused, the drop stays.",
        mutant="writable releases the source before allocating",
        encoding="ReleaseSourceFirst",
        contracts=("impl_writable",),
        manager="cow_release_first",
    ),
    Bug(
        "cow-keeps-source",
        "Copy-on-write takes the copy but never drops the source's reference.",
        contracts=("kernel_ensure_rows", "impl_ensure"),
    ),
    Bug("cow-forgets-pop", "Copy-on-write takes the top free page without popping it.", encoding="CopyForgetsToPop"),
    Bug(
        "retain-past-maximum",
        "A retain takes one reference past the pool's maximum.",
        mutant="retain allows one reference past the maximum",
        encoding="RetainPastMaximum",
    ),
    Bug(
        "retain-free-page",
        "A retain revives a free page (a use after free): counted, yet still on the free stack.",
        encoding="RetainFreePage",
        contracts=("impl_pool",),
        reserve_encoding="revive_leaves_it_queued",
    ),
    Bug(
        "allocate-leaves-free",
        "An allocated page keeps its place on the free stack.",
        encoding="AllocateLeavesPageFree",
    ),
    Bug(
        "allocate-unowned",
        "An outside holder's allocation is never recorded as its hold.",
        encoding="AllocateWithoutOwner",
    ),
    Bug(
        "release-keeps-reference",
        "An outside holder's release forgets its hold but the pool keeps the reference.",
        encoding="ReleaseSkipsDecrement",
    ),
    Bug("initial-misses-page", "A fresh pool's free stack is missing page 0.", encoding="InitialMissesPageZero"),
    Bug(
        "undo-skips-first",
        "A refused multi-page release undoes every page but the first.",
        contracts=("impl_release",),
    ),
    # -- page lists: install, fork, release --------------------------------------------------------
    Bug(
        "install-no-rollback",
        "A prefix install that fails part-way keeps the references it took before the failure.",
        variant="install_shared_prefix without rollback",
        kind=ATOMICITY,
        mutant="install_shared_prefix without rollback",
        encoding="SkipRollback",
        contracts=("kernel_retain_pages", "impl_retain"),
    ),
    Bug("install-repeats-page", "A prefix install accepts one page at two positions.", contracts=("impl_install",)),
    Bug(
        "retain-step-uncounted",
        "A list retain takes a pool reference but records no owner for it.",
        encoding="RetainStepUncounted",
    ),
    Bug(
        "release-step-keeps",
        "A list release forgets the hold in flight but the pool keeps the reference.",
        encoding="ReleaseStepKeepsReference",
    ),
    Bug(
        "fork-no-retain",
        "A fork shares the parent's pages without retaining them.",
        mutant="fork shares pages without retaining them",
    ),
    Bug("fork-keeps-parent-id", "A fork admits the child under the parent's request id.", encoding="ForkKeepsParentId"),
    # -- the request lifecycle ---------------------------------------------------------------------
    Bug(
        "finish-leaks",
        "Finishing a request releases all of its pages but one.",
        variant="finish leaks one page",
        kind=INVARIANT,
        mutant="finish leaks the first page",
        encoding="FinishLeaksPages",
        manager="leak",
    ),
    Bug(
        "finish-foreign-pool",
        "Finish releases a request's pages in whatever pool it is handed, not the one it is bound to.",
        variant="finish in another pool",
        kind=INVARIANT,
    ),
    Bug(
        "stale-slot-index",
        "Finish leaves the request's id in the slot index: the id still finds a cleared slot.",
        mutant="stale request-id entry after finish",
        mutant_kind=INVARIANT,
    ),
    Bug("finish-keeps-count", "Finish clears a slot but its token count.", mutant="finish leaves the token count"),
    Bug(
        "duplicate-after-capacity",
        "Admission reports a full scheduler before it reports a duplicate id.",
        mutant="duplicate check after the capacity check",
        contracts=("scheduler_admit",),
    ),
    Bug("admit-duplicate", "Admission skips the duplicate-request check.", encoding="AdmitDuplicate"),
    Bug(
        "highest-empty-slot",
        "Admission takes the highest empty slot, not the lowest.",
        mutant="admission takes the highest empty slot",
    ),
    Bug(
        "fork-full-before-unknown",
        "A fork into a full scheduler reports Full for an unknown parent.",
        contracts=("impl_scheduler",),
    ),
    Bug(
        "numpy-id-unknown",
        "An integer id that is not a plain int is taken for an unknown request.",
        mutant="an integer id that is not a plain int is unknown",
        explored=False,
    ),
    Bug(
        "complete-from-decode",
        "Completing a prefill also moves a request that is already decoding.",
        mutant="mark_prefill_complete moves a decoding request",
    ),
    Bug(
        "complete-any-slot",
        "Completing a prefill does not look the request up: any slot becomes DECODE.",
        encoding="CompleteAnySlot",
    ),
    Bug("seed-any-token", "A seeded token id outside u32 is accepted.", encoding="SeedAnyToken"),
    Bug("record-past-u32", "The token count runs past 2**32 - 1.", encoding="RecordWithoutSaturation"),
    Bug(
        "chunk-counted-once",
        "A prefill chunk of n tokens is counted as one token.",
        mutant="a prefill chunk is counted as one token",
        explored=False,
    ),
    Bug(
        "hit-counts-no-tokens",
        "A prefix hit records its prefix tokens but not its token count.",
        encoding="HitCountsNoTokens",
    ),
    Bug(
        "batch-half-undone",
        "A refused write batch leaves the copies and allocations of the steps before the refusal.",
        contracts=("impl_batch",),
    ),
    # -- the decode round --------------------------------------------------------------------------
    Bug(
        "outputs-before-check",
        "A decode round applies its outputs before checking that they answer its items.",
        variant="outputs applied before the identity check",
        kind=ATOMICITY,
        mutant="outputs applied before the identity check",
        explored=False,
    ),
    Bug(
        "round-writes-shared",
        "A decode round writes a request's token into a page another owner still reads.",
        variant="a round that writes shared pages",
        kind=EXCLUSIVE,
    ),
    Bug(
        "aliased-scratch",
        "A decode round takes scratch buffers that share memory, so its outputs overwrite its tables.",
        variant="a round on buffers that share memory",
        kind=ATOMICITY,
        mutant="a round takes scratch buffers that share memory",
    ),
    Bug(
        "table-offset",
        "Lowering gives each item a block-table offset one past its table.",
        mutant="block-table offset off by one in lowering",
    ),
    Bug(
        "stale-outputs",
        "A round leaves the previous round's records in the outputs it did not write.",
        mutant="decode round leaves stale outputs",
    ),
    Bug("round-every-slot", "A committed round counts a token in empty slots too.", encoding="RoundAdvancesEverySlot"),
    Bug("zero-launches", "A round accepts a backend that reports zero launches.", contracts=("impl_round",)),
    Bug(
        "short-items-misnamed",
        "A round reports a short item buffer as a short output buffer.",
        contracts=("impl_round_buffers",),
    ),
    # -- the prefix store --------------------------------------------------------------------------
    Bug(
        "attach-no-lru",
        "An attach does not refresh the entry's LRU stamp.",
        mutant="attach does not refresh the LRU stamp",
    ),
    Bug(
        "reclaim-most-recent",
        "Reclaim evicts the most recently used idle entry instead of the least.",
        mutant="reclaim evicts the most recently used",
        explored=False,
        contracts=("prefix_reclaim",),
    ),
    Bug(
        "reclaim-in-use",
        "Reclaim evicts entries whose pages a request still maps.",
        mutant="reclaim evicts entries still in use",
    ),
    Bug("reclaim-stops-short", "Reclaim stops one page short of its target.", contracts=("impl_store",)),
    Bug(
        "publish-release-first",
        "Publishing over an entry releases the old set before retaining the new one.",
        mutant="publish releases the old set before retaining the new",
    ),
    Bug(
        "publish-keeps-replaced",
        "Publishing over an entry never releases the replaced set.",
        encoding="PublishKeepsReplaced",
    ),
    Bug(
        "remove-keeps-references",
        "Removing (or evicting) an entry empties it without releasing its pages.",
        mutant="remove keeps the entry's page references",
        encoding="EvictWithoutRelease",
    ),
    # -- the engine ------------------------------------------------------------------------------
    Bug(
        "preempted-loses-place",
        "A preempted request re-enters at the back of the queue, behind later arrivals (vLLM #41951).",
        engine="preempt_to_back",
    ),
    Bug(
        "too-large-blocks-queue",
        "A request larger than the cache is accepted and blocks the queue forever (vLLM #39734).",
        engine="admit_too_large",
    ),
    Bug(
        "pressure-deadlock",
        "Under KV pressure the engine fails every step instead of preempting: it deadlocks (vLLM #45388).",
        engine="never_preempt",
    ),
    Bug(
        "full-hit-prefills-nothing",
        "A full prefix hit prefills zero tokens and samples logits it never computed (nano-vllm PR #199).",
        engine="full_hit_prefills_nothing",
        manager="full_hit",
    ),
    Bug(
        "memory-guard-skipped",
        "Admission ignores the free-page reserve while requests run.",
        engine="skip_memory_guard",
    ),
    Bug(
        "state-slot-double-release",
        "A recurrent-state slot is released twice, so two requests later share it.",
        engine="state_slot_released_twice",
        slots="give_back_twice",
    ),
    Bug("state-slot-taken-held", "Admission takes a state slot another request holds.", slots="take_a_held_slot"),
    Bug(
        "decode-copies-skipped",
        "The decode round's copy-on-write copies are never handed to the model.",
        engine="decode_copies_skipped",
    ),
    Bug(
        "failed-step-kept",
        "A model failure inside a step leaves the step's allocations and tokens behind.",
        engine="failed_step_kept",
    ),
    Bug(
        "failed-round-kept",
        "A model failure leaves the room's new pages mapped.",
        engine="failed_round_kept",
        contracts=("impl_engine_step",),
    ),
    Bug(
        "round-answers-kept",
        "A prefill that fails after the step's decode round ran keeps the round's answers in the slots.",
        engine="round_answers_kept",
    ),
    Bug(
        "admissions-kept",
        "A prefill that fails after the step admitted keeps the newcomers seated, and queued again.",
        engine="admissions_kept",
    ),
    # -- the automatic prefix cache ------------------------------------------------------------
    Bug(
        "cache-before-write",
        "A page enters the prefix cache when it is allocated, before its KV is written (TGI #2489).",
        engine="publish_on_allocation",
        manager="unwritten_hit",
    ),
    Bug(
        "evicted-key-stays",
        "An evicted page is freed but its key still maps to it, so a stale page is served (nano-vllm #163;"
        " vLLM's BlockPool handing a cached block out with its hash, #49449's class).",
        engine="evict_keeps_key",
        cache="evict_keeps_key",
        reserve_encoding="allocate_keeps_keys",
        manager="key_outlives",
    ),
    Bug(
        "key-names-another-page",
        "The prefix cache names a key's content on a page that holds other KV (two pages under one key),"
        " so a later hit on that key serves it.",
        manager="key_on_two_pages",
    ),
    Bug(
        "cache-holds-no-reference",
        "The cache takes no reference of its own, so a cached page is freed and reused under its key (vLLM #5543).",
        engine="cache_holds_no_reference",
        cache="insert_without_reference",
    ),
    Bug(
        "attach-repeats-page",
        "A cache hit attaches one page at two positions of a table.",
        contracts=("impl_attach",),
    ),
    Bug(
        "evict-held-page",
        "Eviction frees a cached page a request still reads.",
        cache="evict_frees_a_held_page",
    ),
    Bug(
        "tenants-share-pages",
        "Page keys leave out the tenant, so two tenants with one prompt share KV pages (vLLM's hash advisory).",
        engine="salt_dropped",
        manager="offload_unsalted",
    ),
    # -- the evictable reserve and safety mode ----------------------------------------------------
    Bug(
        "parked-newest-first",
        "A freed cached page is parked at the front of the free queue, so the newest parked page is evicted first.",
        reserve="NewestFirst",
        reserve_encoding="free_puts_a_named_page_first",
    ),
    Bug(
        "evict-first-parked",
        "A cached page whose content another tier holds is freed to the back of the queue, not the eviction end,"
        " so pages only this pool holds are evicted before it (an override that drops vLLM 0.34's evict_first).",
        reserve="EvictFirstParks",
        reserve_encoding="evict_first_parks_at_the_back",
    ),
    Bug(
        "free-drops-keys",
        "A page's keys are forgotten when its last holder frees it, so nothing freed is ever hit again.",
        reserve="DropHashOnFree",
    ),
    Bug(
        "write-cached-page",
        "A page still registered under a key is written with other content, so a hit serves the wrong KV.",
        reserve_encoding="write_a_named_page",
    ),
    Bug(
        "register-other-content",
        "A page is registered under a key that names content it does not hold.",
        reserve_encoding="register_other_content",
    ),
    Bug(
        "touch-counts-reserved",
        "A hit on the reserved null page takes a reference on it, as if a request could own it.",
        reserve_encoding="touch_counts_the_reserved",
    ),
    Bug(
        "view-miscounts-holders",
        "A page manager reports more holders of a page than the live tables that hold it.",
        manager="holder_count",
    ),
    Bug(
        "refusal-allocates",
        "A refused admission takes a page anyway: the refusal is not all-or-nothing.",
        manager="refusal_allocates",
    ),
    Bug(
        "fork-writes-shared-tail",
        "A forked child decodes into the last page it shares with its parent, without a copy.",
        manager="no_copy",
    ),
    # -- the tiered cache ------------------------------------------------------------------------
    Bug(
        "loaded-page-unkeyed",
        "A page loaded back from the host tier enters the lookup map but never gets its own key, so when it is"
        " reused the map keeps a stale entry and a later hit serves other KV.",
        manager="offload_loaded_unkeyed",
    ),
    Bug(
        "failed-store-keyed",
        "A store to the host that failed still registers its key on the host page, so a later load of that key"
        " serves whatever the page held.",
        manager="offload_failed_store_keyed",
    ),
    Bug(
        "host-index-keeps-old-key",
        "A full host tier reuses its oldest page while its index still maps the old key to it, so a later load"
        " of that key serves another page's KV.",
        manager="offload_host_keeps_old_key",
    ),
    Bug(
        "abort-frees-pages-under-a-copy",
        "An abort frees a page a copy is still writing; the late write lands in the next owner's page (SGLang #24527).",
        tiers="sglang_24527_abort_frees_pages_under_a_copy",
        manager=("promote_into_other", "offload_freed_under_load"),
    ),
    Bug(
        "preemption-frees-leased-pages",
        "A preemption frees pages an asynchronous reader still holds; it reads another owner's KV (DingoCache PR #76).",
        tiers="dingocache_76_preemption_frees_pages_a_lease_reads",
        manager=("free_drops_leases", "offload_free_drops_leases"),
        tiers_encoding="release_lets_go_of_the_lease",
        engine="lease_holds_nothing",
    ),
    Bug(
        "host-page-reclaimed-mid-copy",
        "A host page a promotion still reads is reclaimed for a demotion (SGLang PR #38480).",
        tiers="sglang_38480_host_page_reclaimed_mid_copy",
        tiers_encoding="host_evict_under_a_copy",
        engine="host_page_taken_while_read",
        manager="promote_reclaimed",
    ),
    Bug(
        "pin-trusts-device-lookup",
        "Admission pins the device pages an earlier lookup found without asking again; one was reused (vLLM #37076).",
        tiers="vllm_37076_commit_trusts_the_device_match",
        manager="commit_trusts_lookup",
        tiers_encoding="take_a_page_that_is_not_free",
    ),
    Bug(
        "pin-trusts-host-lookup",
        "Admission loads the host pages an earlier lookup found without asking again; one was reused (vLLM #39702).",
        tiers="vllm_39702_commit_trusts_the_host_match",
    ),
    Bug(
        "host-hashes-never-registered",
        "A completed demotion is never registered on the host: every host lookup misses (vLLM #53498).",
        tiers="vllm_53498_host_hashes_never_registered",
        engine="host_lookup_misses",
        manager="demote_never_registers",
    ),
    Bug(
        "reused-host-page-keeps-key",
        "An evicted host page keeps its key, so reusing it restores another block's KV (TRT-LLM #8813).",
        tiers="trtllm_8813_reused_host_page_keeps_its_key",
        manager="promote_wrong_host_page",
    ),
    Bug(
        "same-block-twice-in-one-free",
        "A free lets go of a page for its request and for the copy reading it: a double free (vLLM #42571).",
        tiers="vllm_42571_same_block_twice_in_one_free",
        tiers_encoding="release_counted_twice",
    ),
    Bug(
        "copy-reads-unwritten-page",
        "An asynchronous reader starts on a page the forward pass has not written (SGLang PR #33970).",
        tiers="sglang_33970_copy_reads_an_unwritten_page",
        manager="demote_unwritten",
    ),
    Bug(
        "promotion-not-awaited",
        "A request computes on pages whose copy from the host has not completed: it reads KV never written.",
        engine="promotion_not_awaited",
    ),
    Bug(
        "demotion-source-reused",
        "A page being copied to the host is evicted and reused before the copy reads it: the host keeps"
        " another request's KV (DingoCache PR #76's class).",
        engine="demotion_source_freed",
        manager="offload_store_unpinned",
    ),
    Bug(
        "failed-copy-served",
        "A copy from the host that failed is taken as completed: the request reads a partial write.",
        engine="failed_promotion_served",
        manager="offload_failed_load_cached",
    ),
    Bug(
        "host-page-counted-free",
        "A host page a demotion took stays on the host's free list: the tier counts it twice (TRT-LLM PR #12834).",
        manager="host_freed_twice",
    ),
    Bug(
        "host-page-lost",
        "A host page a demotion took is counted neither free nor cached: the tier loses it (TRT-LLM PR #12834).",
        manager="host_page_lost",
    ),
    Bug(
        "host-key-on-two-pages",
        "A key demoted again lands on a second host page while the first keeps it: two pages, one key.",
        manager="host_key_twice",
    ),
    Bug(
        "save-never-registered",
        "A connector's save copies pages to the host tier and never registers them: the host pages stay"
        " in flight and every lookup misses (vLLM #53498, on the save side).",
        manager="save_never_registers",
    ),
    Bug(
        "save-reads-unwritten",
        "A connector's save copies its request's last page, not yet written, to the host tier"
        " (SGLang PR #33970, on the save side).",
        manager="save_unwritten",
    ),
    Bug(
        "save-copies-crossed",
        "A connector's save copies two pages each into the host page the other's key was given: a later"
        " load restores the other page's KV (TRT-LLM #8813, on the store side).",
        manager="save_crossed",
    ),
    Bug(
        "copy-keeps-its-hold",
        "A completed copy's count stays on the page it read: the page never comes back.",
        tiers_encoding="demoted_keeps_the_device_hold",
    ),
    Bug(
        "forgotten-copy",
        "A step starts its promotions, fails to start its demotions and fails every copy: the copies it"
        " started run on, onto pages the engine hands to a newcomer.",
        engine="copies_issued_in_two_calls",
    ),
    Bug(
        "unstarted-copies-kept",
        "A step whose start_copies raised keeps its copies in flight, though the backend runs none: the"
        " engine waits on copies that never run.",
        engine="unstarted_copies_kept",
    ),
    Bug(
        "failing-tier-stalls",
        "A page whose demotion failed is demoted again at every eviction: with the host failing, the"
        " engine never serves its queue.",
        engine="failed_demotion_retried",
    ),
    Bug(
        "bad-host-page-first",
        "A host page a copy failed on is handed straight back to the next demotion.",
        engine="failed_host_page_first",
    ),
    Bug(
        "adapters-share-pages",
        "Page keys keep the tenant but leave out the LoRA adapter: one adapter's KV is served to another"
        " (vLLM #30931's class).",
        engine="adapter_dropped",
    ),
    Bug(
        "budget-forgets-decode",
        "The prefill budget forgets the step's decode tokens: a step runs past max_batched_tokens.",
        engine="budget_forgets_decode",
    ),
    # -- KV events and the router's index ------------------------------------------------------------
    Bug(
        "reset-unpublished",
        "A cache reset publishes no AllBlocksCleared: a router's index keeps every block the reset dropped"
        " (the publisher's side of aibrix PR #2385).",
        manager="reset_unpublished",
    ),
    Bug(
        "session-keeps-stale-keys",
        "A rebuilt session keeps its earlier prompt's block hashes for pages that now hold other tokens:"
        " the wrong prefix hits (vLLM #49449).",
        engine="session_keeps_stale_keys",
    ),
    Bug(
        "stored-after-removed",
        "The KV event publisher stores a block again after its BlockRemoved: a router's index keeps a block"
        " the engine evicted (vLLM #49125).",
        engine="stored_after_removed",
        manager="stored_after_removed",
    ),
    Bug(
        "index-keeps-restarted-engines-blocks",
        "An engine restarts and its event sequence begins again with no replay; the router's index"
        " keeps the blocks the old process cached (llm-d-router #2853, llm-d-kv-cache #593).",
        router_index="llmd_2853_restart_keeps_blocks",
        index_encoding="llmd_2853_restart_keeps_blocks",
    ),
    Bug(
        "index-ignores-all-cleared",
        "The router's index ignores AllBlocksCleared: a reset engine's dropped blocks stay routable (aibrix PR #2385).",
        router_index="aibrix_2385_ignores_all_cleared",
        index_encoding="aibrix_2385_ignores_cleared",
    ),
    Bug(
        "index-folds-foreign-batches",
        "Replay drops the topic frame, so a batch is folded into whichever engine's stream it arrived on"
        " (vLLM #45174).",
        router_index="vllm_45174_folds_foreign_batches",
        index_encoding="vllm_45174_folds_foreign",
    ),
    Bug(
        "index-folds-across-a-gap",
        "The router's index ignores sequence numbers: a batch after a dropped one is folded as if none were"
        " missing (llm-d-kv-cache #593's class).",
        router_index="llmd_kv_cache_593_folds_across_a_gap",
        index_encoding="llmd_593_folds_across_a_gap",
    ),
    # -- KV of more than one kind: windows, recurrent state, drafts ------------------------------------
    Bug(
        "hybrid-free-loses-group-order",
        "The deferred-free path of a hybrid cache lets the groups' pages go in another order: the eviction"
        " order is not the one specified (vLLM #48489).",
        groups="vllm_48489_free_loses_group_order",
    ),
    Bug(
        "hybrid-hit-from-one-group",
        "The hybrid coordinator takes a prefix hit from one full-attention group and hands its pages to a group"
        " that cannot serve the prefix (vLLM PR #50457).",
        groups="vllm_50457_hit_from_the_first_full_group",
        groups_encoding="vllm_50457_another_groups_page_attached",
    ),
    Bug(
        "drafter-left-out-of-the-hit",
        "A prefix hit ignores the drafter's group: the drafter reads KV never written for the restored tokens"
        " (vLLM PR #47926).",
        groups="vllm_47926_drafter_left_out_of_the_hit",
    ),
    Bug(
        "recurrent-snapshot-off-its-boundary",
        "With speculative decoding, a recurrent state is cached after it consumed drafts, under the accepted"
        " tokens' key: a later hit resumes the wrong state (vLLM #53912 / PR #47861).",
        groups="vllm_53912_snapshot_off_its_boundary",
    ),
    Bug(
        "window-page-released-twice",
        "A page leaving a sliding window is let go but stays in the table, and is let go again (SGLang #24153).",
        groups="sglang_24153_window_page_released_twice",
        groups_encoding="sglang_24153_window_page_released_twice",
    ),
    Bug(
        "window-frees-a-cached-page",
        "A page leaving a sliding window is freed though the cache still holds it (SGLang PR #27586).",
        groups="sglang_27586_window_frees_a_cached_page",
        groups_encoding="sglang_27586_window_frees_a_cached_page",
    ),
    Bug(
        "rejected-hit-keeps-its-holds",
        "A longer prefix the first group matched and a later group rejected keeps its holds: nothing rolls"
        " the first group back (SGLang PR #29349 / #29351).",
        groups="sglang_29349_rejected_hit_keeps_its_holds",
    ),
    Bug(
        "state-copy-drops-window-holds",
        "Copying a recurrent snapshot for a hit lets go of the window pages the request attached (SGLang PR"
        " #27038 / #28161).",
        groups="sglang_27038_state_copy_drops_window_holds",
    ),
    Bug(
        "null-page-freed",
        "A freed window table lets go of its null entries: the reserved page 0 is freed (SGLang PR #38269).",
        groups="sglang_38269_null_page_freed",
        groups_encoding="sglang_38269_null_page_freed",
    ),
    Bug(
        "truncation-touches-group-zero",
        "Rejecting drafts truncates only the first group; the others keep the rejected pages (UCM PR #1059).",
        groups="ucm_1059_truncation_touches_group_zero",
    ),
)
