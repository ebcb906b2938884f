//! How the object layer works inside, and why it is sound. Documentation only.
//!
//! # Slots
//!
//! Each object type has one store: an array of up to 26 *segments*, where
//! segment `k` holds `base << k` slots (`base` defaults to 64). A local slot
//! index maps to `(segment, offset)` with one `leading_zeros`. Segments are
//! allocated once, on demand, under a per-store lock, from the store's
//! allocator (see "The store allocator" below), and are never moved or freed
//! while the store lives, so a [`Handle`](crate::Handle) holds a plain
//! pointer to its slot.
//!
//! A segment is cut into *chunks*: 4 MiB, aligned to 4 MiB (more for a type
//! whose slot is larger). Each chunk starts with a 2 KiB prefix holding its
//! header (the store's shared part, the chunk's first local index, the
//! manager id and its owner thread) on one of 32 cache lines chosen by the chunk's address, then
//! its slots. Masking a slot's address finds the header (see
//! `object/layout.rs`, which also gives the measurements behind the sizes).
//! A small segment is allocated at its own size, but at that alignment: the
//! cost is address space the allocator may reserve, not memory touched.
//!
//! A new segment's slots are not written when it is allocated. The store
//! writes vacant headers a batch at a time (about 2 KiB of slots, or the
//! owner's run of 64, whichever is more), under a lock of their own (no
//! user code runs under it, so a store allocator may create objects of the
//! type whose segment it is allocating), just before `len` first covers
//! them; `len`'s `Release` publishes them. So a level
//! load writes each new slot while its lines are still in cache, instead of
//! once at allocation for the whole segment and again in `create` (a loop
//! of 100k creates 6 % faster, `create_many` 25 %; see `BENCHMARKS.md`,
//! O1b). Every reader of a slot it did not take itself (a key, a raw
//! handle, the forensics) checks the index against `len` first, so no one
//! reads a slot that was never handed out.
//!
//! A slot is a 16-byte header followed by `UnsafeCell<MaybeUninit<T>>`:
//!
//! | field | bytes | meaning |
//! |---|---|---|
//! | `word` | 4 | live: the strong count (the owner's reservation included), plus `PURPLE` while a candidate root; dead or free: `LINK_FLAG \| next` |
//! | `generation` | 4 | even = vacant, odd = occupied (the slotmap convention); an occupied slot whose count reached zero also has `DEAD_MARK` (bit 31) |
//! | `reserve` | 4 | the owner thread's reservation of counts, plus `PENDING`, `LEASED` and `USED` (see "Owner-thread counts") |
//! | `site` | 4 | the number of the creation site in the store's site table |
//!
//! The same word is the count while the object is referenced and the list
//! link once it is not: no separate link field, and "is this object dead?"
//! is the same load as "what is its count?". The creation site (the
//! `&'static Location` of the `create` call) is a 4-byte number into a
//! per-store table (`object/creation_sites.rs`: a 64-entry open-addressed
//! table that `create` reads without a lock, then a locked map), so the
//! metadata stays at 16 bytes per object. A 64-byte object takes an 80-byte
//! slot.
//!
//! # Reading through handles
//!
//! A [`Handle`](crate::Handle) is one word, so `Option<Handle<T>>` is 8
//! bytes too (16 with the `handle-sites` feature, which adds the handle's
//! entry in its site table). On 64-bit targets the word is the slot's
//! address shifted left by 16 bits, with the manager id in the 16 bits
//! below it (so a read checks it with one 16-bit compare, and finds the
//! address with one shift), and whether the store counts through an owner
//! thread's reservations and the store's `cyclable` flag in the address's
//! low bits, which are zero (slots are 8-byte aligned); elsewhere it is the
//! address alone, and those come from the chunk header. Everything else
//! comes from the slot's address:
//!
//! - the chunk header, by masking: the store's shared part (dead list,
//!   segment starts) and the manager id;
//! - the local index: the chunk's first local index plus the offset divided
//!   by the slot size (a constant, so a multiply);
//! - the generation: the slot's own, which cannot change while the handle
//!   holds its count, except that shutdown destroys a still-held object in
//!   place and makes it one more (even); `(g - 1) | 1` gives the object's
//!   generation in both cases.
//!
//! A strong read, `mm[&h]`, is the manager-id check (a mask and a compare of
//! the handle's own bits) and the value load: one load after the handle's,
//! as for an `Rc` deref. Clone and drop touch only the slot's count (a drop tests the
//! `cyclable` bit first); the last drop reads the chunk header for the dead
//! list.
//!
//! Why the id rides in the handle: a loop of reads that miss the cache is
//! bound by how many loads the core keeps in flight, and a second load per
//! read, even one that hits the cache (the chunk header's line), took the
//! read from 1.0× to 2.0× an `Rc` deref; see `BENCHMARKS.md`, O3.
//!
//! A [`WeakHandle`](crate::WeakHandle) is 16 bytes: its slot's address (48
//! bits), its key (a 24-bit index and a 32-bit generation) and its manager's
//! id, packed as `WeakHandle`'s docs say. It is only ever made from
//! a real slot, and manager ids are never reused, so once its manager id
//! matches a live manager's, its slot lies in an allocated segment of that
//! manager's store for `T`: a weak read shifts the address out and follows it,
//! with no store lookup, no index arithmetic and no bounds or null checks.
//! The read then compares the slot's generation with the handle's: that
//! one load answers, because whoever takes an object's count to zero (a
//! last drop, a deferred drop's drain, a raw release, the owner's
//! give-back) then stores `DEAD_MARK` into the generation, which no key
//! carries. (Before, the read also loaded the count word and checked it
//! was in `1..LINK_FLAG`; in a loop of cache misses that second load cost
//! 5–15 %, see `BENCHMARKS.md`, O4.) Only a manager with an owner thread
//! still reads the word and the reservation: an object whose count is all
//! the owner's reservation has no handle left but a count above zero. The
//! pointer is never followed before the id check: a weak handle outlives
//! its manager, and then its slot is gone.
//!
//! Why a pointer and not an index: a loop of weak reads over many objects is
//! bound by how many cache misses the core keeps in flight, and every
//! instruction of the loop body takes room from them. Locating slot `local`
//! in doubling segments cut into chunks took a dozen instructions (a
//! `leading_zeros`, a table load, a multiply for the chunk, two
//! multiply-adds), and the read ran at 2.4× `slotmap::get`; see
//! `BENCHMARKS.md`, O4. The cost of both layouts is two limits: 2^16 - 1
//! (65,535) managers per process, and segments below 2^48 (a store
//! refuses one above, with
//! [`Error::StoreOutOfMemory`](crate::Error::StoreOutOfMemory)).
//!
//! # Keys
//!
//! Every store reserves a range of *manager-wide* indices when it allocates a
//! segment, so an [`ObjectKey`](crate::ObjectKey) is unique across types and
//! dense enough for `slotmap::SecondaryMap`. Indices are 24 bits; a
//! [`RawHandle`](crate::object::RawHandle) packs an 8-bit manager tag, the
//! index and the 32-bit generation into one `u64`. New slots start at a
//! per-manager generation below 2^22, so even a raw handle whose tag
//! collides is unlikely to validate in another manager. Generations stay
//! below 2^31 (see "Counters that could wrap" below), which is what
//! `slotmap::SecondaryMap::entry` needs.
//!
//! # The refcount protocol
//!
//! - **Clone**: `fetch_add(1, Relaxed)`. A count past 2^29 panics (after
//!   undoing the add), so the count never reaches the `PURPLE` flag (bit 30)
//!   or the link flag (bit 31), even with one racing clone per thread.
//! - **Drop**: `fetch_sub(1, Release)` (on a manager that defers its drops,
//!   later, by a ring's drain: see "Deferred drops"). The thread that takes the count from
//!   1 to 0 issues an `Acquire` fence (so every other handle's use of the
//!   object happens before its destruction), then records the slot in its
//!   own thread's *ring of last drops*, which carries it to the store's
//!   *dead list* (below). The drop first tests the `cyclable` bit the handle
//!   carries; for types whose objects may hold handles it takes the
//!   candidate path below instead.
//! - **Drop of a type that may hold handles**: a compare-exchange loop that
//!   decrements and, if the count stays above zero and `PURPLE` is clear,
//!   sets `PURPLE` in the same step, after queueing the slot in its store's
//!   candidate buffer (under a lock, once per object between two looks by the
//!   cycle collector). The queueing comes before the decrement because after
//!   it the handle no longer keeps the store alive. Raw releases do the same.
//!   See "Candidate roots" under leak forensics.
//! - **Upgrade** (and `add_ref_raw`): a CAS loop that only increments a count
//!   that is non-zero and not a link, after checking the generation (and
//!   that the object is not `PENDING`). A destroyed object is never revived.
//!   On the owner thread of a manager that has one, see below.
//!
//! # Owner-thread counts
//!
//! A manager built with `owner_thread(true)` has an owner: the building
//! thread, whose token every chunk header carries. The protocol is in
//! `object/owner_counts.rs`; in short:
//!
//! - The owner keeps a *reservation* per object in `reserve`: counts that
//!   are in `word` but held by no handle. A clone on the owner takes one
//!   from it (a plain load and store), or adds a batch of 8 to the word with
//!   one locked add when it is empty; a drop on the owner of an object it
//!   holds a reservation on puts the count back (returning all but 8 past 16).
//!   A drop on the owner of an object it holds no reservation on decrements
//!   the word, as elsewhere. So `count - reservation` handles exist.
//! - A reservation is a *lease*, which the owner's collections renew while
//!   the owner counts on it. The clone that takes one (the batch) queues a *check* of the object in
//!   the owner's ring of last drops; if neither the ring nor the store's
//!   queue has room, it gives the batch back at once. While that check is
//!   queued, `LEASED` is set, and a batch the clones take meanwhile queues
//!   no other (the one check gives the whole reservation back), so the
//!   queue holds at most one check per object between the owner's
//!   collections; freeing a slot clears the bit with the rest of `reserve`. Rings carry checks to
//!   a per-store queue; a check names its slot and its object's generation
//!   (a check that outlives its object decides nothing).
//! - Collection on the owner decides each check. Every clone and `upgrade`
//!   on the owner that takes a count from the reservation sets `USED` (in
//!   the store it makes anyway; drops do not, to keep theirs short). A lease with `USED` whose word holds more
//!   than the reservation (handles are left) is renewed: the collection
//!   clears `USED` (and a `PENDING` an `upgrade` elsewhere raced) and keeps
//!   the check queued (compacted in place: no allocation). Any other lease
//!   ends: the collection gives the whole reservation back to the word with
//!   one `AcqRel` subtract. That subtract is a drop like any other: if it
//!   takes the count to zero, no handle is left anywhere, and the object is
//!   linked onto the dead list and destroyed in the same call. The next
//!   clone on the owner takes a new lease. Only the first round of a
//!   collection ends unused leases; its later rounds (cascades, the batches
//!   of `collect_garbage_for`, `collect_cycles`' second pass) look only for
//!   objects that died meanwhile (they used to end every lease the first
//!   round had just renewed). `release_many` on the owner gives back the
//!   lease of an object whose only handle it releases, and destroys it.
//! - Why renew: an object the owner clones every frame (a render list)
//!   would otherwise pay a locked add, a check and a locked subtract per
//!   frame, 2.8× `Arc`'s clone and drop (`BENCHMARKS.md`, O2c); renewed, it
//!   pays one visit of its check per collection. A collection's checks are
//!   the objects the owner counted on in its last two frames, so its cost
//!   stays in proportion to what happened, not to what lives. An object
//!   still dies at the first owner collection after its last drop, but for
//!   a last drop on another thread that races the collection's load of the
//!   word (which saw a handle): the next owner collection finds the lease
//!   unused (the owner holds no handle to count on) and ends it.
//! - When an owner drop leaves the word holding only the reservation, no
//!   handle is left: the owner sets `PENDING` (dead for `upgrade`, weak reads
//!   and iteration); its lease's check is queued already.
//! - A drop on another thread is one `fetch_sub` on the word, as `Arc`'s
//!   drop: to zero, it is the last drop (the owner holds no reservation
//!   then, as a reservation's counts are in the word). It needs to know
//!   nothing of the reservation, so it touches nothing after its decrement
//!   but for a last drop's record, whose unlisted zero count keeps the slot
//!   held at shutdown.
//! - Other threads cannot read a reservation exactly, so for them an object
//!   is live while its word holds a count and it is not `PENDING`: when the
//!   last handle of an object the owner holds counts on goes on another
//!   thread, weak reads and other threads' `upgrade` may still succeed until
//!   the owner's next collection (an `upgrade` then keeps it alive; and
//!   until the one after, in the race above).
//!   `upgrade` on the owner reads its reservation and fails at once.
//! - A collection on another thread cannot give reservations back (the owner
//!   may be using them): it leaves the checks queued (and logs a warning
//!   once). Shutdown there keeps the memory of stores whose objects the
//!   owner still reserves counts on, as for outliving handles. That is why
//!   the owner is opt-in: a manager that moves to another thread to be
//!   collected must not have one. Shutdown on the owner thread gives back
//!   every reservation (one pass over the slots, as it destroys them), so a
//!   lost check (no room in the store's queue when a ring drained, or
//!   queueing it unwound) delays an object to shutdown, never further.
//! - Stores whose objects may hold handles count every handle in the word
//!   (their drops mark candidate roots with `PURPLE`).
//! - How a handle knows: the owner thread keeps a thread-local *owner key*,
//!   its manager's id with the bit of the handles' "counts through an
//!   owner" tag, and a handle's id and tag bits equal it exactly when the
//!   calling thread counts it through its reservations (one compare, on
//!   every clone and drop). That tag is then the only one set, so the
//!   owner's paths find the slot by subtracting it, a constant folded into
//!   the loads, instead of masking it out. The owner's drop inlines only
//!   its common case (a reservation with room, a handle left); the rest
//!   (no reservation, a full one, the last handle) is one call.
//!
//! Nothing that takes `&ObjectManager` can turn an occupied slot vacant: only
//! collection and shutdown do, and they take `&mut`. So a generation check
//! followed by a CAS on the count cannot race with the slot's reuse.
//!
//! # The dead lists
//!
//! Treiber stacks of local indices, four per store (*lanes*), whose heads
//! share a cache line of their own. Rings of last drops (below) push chains
//! onto them, raw releases push single slots (onto the lane their index
//! picks); only `collect_garbage` (under `&mut`) takes a whole stack, with
//! one `swap` (or a plain load if it is empty). No thread ever pops a single
//! node, so a successful push CAS always links to the true top: there is no
//! ABA problem, and no tag is needed. One lane would do for correctness; four
//! are for collection's speed (below).
//!
//! ## Rings of last drops
//!
//! The drop that takes a count to zero does not push: it records the slot
//! in a ring owned by its thread, with plain stores, and publishes it with a
//! `Release` store of the ring's `recorded` counter. That takes the push's
//! locked instruction on the store's shared line off every last drop (a
//! level unload got 15 % faster; see `BENCHMARKS.md`, O1c).
//!
//! A ring has 256 cells, *entries* (store, first slot's local index and
//! header word, slot size, and the number of the ring's first drop the
//! entry holds), and counts drops and entries apart. A last drop of the slot
//! right after the one its thread recorded last (a level's unload, in index
//! order) does not take an entry: it joins that entry's *run*, with one
//! store of `recorded` and one of `next_word`, the address the next
//! neighbour's header word would have. An address match is enough: chunks
//! begin with a 2 KiB prefix and end after their last slot, so no slot of
//! another chunk, segment or store has its word right after a chunk's last
//! slot. A run's drops are its entry's up to the next entry's first, or up
//! to `recorded` for the last entry, which its thread may still extend; so
//! a drainer takes what `recorded` counts, keeps the last entry, and
//! clears `next_word` (every drain does), so no run outlives the drain that
//! may precede its store's end: after a manager is gone, a slot of another
//! store at that address starts an entry of its own (tested with a store
//! allocator that hands the next manager the same block). A run's entry is
//! written with its first drop's handle pointer, which carries the
//! segment's provenance, so the drain reaches the run's later slots from it.
//!
//! A ring holds at most 255 drops before its thread drains it, however
//! few entries they took, so a run is linked while its slots are still in
//! the thread's caches (leaving a level's 100k to the next collection cost
//! that collection a pass over all their slots). A drain runs under the
//! ring's own lock: it reads the entries, links consecutive slots of one
//! store through their words (which nobody else writes while the count is
//! zero) into one chain per lane, a slot next to the one before it joining
//! that slot's lane (a run's slots in a loop of one store each) and any
//! other slot taking the next lane, pushes each chain with one CAS, and
//! stores `done` and `drained` (`Release`). The thread drains its ring when
//! it is full and when
//! it exits (a thread-local destructor: first take the ring out of the
//! destructor-free thread-local through which every record reaches it, so
//! later drops push their slots themselves; then drain, leave the registry,
//! and free the ring; tested with handles in a worker's thread-local,
//! dropped before and after the ring). Every `collect_garbage` round, `dead_count` (and the
//! counts derived from it, `len` and `report`), and `settle` at shutdown
//! drain every thread's ring through a global registry, so they see every
//! last drop that happened before them: collection, counts and reports are
//! exact as before, cascades end in the same call (a round drains what the
//! previous round's `Drop`s recorded), and shutdown accounts for the slots
//! its own `destroy_all` released. A recorded slot's count is already 0 and
//! its generation marked dead, so `upgrade`, weak reads, iterators and
//! `ref_count` treat it as dead at once.
//! A thread whose ring is gone (its thread-locals are being destroyed) or
//! could not be allocated pushes the slot itself. The protocol is in
//! `object/last_drops.rs`; the loom models `a_full_ring_drains_while_the_owner_collects`
//! (a run that grows while the owner's collection drains it) and
//! `a_run_and_strays_fill_a_ring_while_the_owner_collects` race a thread
//! draining its own ring against the owner's drain.
//!
//! ## Deferred drops
//!
//! A manager built with `deferred_drops(true)` (never with an owner thread:
//! the builder refuses both) records every drop in the ring, not only the
//! last: a *release* entry, written without touching the slot. A drain
//! applies each release entry in ring order with `fetch_sub(1, Release)`,
//! prefetching the count word of the entry 8 places ahead, and
//! one that takes the count to zero takes the `Acquire` fence and is linked
//! as a last drop recorded there would be. A frame's releases at random
//! otherwise pay a locked decrement on a cold line each, and a locked
//! operation that misses holds back the loads after it, so their misses do
//! not overlap; in a batch with the look-ahead they do (a frame got 20–28 %
//! faster, a level unload in slot order up to 3 % slower; `BENCHMARKS.md`,
//! twenty-fourth session).
//!
//! A release entry keeps its count until it is applied, so it keeps its slot
//! and store allocated exactly as the handle did: the drop is the handle's,
//! later. What changes is only when: until the thread's ring drains (full,
//! thread exit, any collection round, `dead_count`, shutdown), `ref_count`
//! includes it and `upgrade` and weak reads find the object alive. Handles
//! know the mode without a load of their chunk: a deferring manager's handles
//! carry the owner flag, and a handle with that flag whose thread does not
//! own its manager reads one bit per manager id from a global table, written
//! by the builder before any store exists (ids are never reused, so the bit
//! never changes while a handle exists). Clones stay one atomic add, and
//! stores of types that may hold handles count every drop at once (their
//! candidate marking needs the drop's own decrement). A ring with no room
//! while its own thread drains it (user code under the drain) applies the
//! decrement at once. The loom models `deferred_drops_race_the_collection`,
//! `a_full_ring_of_deferred_drops_drains_while_collecting` and
//! `upgrade_races_a_deferred_drop_and_its_collection` cover the drains and
//! an `upgrade` racing a deferred last drop.
//!
//! Collection walks the taken chains: for each slot it reads `size()`, marks
//! the slot vacant (generation + 1), keeps it for the owner's creates (see
//! "Slots held for the owner thread"), then drops the value. Each link is a
//! load that depends on the one before, and for slots released at random
//! every one misses the L1 cache: a frame's profile put half of collection's
//! time there. So while two or more lanes have slots left the walk takes one
//! slot of each in turn, and the CPU loads the four lanes' links at once (a
//! frame of 1,000 random releases got 9–16 % faster; `BENCHMARKS.md`, O1);
//! the last lane then runs alone. A lane holds runs of neighbours newest
//! first (a drain links each run backwards, and slots released in index
//! order, which stay on one lane, come back descending), so when the next
//! link is the slot just below, the walk steps to its address instead of
//! computing it from the index it has just loaded: the CPU can load that
//! link before the current one arrives (a level unload got 23 % faster;
//! `BENCHMARKS.md`, O1c). If a `Drop` panics, a guard pushes the rest of
//! each lane back onto it before the panic propagates; the slot being dropped is already free, and
//! its value counts as dropped, as after any panicking drop in Rust.
//! Destroying values drops the handles they hold, which may push more slots:
//! collection goes on with another pass while the one before recorded drops
//! on the collecting thread (`last_drops::noted_here`, which also counts an
//! owner's marks of its last handles), so cascades end in the same call.
//! What other threads release meanwhile waits for the next call: a
//! collection that took another pass for those could go on for as long as
//! they kept releasing. The cost is O(dead + types).
//!
//! # The free list
//!
//! Also threaded through the header words. `create` (under `&self`, from any
//! thread) pops it with a CAS. A [`Loader`](crate::Loader) whose shard is
//! empty (see "Slots held for loader threads") pops it too, with
//! the same CAS, but holding the store's `free_lock` (it looks at the head
//! first, and takes no lock for an empty list: a push it misses is one that
//! came after it). Pushes happen only in
//! collection, under `&mut ObjectManager`: the slots one collection frees are
//! linked into a chain as they are freed and kept for the owner thread (see
//! "Slots held for the owner thread"), and the next collection puts what the
//! owner did not use onto the list in one push, holding `free_lock`. So a pop never runs beside a push:
//! `create` cannot run during a collection (the borrow), and a loader's pop
//! and the collection's push exclude each other (the lock). While nothing is
//! pushed the list only shrinks, its head never returns to an earlier value,
//! and a CAS that read a stale `next` simply fails: no ABA, no version tag.
//! When the list is empty, `create` takes a never-used slot by raising the
//! store's `len` with a compare-exchange, allocating the slot's segment
//! first if it is missing, so `len` only ever covers published segments and
//! a refused segment changes nothing. (It used to raise `len` first and lower
//! it again on a refusal, which could hand a slot out twice when another
//! thread raised it meanwhile and its own segment allocation succeeded.) A
//! value's `Drop` run by the collection may itself create through a loader:
//! the lock is not held while user code runs.
//!
//! # Slots held for the owner thread
//!
//! Raising `len` is an atomic read-modify-write per object, and on a level
//! load it was most of `create`'s cost. So each store has an *owner*: the
//! thread that made the store, then whichever thread last collected (the
//! game's main thread, in the usual loop). The owner raises `len` by a run of
//! up to 64 slots at once, within one published segment, and keeps the run in
//! the store (`owner_slots.rs`); its next creates take slots from the run with
//! plain loads and stores, after comparing a thread token (a per-thread
//! number that is never reused). The run also keeps a cursor: the next
//! slot's address and how many slots lie contiguously after it in its chunk,
//! so a create steps to the next slot instead of mapping its index to an
//! address; the cursor is the run's, used up whenever the run is (so a
//! refill finds it empty) and reset when the run is handed over. Other threads, loaders, and the owner while
//! an iterator is alive (iteration never yields an object made after it
//! began) take slots from `len` as above. The owner never allocates a
//! segment while refilling (that runs the allocator, user code): when the
//! next slot's segment is missing, it takes one slot the ordinary way.
//!
//! The run's slots lie below `len` but are neither objects nor on any list,
//! so every count derived from `len` subtracts the run's length (kept in an
//! atomic for readers on other threads). A collection on a thread that is not
//! the owner puts what is left of the run on the free list and makes its
//! thread the owner; shutdown puts it on the free list too, so its slots are
//! accounted for and the segments are freed. Both hold `&mut ObjectManager`,
//! so no owner's `create` runs meanwhile, and the run's cell is only ever
//! touched by one thread at a time (loom checks it: `tests/loom.rs`,
//! `the_owners_run_races_another_creator`).
//!
//! Reused slots follow the same rule. Popping the shared free list is a
//! compare-exchange per `create`; a frame's profile put 43 % of `create`
//! there. So the slots a collection (or `release_many`) frees are *kept* for
//! the owner, in a chain linked through their words like the free list's,
//! and the owner's creates pop them first, with plain loads and stores; then
//! the free list; then the run. Each `collect_garbage` call begins by putting
//! the slots the last one kept and the owner did not use on the free list
//! (one push under `free_lock`), so another thread's `create` waits at most
//! one collection for them, and a store whose objects are made on other
//! threads stops growing after two frames (`tests/object_threads.rs`). The
//! kept slots are counted with the run's (every count stays exact), handed
//! over with it when another thread collects, and put on the free list by
//! shutdown. Loom: `the_owners_kept_slots_race_another_creator`.
//!
//! # Slots held for loader threads
//!
//! A loader's pop of the free list reads the popped slot's link, a miss (the
//! collecting thread wrote it last), while it holds `free_lock`: two loader
//! threads replacing their objects all the time spent half their time there,
//! waiting for each other (`BENCHMARKS.md`, O8). So a store also holds freed
//! slots for loader threads (`loader_slots.rs`): eight shards, each a chain
//! under a lock of its own on a line of its own, chosen by the calling
//! thread's token (threads made one after another take different ones). A
//! loader's create counts itself in its shard (its *demand*) and pops the
//! shard's chain; only when that is empty does it go to the free list, then
//! to `len`.
//!
//! Collection fills the shards. Each `collect_garbage` call begins by making
//! twice each shard's demand since the last call its *target* (at most
//! 65,536), and by putting the chains of shards whose threads made nothing
//! meanwhile on the free list (so an idle loader holds slots for one frame
//! at most). The slots the collection then frees go to the shards until each
//! holds its target (every shard half of its target first, so the first does
//! not take what the next needs), each slot's place decided as it is freed,
//! so no chain is walked to split it; the rest are kept for the owner as
//! above. A loader thread that
//! replaces its objects every frame thus creates them in the slots the last
//! collection freed (`tests/object_loader.rs`). A collection writes a
//! shard's chain under the shard's lock, and a loader pops it under the
//! same lock, so the two never interleave; the held slots are vacant and on
//! no other list, counted (a length per shard, stored under its lock) like
//! the owner's, and put on the free list by shutdown. Loom:
//! `a_loader_threads_shard_races_the_collections_that_fill_it`.
//!
//! A type with a [capacity](crate::ObjectManagerBuilder::max_objects_per_type)
//! holds none of these: its collections push what they free straight onto the free
//! list, and its owner and loaders take slots as every thread does. Slots held for one
//! thread would be refused to the others while fewer objects than the limit
//! exist (a loader was refused at 2 objects of 64).
//!
//! # Many objects at once
//!
//! [`create_many`](crate::ObjectManager::create_many) (a level load) finds
//! the store and numbers the creation site once (the handles' tag, the
//! manager id and counting flags that every chunk header of a store repeats,
//! is kept in the store for every `create`), and then, per object, pops a free slot or takes the
//! next never-used one from a run it raised `len` by, sized by the
//! iterator's `size_hint` (at most 4,096 slots, within one published
//! segment), stepping through each chunk's contiguous slots instead of
//! mapping every index to an address. With a tracker, or while an iterator
//! of the store is alive, each object takes `create`'s own path instead.
//!
//! `size_hint` comes from a safe trait, so nothing depends on it being true:
//! the slots of a run that the iterator does not fill (it yielded less than
//! it promised, or panicked) are given back when the batch ends, by a guard
//! that also runs during an unwind. On the store's owner thread with an empty
//! run of fresh slots, they become that run; elsewhere they go onto the
//! store's stack of returned slots (linked through their words, pushed with
//! a compare-exchange, counted in `returned`), which the next collection,
//! under `&mut ObjectManager`, puts on the free list: only collection pushes
//! there, which the free list's lock-free pops rely on. A batch through the
//! manager never runs during a collection; a loader's may (its iterator may
//! even run inside one), so its push onto the returned stack can race the
//! collection's swap of the whole stack, which a compare-exchange push
//! tolerates as it is. So no capacity is lost (they used to be retired for
//! good), and every count derived from `len` stays exact. While a batch holds
//! a run, a report taken on another thread counts its unfilled slots as
//! objects (at most 4,096).
//! Loom: `tests/loom.rs`, `a_batch_races_the_owners_create` and
//! `a_loader_batch_races_a_collection`.
//!
//! [`Loader::create_many`](crate::Loader::create_many) runs the same batch
//! for a loader thread, with a loader's rules: freed slots popped from its
//! shard or under `free_lock`, never the collecting thread's own slots (the
//! batch may run inside its collection), and the open state held for the
//! whole batch.
//!
//! [`release_many`](crate::ObjectManager::release_many) (an unload) is the
//! other direction, under `&mut ObjectManager`. A handle whose slot's count
//! word reads exactly one (with `Acquire`: no flag, and no owner's
//! reservation, which is part of the count) is its object's only reference,
//! and while the manager is borrowed mutably nothing can make another: a new
//! strong handle comes only from an existing one, or through the manager
//! (`upgrade`, raw handles, views), and loaders only create. So the release
//! forgets the handle, marks the word dead (no count) with a plain store and
//! destroys the object at once, through the same per-object step as
//! collection (`Store::destroy_dead`: `size()`, the destroy hook, the event,
//! the slot freed, the value dropped, the tracker credited), while the slot
//! is still in cache; the freed slots go onto the free list in one chain at
//! the end, or during the unwind if a `Drop` panics. Every other handle (a
//! larger count, another manager's, a store of a type that may hold handles,
//! whose drops keep the cycle collector's candidates) drops the ordinary way,
//! and collection destroys its object. Loom: `a_release_races_a_workers_drop` (a worker
//! drops the other handle meanwhile).
//!
//! # Who owns what: the registry, collection and loaders
//!
//! The manager holds its type table and stores in an `Arc`'d registry, and
//! every loader holds another `Arc` to it. Nothing ever takes `&mut Store`:
//! a loader on another thread may be using the store at any moment, and a
//! `&mut` to it would be undefined behaviour even if every field touched were
//! atomic. The store methods that need exclusive access (collection,
//! `destroy_all`, `settle`, an untyped `&mut` to a value) take `&self` and are
//! `unsafe`, with "the caller holds `&mut ObjectManager`" as their contract.
//!
//! So the thread that holds `&mut ObjectManager` owns collection: it alone
//! destroys objects and pushes free slots. Every other thread, loaders
//! included, only takes slots (pops, or bumps the counter under the segment
//! lock), and any thread may record a last drop (and drain a ring onto the
//! dead lists).
//! A loader writes only the vacant slot it took, and publishes it with the
//! `Release` store of the odd generation, exactly as `create` does, so the
//! object is visible as soon as `create` returns. Values of occupied slots
//! are written only through `&mut ObjectManager` (or a view standing for it:
//! [`ObjectViewMut`](crate::ObjectViewMut), or a type taken for writing from
//! [`Views`](crate::Views), whose flags never reset while the views live).
//!
//! Shutdown closes the registry first. A loader's create is inside the
//! manager's open gate (`object/open_gate.rs`) throughout: it counts itself
//! on one of 16 counters, each on a line of its own, then reads a `closed`
//! flag, with a `SeqCst` fence between. Shutdown stores the flag, fences,
//! and waits for every counter to read zero. So no loader is inside a store
//! while shutdown tears it down, and later creates return
//! [`Error::ManagerShutDown`](crate::Error::ManagerShutDown). Each thread
//! lists the gates it is inside (entries in the frames of the calls that
//! entered, no allocation): a create nested in one that is inside gets in
//! even after the flag is set (shutdown waits for the outer one anyway), and
//! a shutdown reached from user code inside a create of its own manager's
//! loader, on the same thread, which would wait for itself, panics instead,
//! after leaking the registry's `Arc` so that the manager stays as
//! `mem::forget` leaves it. Loom models (`tests/loom.rs`) cover a loader
//! popping while the owner collects, a loader racing shutdown, and a loader
//! create nested in a batch racing shutdown. Under loom, `src/sync.rs` swaps in loom's atomics,
//! locks and `UnsafeCell` (slot values are only reached through
//! `Slot::value_ref`, `value_mut`, `write_value` and `drop_value`), so the
//! models check every write and read of a value against the atomics that
//! order them, not only the atomics.
//!
//! # Iteration
//!
//! [`Iter`](crate::Iter) and [`IterMut`](crate::IterMut) walk a store a
//! segment at a time, up to the slots used when they began, computing keys
//! from the segment's first index. While any iterator of a store is alive
//! (a counter in the store), `create` and loaders take never-used slots
//! instead of free ones, so an object created after the iterator began lies
//! past its end and is never yielded. The counter is reset by collection,
//! where the borrow proves no iterator is alive, so a forgotten iterator only
//! costs fresh slots until the next collection.
//!
//! # Raw handles
//!
//! Each store keeps a small table of raw references per slot, behind a lock
//! (raw calls are the slow path). `release_raw` and `handle_from_raw` only
//! give back a reference the table says a raw handle holds. A script that
//! releases twice gets [`Error::DoubleRelease`](crate::Error::DoubleRelease),
//! and the count can never drop below the number of live `Handle`s, which is
//! what keeps `Handle` access sound without a generation check.
//!
//! # Shutdown, and handles that outlive the manager
//!
//! Shutdown collects the dead, logs what is still alive, drops every value in
//! key order (which breaks cycles), and then decides whether the segment
//! memory can be freed. It marks every slot it can account for: those on the
//! free list, and those it takes off the dead list now. Any other slot is
//! still referenced from outside the manager, or its last handle is being
//! dropped on another thread at this very moment (its count is zero but it
//! is not listed yet: every ring was drained just before, so only a drop
//! racing shutdown is in this state). The same goes, on another thread than
//! a manager's owner, for an object whose count may be all the owner's
//! reservation (on the owner, shutdown first gives back every reservation,
//! including those of objects it destroyed in place, whose last handles
//! other objects' `Drop`s let go of). In each case a handle may still touch the slot's
//! header and the store's shared part, so that store's memory is leaked on
//! purpose, and the report says how many bytes. Otherwise everything is freed.
//!
//! Shutdown runs user code before it settles: `Drop`s (caught), the logger
//! that takes the leak report, the store's allocator. So the first thing it
//! does, before any of it, is mark every store to keep its memory; `settle`
//! clears the mark only once it finds no handle left. A logger that panics
//! mid-report unwinds out of `shutdown` (and the manager's drop does not
//! start over), and the stores' memory is then leaked, never freed under the
//! handles still alive (`tests/soundness_shutdown_hooks.rs`).
//!
//! # Soundness
//!
//! The contract: no safe code, however adversarial, reaches undefined
//! behaviour through this crate. Bad input gets an `Err` from the `try_`
//! call or a panic with a clear message. `tests/soundness/` (with
//! `tests/soundness_leaks.rs`, `tests/soundness_manager_ids.rs` and the
//! compile-fail cases in `tests/ui/soundness/`) tries to break it, and every
//! new public type gets its cases there. The allocators' side of the contract
//! is in [`crate::alloc`]'s "Soundness" section.
//!
//! ## Variance and auto traits, per public type
//!
//! | type | variance in `T` | `Send`/`Sync` | why |
//! |---|---|---|---|
//! | [`Handle<T>`](crate::Handle) | invariant (`PhantomData<fn(T) -> T>`) | always both | `get_mut` writes a `T` into the slot, so a handle coerced to a supertype (`Callback<for<'a> fn(&'a str)>` to `Callback<fn(&'static str)>`) could store a value the slot's real type forbids. A handle touches only atomics (its count, the dead list); it never reads, writes or drops a `T` itself, and `T: MMObject` is `Send + Sync` anyway. |
//! | [`WeakHandle<T>`](crate::WeakHandle) | invariant | always both | A coerced weak handle would name a slot of another type's store, and every weak read follows its slot pointer once the manager id matched. It holds an address and numbers, and never follows the address on its own, so it is `Send + Sync` for every `T` (as before it held a pointer). |
//! | [`ObjectView<'m, T>`](crate::ObjectView), [`Iter<'m, T>`](crate::object::Iter) | invariant (they borrow the `T` store, whose atomics make it invariant); covariant in `'m` | as `&ObjectManager` | Shared borrows of the manager. |
//! | [`ObjectViewMut<'m, T>`](crate::ObjectViewMut), [`IterMut<'m, T>`](crate::IterMut) | invariant (`PhantomData<&'m mut T>`, as `&mut T` is) | as `&mut T` (both, since `T: Send + Sync`) | They hand out `&mut T`; one coerced to a supertype could write a value the slot's real type forbids. |
//! | [`Views<'m>`](crate::Views) | (not generic) | `Send`, not `Sync` | Its borrow flags are `Cell`s: only one thread may hand out views from it. |
//! | [`Loader`](crate::Loader) | (not generic) | both | An `Arc` of the registry; every store it touches is `Sync`, and a create is inside the registry's open gate (`object/open_gate.rs`). |
//! | [`Destroyed`](crate::Destroyed) | (not generic) | both | A key, a name and a `TypeId`. |
//! | [`TryCreateError<T>`](crate::object::TryCreateError) | covariant | as `T` | It only owns the refused value. |
//! | [`ObjectManager`](crate::ObjectManager) | (not generic) | both | Every stored type is `Send + Sync` (a bound of [`MMObject`](crate::MMObject)): the manager hands `&T` to any thread holding `&ObjectManager` and drops values on the thread that collects. A `!Send` or `!Sync` type is refused at compile time. |
//! | [`ObjectKey`](crate::ObjectKey), [`RawHandle`](crate::object::RawHandle) | (not generic) | both | Plain numbers, checked on every use. |
//!
//! The compile-fail cases `object_*_variance` and `object_not_send` pin these.
//!
//! ## Safe traits the unsafe code does not trust
//!
//! - [`MMObject`](crate::MMObject) and [`VisitHandles`](crate::VisitHandles)
//!   are safe to implement, so their results are only ever *reports*.
//!   `size()` may lie or panic: byte totals saturate, a panic during
//!   collection still frees the slot (see "The dead list" above), and a panic
//!   while writing a leak report counts the object as 0 bytes.
//!   `visit_handles` may name keys the object does not hold, garbage keys,
//!   or keys of another manager: forensics then answers wrongly, but
//!   `collect_cycles` never drops a value, only calls `release_handles`
//!   (see "Trust" below). `TYPE_NAME` and `TAG` are only printed.
//! - `Hash`, `Eq` and `Ord` of keys and handles are this crate's own.
//!
//! ## Counters that could wrap
//!
//! | counter | bound | at the bound |
//! |---|---|---|
//! | strong count | 2^29 | `clone` panics after undoing its add (the owner's batch of 8 as well); `upgrade`, `try_upgrade` and `add_ref_raw` refuse (`RefCountOverflow`), changing nothing |
//! | owner reservation | 16 counts | a drop that would pass it gives all but 8 back to the word |
//! | deferred drops waiting | 256 per thread (a ring) | the drop that finds the ring full applies it first; so the counts the rings hold never approach the strong count's bound |
//! | creation-site numbers | 64 without a lock, then a locked map in the store's allocator | a site the allocator refuses room for shows as an "unknown" line in `object/store.rs` |
//! | slot generation | below 2^31 | the slot is *retired*: it keeps the even generation 2^31, which no key carries, and is never reused. A stale key can therefore never validate again, and keys stay below slotmap's `SecondaryMap` version limit |
//! | manager id | 2^16 - 1 (65,535) managers per process (handles carry the id in their low 16 bits, checked with one 16-bit compare) | `build` panics, and keeps panicking: ids are never reused, so a handle of a dropped manager never passes another manager's check |
//! | manager-wide index | 2^24 slots | `try_create` returns `CapacityExceeded` |
//! | handle-site ids (`handle-sites`) | wrap at 2^32 | ids still in use are skipped |
//!
//! Hidden test hooks start these counters near their bounds
//! (`first_generation_for_tests`, `skip_manager_ids_for_tests`,
//! `leak_refs_for_tests`). Each can only move a counter towards its bound,
//! never back, so none of them can make a stale key or an old manager id
//! valid again.
//!
//! ## Memory refused
//!
//! A refusal by the store's allocator (or a segment layout too large for
//! the address space) becomes
//! [`Error::StoreOutOfMemory`](crate::Error::StoreOutOfMemory): `try_create`
//! hands the value back, `try_reserve` and `add_ref_raw` return the error,
//! and `create`, `reserve` and `into_raw` panic with its message. The side
//! tables reserve room *before* anything changes (`try_reserve` on the
//! raw-reference map and the index ranges), so the insert that follows
//! cannot fail, and nothing aborts. Slots are initialised header by header
//! (see "Slots"), so no `T`-sized temporary is built.
//!
//! ## The store allocator
//!
//! [`ObjectManagerBuilder::allocator`](crate::object::ObjectManagerBuilder::allocator)
//! takes an implementation of an `unsafe` trait (`allocator_api2`'s
//! `Allocator`), so its blocks are trusted to be valid, aligned and
//! unaliased, as that contract says. The store keeps it in an `Arc` shared by
//! the segments and the side tables, so whatever was taken from it goes back
//! to the very same allocator. When handles outlive the manager, the store
//! leaks its memory on purpose and keeps one reference to the allocator
//! forever, so an allocator that owns its memory can never free it under
//! those handles.
//!
//! ## `mem::forget`
//!
//! Forgetting a `Handle` is a leak, never UB: its count never reaches zero,
//! so the object stays alive, is reported at shutdown, and its store's
//! memory is leaked on purpose (as for any handle that outlives the
//! manager). Views, iterators and snapshots are plain borrows or values.
//!
//! ## The tracker's types
//!
//! | type | variance | `Send`/`Sync` | why |
//! |---|---|---|---|
//! | [`TrackingAllocator<A>`](crate::track::TrackingAllocator) | covariant in `A` | when `A` is | It owns `A` like a plain field and never writes an `A` through `&self`. |
//! | [`Tracker`](crate::track::Tracker) | (not generic) | both | All of its state is atomic or behind its own locks; its tables come from `System`. |
//! | [`TagGuard`](crate::track::TagGuard) | (not generic) | neither | It restores a thread-local of the thread that made it. Forgetting it, or dropping guards out of order, only misattributes bytes: the tag is plain data. |
//!
//! `GlobalAlloc` is an `unsafe` trait, so the tracker trusts the inner
//! allocator's blocks. A double free or an untracked free through the explicit
//! API is reported, never followed; a runtime switch of mode or diagnostics
//! never makes a legitimate free look like a double free (a counter of
//! switches dates every remembered free). `tests/soundness/track.rs` holds
//! the cases.
//!
//! ## Raw handles and shutdown
//!
//! Shutdown frees a store that raw references alone hold, because a raw
//! handle needs the manager to be used. The last touch of the store's shared
//! part by `Handle::into_raw` is therefore its raw-count update, under the
//! raw table's lock: with `handle-sites`, the handle's site is removed
//! *before* that update, since once the raw count equals the slot's count a
//! concurrent shutdown may free the shared part.
//!
//! Off the owner thread, a count equal to the raw count is read from the
//! word alone (one `Acquire` load; the owner's reservation counts as held),
//! since a look at the word and one at the reservation can straddle an
//! owner's clone or drop (see `SlotHeader::held_only_by_raw`).
//!
//! # The tracker's configuration key
//!
//! `TrackingAllocator` counts an allocation from a per-thread copy of what the tracker's
//! configuration says about the current tag (its counters, whether it is watched or under
//! a budget, the sampled mode's size limit), so the common allocation reads no shared
//! configuration at all: it compares the copy's key with the tracker's *fast key*
//! (`track/config_key.rs`), one relaxed load.
//!
//! - **A change** (a mode switch, a watch, a budget), under one process-wide lock: the
//!   key is taken away (`KEY_NONE`), the configuration stored with `Release`, then a fresh
//!   key published with `Release` (none in diagnostic mode). Keys come from one counter
//!   for all trackers, so no two configurations ever share one.
//! - **A copy** loads the key with `Acquire`, then the configuration and the tag's flags:
//!   the ones published with the key, or newer, whose change took the key away first.
//! - **Why a change is never missed.** A change that happens before an allocation (say a
//!   budget set on one thread, which then frees memory that another thread's `malloc`
//!   gets) comes after the key's removal in the key's history, so the allocation's check
//!   reads `KEY_NONE` or a newer key, never the copy's.
//! - **The first copy** of a tracker no change has touched gives it its first key with a
//!   compare-exchange; a change racing it replaces that key after. The change writes the
//!   key with swaps, so every write of the key is a read-modify-write.
//!
//! Loom models: `config_key::*` in `tests/loom.rs` (a change seen by one thread before it
//! hands memory to another, a first copy racing the first change, a configuration without
//! a counting path).
//!
//! # The stack walk's rule cache
//!
//! Without frame pointers, a tracked allocation's stack (`Mode::Stacks`) is walked by the
//! unwind tables (`track/stack_walk/unwind_tables.rs`): for each frame, the rule in
//! `.eh_frame` that says where its caller's frame starts (the CFA, `rsp` or `rbp` plus an
//! offset), that the return address sits just below it, and where the caller's `rbp` was
//! saved. Finding that rule takes a search of the loaded objects, a binary search of
//! `.eh_frame_hdr` and a run of the CFI program (`gimli`): about a microsecond. So each
//! rule is cached under its return address, packed in one word, in a fixed table of 16,384
//! entries (`track/stack_walk/rule_cache.rs`), and a capture through known call sites
//! costs a hash, a probe and two or three stack loads per frame.
//!
//! - **Readers take no lock.** A capture reads the cache's epoch once, makes its lookups,
//!   and checks the epoch again at the end (the seqlock pattern, with every field atomic). An
//!   insert writes the rule, then publishes the address with `Release`, under the cache's
//!   lock; an entry never changes until the cache is cleared.
//! - **Clears.** A rule is right while the code at its address is the same. Code changes
//!   only when a library is unloaded, so each capture first reads the loader's count of
//!   unloads (`dl_iterate_phdr`'s `dlpi_subs`); when it moved, the cache is emptied under
//!   the lock, the epoch going odd, then even. A capture that spans a clear is thrown away
//!   and made by the unwinder, and an insert computed before a clear is refused.
//! - **Reads stay in the stack.** Every stack word the walk reads lies between its own
//!   stack pointer and the top of the thread's stack mapping, and each caller's frame must
//!   lie above its callee's, so even a wrong rule could only end the walk.
//! - **What it leaves to the unwinder.** A rule of another shape (a DWARF expression, a
//!   register saved in another register), a frame without unwind information, a signal
//!   frame: the capture is made by `backtrace` instead, whole.
//! - **Chosen only when it agrees.** On first use a probe walks its own stack both ways, and
//!   the cached walk is used only if it listed every frame the unwinder did.
//!
//! Loom models: `rule_cache::*` in `tests/loom.rs` (a lookup racing a clear and a new
//! insert; an insert racing a clear).
//!
//! # Leak forensics
//!
//! ## The handle graph
//!
//! Every live object is a node. Every key its
//! [`visit_handles_named`](crate::MMObject::visit_handles_named) yields (the
//! derive's names the field; the default forwards `visit_handles`) that names
//! another live object of the manager is an edge, counted with multiplicity. An
//! object whose strong count is larger than its number of in-manager edges is
//! *held from outside*: by a `Handle` in a local variable or a system, by a raw
//! handle, or by a dead object that has not been collected yet. These objects
//! are the roots. Every object reachable from a root is in use; the rest are
//! kept alive only by each other, which means they hang in, or off, a
//! reference cycle (the trial deletion of Bacon and Rajan, done in one pass).
//!
//! ## Cost
//!
//! The whole-graph calls (`holders`, `retention_path`, `find_cycles`,
//! `collect_cycles`, the leak report) read nothing that drops record: each
//! call builds the graph from scratch: one
//! `visit_handles` call per live object, then a few linear passes (a
//! breadth-first search from the roots and Tarjan's strongly connected
//! components over what it did not reach). That is O(live + edges) time and
//! about 75 bytes per live object (some 30 more while writing a leak report)
//! plus 44 per edge (the edge, and the name of the field it comes from) of
//! temporary memory. Leak reports build only the links of each retention
//! path that they print, so they stay linear too: shutdown with a leaked
//! linked list of 100,000 objects, each with its path, takes 55 ms. `holders` visits every
//! object too, but builds no graph.
//! Run these at a level unload or a debug key press, not every frame.
//! Measured in release on a two-core VM (ranges over a few runs, the high
//! end with a build running alongside): `find_cycles` over 100,000 live
//! objects in a tree held from one root takes 3–9 ms; over 1,000 garbage
//! rings of 100 objects, 13–18 ms, and `collect_cycles` frees them in
//! 22–25 ms; over one ring of 100,000, 19–22 ms (`retention_path` 15–18 ms).
//! `holders` and `snapshot` take 0.4–0.6 ms for 100,000 objects. These
//! whole-graph calls track nothing between calls; the per-frame
//! [`CycleCollector`](crate::CycleCollector) does (next section).
//!
//! ## Candidate roots
//!
//! A garbage cycle is made by a decrement that leaves a count above zero:
//! the cycle's last outside handle goes, its inside references remain
//! (Bacon and Rajan, 2001). So drops record those objects, and the
//! `CycleCollector` reads only them and what they reach, never the other
//! live objects:
//!
//! - **Which types.** `MMObject::may_hold_handles()`, read once when a type's
//!   store is made and copied into every chunk header. The derive answers it
//!   from the fields' types (`VisitHandles::MAY_HOLD_HANDLES`: false for
//!   numbers, strings, weak handles, and containers of those). Other types'
//!   drops stay one `fetch_sub`; a wrong `false` only hides cycles from the
//!   `CycleCollector`, not from `collect_cycles`.
//! - **Marking.** Such a drop that leaves references behind sets `PURPLE`
//!   in the count word, in the compare-exchange that decrements, and queues
//!   the slot's local index in the store's candidate buffer first, unless
//!   `PURPLE` was already set. So each object is queued once between two
//!   looks, and the flag and the decrement are one atomic step.
//! - **Taking.** The collector pops an index, clears `PURPLE` with a
//!   compare-exchange (never a `fetch_and`: the word may have become a
//!   dead-list link), and reads the group the object reaches. A drop before
//!   the clear is in the counts it reads; a drop after it finds the flag clear
//!   and queues the object again. An index whose slot is not purple (taken
//!   already, or its object died) is skipped. The loom model
//!   `candidate_drop_races_the_cycle_collector` checks this race; it fails
//!   if a drop that sees the flag set decrements without the
//!   compare-exchange.
//! - **Bounded.** Nothing else clears the flag, and only deaths make entries
//!   stale, so a collection that finds dead objects in a store compacts its
//!   buffer (keeping the purple slots, once each) when it has doubled since
//!   its last compaction, at 1,024 entries at least: amortised O(1) per
//!   entry, and at most twice the purple objects.
//! - **Lost entries.** If the store's allocator refuses room, the flag stays
//!   clear and the buffer remembers the loss; the collector then walks every
//!   live object of that store once, as candidates.
//!
//! Cost, measured: a clone + drop of a type that may hold handles takes
//! 6.8–7.4 ns against 5.3–5.6 ns for one that cannot (`O2_clone_drop`),
//! whose drop gained 8 instructions (the chunk header's byte, no atomic); a
//! 1 ms step frees the 990 nodes of 495 garbage cycles among 100,000 live
//! objects in 0.46 ms, against 9.5 ms for `collect_cycles` (`F2_cycles_100k`).
//!
//! ## Trust
//!
//! `visit_handles` is user code. A derived one is exact for the handles it can
//! see; fields whose type hides handles (a generic `T`, a type without a
//! [`VisitHandles`](crate::VisitHandles) impl) are not reported, which only
//! makes objects look held from outside: forensics then finds fewer cycles,
//! never false ones. A hand-written one that reports handles the object does
//! not hold can make a used object look like garbage. `collect_cycles` still
//! never drops a value: it only asks cycle members to
//! [release their handles](crate::MMObject::release_handles), so such an
//! object stays alive, though with its removable handle fields emptied.
//! Keys carry no manager id, so a handle into *another* manager whose key
//! happens to match a live object here would count as an edge too: keep
//! cross-manager handles out of `visit_handles`, or expect such objects to
//! look less referenced from outside than they are.
//!
//! ## Threads
//!
//! `holders`, `retention_path` and `find_cycles` take `&self`, so other
//! threads may clone and drop handles while the graph is read: the answer is
//! then a snapshot that may mix moments. `collect_cycles` takes `&mut self`.
//! Then no thread can create a reference to an object from nothing (`upgrade`
//! and the raw calls need the manager); one can only clone a handle it already
//! holds, which was counted as an outside reference, so an object seen as
//! held only by its cycle stays so while its handles are released.
//!
//! # Handle sites (feature `handle-sites`)
//!
//! With the feature on, a `Handle` grows a 4-byte id (32 bytes in all) into
//! its store's table of live handles (a `HashMap` behind a lock in the
//! store's shared part). `create`, `clone`, `upgrade` and `handle_from_raw`
//! are `#[track_caller]` and register their caller's `Location`; `drop` and
//! `into_raw` remove the entry. `Location` is cheaper than raw return
//! addresses and needs no symbol lookup. The table lives in the store's
//! shared part, so a handle that outlives its manager still unregisters
//! safely. Measured cost: clone + drop 49.7 ns against 9.5 ns without it.
