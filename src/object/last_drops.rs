//! The last drops each thread made, on their way to their stores' dead lists.
//!
//! A handle drop that takes a count to zero used to push the slot onto its
//! store's dead list at once: a compare-exchange on the store's shared line
//! right after the count's own read-modify-write, for every object released.
//! Instead, the dropping thread records the slot in a ring of its own, with
//! plain stores. Dropping a level's 100k handles and collecting them got 15 %
//! faster; a frame's 1,000 random releases are bound by each slot's cache
//! miss, and the change there is inside this machine's noise (see
//! `BENCHMARKS.md`, O1 and O1c).
//!
//! A last drop of the slot right after the one its thread recorded last (a
//! level's unload, in index order) joins that record's *run* instead of
//! taking an entry of its own: one compare and two stores (see
//! [`LastDrops`]). Dropping 100k handles in index order got about 30 %
//! faster, and a frame's releases at random 5–9 % slower, their entries
//! being larger (`BENCHMARKS.md`, twenty-seventh session).
//!
//! A ring is *drained* (its slots linked into chains, one compare-exchange
//! per dead lane that a run of slots of one store reaches, see [`Lanes`])
//! when it fills (255 drops, however few entries), when its thread exits,
//! and by every call that reads a dead list: `collect_garbage` (every
//! round, so cascades still finish in one call), `dead_count` and the
//! counts derived from it, and shutdown.
//! Those calls drain every thread's ring, so they see every drop that
//! happened before them, as before.
//!
//! A manager that defers its drops records every drop here, not only the
//! last, and the drain applies the decrements (see `deferred_drops.rs`).
//!
//! Nothing else changes meaning: a recorded slot's count is already 0, so it
//! is dead for every reader (`upgrade`, weak reads, iterators, `ref_count`)
//! and only its place on the dead list waits. The store's shared part
//! outlives the entry: shutdown drains first, and an entry recorded after
//! that leaves its slot neither free nor listed, so the store counts it as
//! outliving and keeps its memory (`Store::settle`).

use std::cell::Cell;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crate::sync::{fence, AtomicU32, AtomicUsize, Ordering, UnsafeCell};

use super::owner_counts::Check;
use super::reentry::NamedMutex;
use super::shared::{StoreShared, DEAD_LANES};
use super::slot::{SlotHeader, LINK_FLAG, NIL};

/// A ring's cells. It holds up to one drop fewer (see [`LastDrops`]) before
/// its thread drains it (small under loom, so the models reach a full ring).
#[cfg(not(loom))]
pub(crate) const CAPACITY: usize = 256;
#[cfg(loom)]
pub(crate) const CAPACITY: usize = 3;

/// One entry of a ring: its store's shared part, the first slot's header
/// word, the number of the ring's first drop it holds (see [`LastDrops`]),
/// and what was recorded: drops that found a count of 0 (a run of
/// neighbouring slots from `local`, `stride` bytes apart), a drop whose
/// decrement the drain applies (see `deferred_drops.rs`), or the check of
/// a lease the owner thread took, for its collection to decide (see
/// `owner_counts.rs`). Only a dead run holds more than one drop.
#[derive(Clone, Copy)]
struct Entry {
    shared: NonNull<StoreShared>,
    /// The slot's header word. For a dead run and a release, with the
    /// whole segment's provenance (a handle's): the drain reaches a run's
    /// later slots from it, and a release's whole header.
    word: NonNull<AtomicU32>,
    start: usize,
    found: Found,
}

impl Entry {
    /// An entry to record; its `start` is set as it is written.
    fn new(shared: &StoreShared, word: NonNull<AtomicU32>, found: Found) -> Self {
        Entry { shared: NonNull::from(shared), word, start: 0, found }
    }
}

/// What was recorded.
#[derive(Clone, Copy)]
enum Found {
    Dead { local: u32, stride: usize },
    Release(u32),
    Check(Check),
}

/// One thread's ring of last drops.
///
/// A ring counts *drops* (`recorded`, `drained`) and *entries* (`written`,
/// `done`) apart: a last drop of the slot right after the one its thread
/// recorded last (a level's unload, in index order) joins that entry's run
/// instead of taking an entry, with two stores: `next_word` (which says
/// which slot that is) and `recorded`. A run's drops are the entry's
/// `start` up to the next entry's `start`, or up to `recorded` for the last
/// entry, which its thread may still extend; a drain that empties it keeps
/// it (`done` stays at it).
///
/// # Invariants
///
/// - `written` and `recorded` are stored only by the owning thread: a new
///   entry's cell first, then `written` (`Release`), then `recorded`
///   (`Release`), which also publishes every drop added to a run. `done`
///   and `drained` are stored only under `draining`, after the drainer read
///   the entries and pushed their slots (`Release`); their checks are
///   queued, or lost if queueing them panicked (see [`Progress`]).
///   `done <= written <= done + CAPACITY` and `drained <= recorded`, so entry
///   `i` lives in cell `i % CAPACITY` from its write until `done` passes it,
///   and never changes meanwhile; `drained` lies in entry `done`'s drops
///   (or equals `recorded`).
/// - Every dead entry names slots whose counts its thread took to zero: no
///   other thread writes those slots' words until the entry's drops are
///   drained. Every release entry names a slot whose count still holds the
///   one it will take away. The store's shared part of every entry stays
///   allocated until it is drained (module docs).
/// - `next_word` is stored by the owning thread, and set to 0 by every
///   drain. It is 0, or the address the header word of the slot after the
///   last entry's run would have if that slot lay in the same chunk; the
///   last entry is then that run's, and its store is alive (the drain that
///   precedes a store's end clears it). A slot whose word has that address
///   is that slot: chunks begin with a prefix and end after their last
///   slot, so no other slot's word sits right after a chunk's last slot
///   (see `layout.rs`). A drain's clearing can race a run's growth; the
///   drop that grows it is then its thread's, after the drain: counted by
///   `recorded`, in a store still alive, and taken by the next drain.
/// - The ring holds at most `CAPACITY - 1` drops not yet drained
///   (`recorded - drained`), so at most `CAPACITY` entries: every entry
///   after `done` holds a drop not yet drained.
pub(crate) struct LastDrops {
    entries: Box<[UnsafeCell<MaybeUninit<Entry>>; CAPACITY]>,
    recorded: AtomicUsize,
    written: AtomicUsize,
    drained: AtomicUsize,
    done: AtomicUsize,
    draining: NamedMutex<()>,
    next_word: AtomicUsize,
}

// The cells are written only by the owning thread, in cells no drainer reads
// (`done` has passed them, read with `Acquire`), and read by a drainer only
// under `draining` after the `Acquire` loads of `recorded` and `written`
// that publish them. `next_word` is an atomic: its thread stores it, drains
// clear it.
// SAFETY: no type parameter, no bound (no `Rc` inside); as above, and the entries
// point at atomics and a `Sync` `StoreShared`, valid until drained.
unsafe impl Sync for LastDrops {}
// SAFETY: no type parameter, no bound. Only the pointers in the entries keep
// the type from being `Send` on its own; they point at `Sync` data that does
// not belong to any thread (as above).
unsafe impl Send for LastDrops {}

impl LastDrops {
    /// Records `entry`, draining the ring first if it is full. Returns
    /// false, recording nothing, if it is full while this thread drains it
    /// (user code that the drain ran): the caller then pushes the slot itself.
    ///
    /// # Safety
    ///
    /// Only the ring's owning thread calls it, and the entry is as the type's
    /// invariants ask.
    unsafe fn record(&self, entry: Entry) -> bool {
        // SAFETY: the caller's contract.
        if unsafe { self.record_if_room(entry) } {
            return true;
        }
        if self.draining.held_here() {
            // User code run by this thread's own drain (the store allocator
            // or a logger, queueing a check) dropped a last handle: the
            // caller pushes the slot itself.
            return false;
        }
        // Everything recorded so far is drained when this returns, and at
        // most the last entry kept, so there is room.
        self.drain();
        // SAFETY: the caller's contract.
        unsafe { self.record_if_room(entry) }
    }

    /// True if the ring holds `CAPACITY - 1` drops not yet drained, given
    /// `recorded`: it then takes no more until drained. That bounds its
    /// entries too (only the entry `done` may hold no drop waiting), and it
    /// has its thread drain a run while the run's slots are still in its
    /// caches, instead of leaving a level's 100k to the next collection (a
    /// pass over all their slots). `Acquire`: a drainer's reads of the cells
    /// it frees happen before their reuse.
    #[inline(always)]
    fn is_full(&self, recorded: usize) -> bool {
        recorded - self.drained.load(Ordering::Acquire) >= CAPACITY - 1
    }

    /// Records a last drop of the slot whose header word is at `word`, in a
    /// ring that is not full (`recorded` is its count of drops): as one
    /// more of the last entry's run if it is the slot after that run's
    /// (`stride` bytes further), which is one store of `next_word` and one
    /// of `recorded`; else as a new entry, with the store's shared part and
    /// local index from `place`.
    ///
    /// # Safety
    ///
    /// As for `record`, and the caller took that slot's count to zero.
    #[inline(always)]
    unsafe fn record_dead<'s>(
        &self,
        recorded: usize,
        word: NonNull<AtomicU32>,
        stride: usize,
        place: impl FnOnce() -> (&'s StoreShared, u32),
    ) {
        if self.next_word.load(Ordering::Relaxed) == word.as_ptr().addr() {
            self.next_word.store(word.as_ptr().addr() + stride, Ordering::Relaxed);
            // `Release`: publishes the drop (and, through the caller's
            // fence, every use of the object) to whoever drains it.
            self.recorded.store(recorded + 1, Ordering::Release);
        } else {
            let (shared, local) = place();
            // SAFETY: the caller's contract; the ring is not full.
            unsafe { self.write(recorded, Entry::new(shared, word, Found::Dead { local, stride })) };
        }
    }

    /// [`record`](Self::record) when the ring has room: false, recording
    /// nothing, if it is full.
    ///
    /// # Safety
    ///
    /// As for `record`.
    #[inline(always)]
    unsafe fn record_if_room(&self, entry: Entry) -> bool {
        // Only this thread stores `recorded`.
        let recorded = self.recorded.load(Ordering::Relaxed);
        if self.is_full(recorded) {
            return false;
        }
        // SAFETY: the caller's contract; the ring is not full.
        unsafe { self.write(recorded, entry) };
        true
    }

    /// Writes `entry` as the ring's next entry, holding drop `recorded`.
    ///
    /// # Safety
    ///
    /// As for `record`, and the ring is not full, given `recorded`.
    #[inline(always)]
    unsafe fn write(&self, recorded: usize, mut entry: Entry) {
        // Only this thread stores `written`.
        let written = self.written.load(Ordering::Relaxed);
        entry.start = recorded;
        let next_word = match entry.found {
            Found::Dead { stride, .. } => entry.word.as_ptr().addr() + stride,
            Found::Release(_) | Found::Check(_) => 0,
        };
        self.next_word.store(next_word, Ordering::Relaxed);
        self.entries[written % CAPACITY].with_mut(|cell| {
            // SAFETY: the ring is not full, so `done > written - CAPACITY`
            // (read by `is_full` with `Acquire`): no drainer reads this cell
            // until `written` below publishes it (invariants).
            unsafe { (*cell).write(entry) };
        });
        // `Release`: publishes the entry before its drop is counted.
        self.written.store(written + 1, Ordering::Release);
        // `Release`: publishes the drop (and, through the caller's fence,
        // every use of the object) to whoever drains it.
        self.recorded.store(recorded + 1, Ordering::Release);
    }

    /// Pushes every recorded slot onto its store's dead lanes. Any thread may
    /// call it; drainers take turns.
    fn drain(&self) {
        // `Acquire` pairs with a drainer's `Release`: if nothing is left, its pushes are visible.
        if self.drained.load(Ordering::Acquire) == self.recorded.load(Ordering::Acquire) {
            return;
        }
        let _turn = self.draining.lock();
        let recorded = self.recorded.load(Ordering::Acquire);
        // After `recorded`: every entry that holds a counted drop is visible.
        let written = self.written.load(Ordering::Acquire);
        // Queueing a check runs user code (the store allocator, a logger),
        // which may panic: the guard then still pushes the open lanes and
        // marks what was read as drained, so no slot is linked twice.
        let mut progress = Progress {
            ring: self,
            drained: self.drained.load(Ordering::Relaxed),
            done: self.done.load(Ordering::Relaxed),
            lanes: Lanes::new(None),
        };
        let mut checks = Checks::default();
        while progress.drained < recorded {
            let at = progress.done;
            // SAFETY: drop `drained` is below `recorded` (read with `Acquire`),
            // so the entry holding it, `done`, is below `written` (read after
            // it) and its write is visible; `done` only moves under our turn,
            // so the cell holds entry `at` and its thread does not touch it.
            let entry = unsafe { self.entry(at) };
            // An entry's drops end where the next entry's begin. The last
            // entry's run may still grow: only what `recorded` counts is
            // taken, and the entry is kept (any other kind is one drop).
            let closed = at + 1 < written;
            // SAFETY: as above, for an entry below `written`.
            let end = if closed { unsafe { self.start_of(at + 1) } } else { recorded };
            let taken = end.min(recorded);
            let count = taken - progress.drained;
            match entry.found {
                // The common entry of drops at random: one slot, not read before.
                Found::Dead { local, .. } if count == 1 && progress.drained == entry.start => {
                    // SAFETY: the entry's one drop, recorded and not yet
                    // drained: slot `local`, whose word is `entry.word`.
                    unsafe { progress.lanes_for(entry.shared).link(local, entry.word) };
                }
                Found::Dead { local, stride } if count > 0 => {
                    let skip = progress.drained - entry.start;
                    // SAFETY: drops `drained..taken` of the entry are slots
                    // `skip..` of its run, which lie `stride` apart from its
                    // first in one chunk (`LastDrops` invariants), recorded and
                    // not yet drained.
                    unsafe { progress.lanes_for(entry.shared).link_run(local, entry.word, skip, stride, count) };
                }
                Found::Release(local) if count > 0 => {
                    // Only here: a ring of last drops (no releases) pays nothing for it.
                    self.prefetch_ahead(at, written);
                    // SAFETY: the entry's count keeps the slot, and its store's
                    // shared part, allocated until this decrement (invariants).
                    if unsafe { release(entry.word) } {
                        // SAFETY: this drain just took slot `local`'s count
                        // to zero, and its word is `entry.word`.
                        unsafe { progress.lanes_for(entry.shared).link(local, entry.word) };
                    }
                }
                Found::Check(check) if count > 0 => checks.add(entry.shared, check),
                // An entry kept by the last drain, with nothing new.
                Found::Dead { .. } | Found::Release(_) | Found::Check(_) => {}
            }
            progress.drained = taken;
            if closed && taken == end {
                progress.done = at + 1;
            }
        }
        progress.push_lanes(None);
        checks.flush();
    }

    /// The number of the first drop entry `at` holds.
    ///
    /// # Safety
    ///
    /// As for [`entry`](Self::entry).
    #[inline(always)]
    unsafe fn start_of(&self, at: usize) -> usize {
        // SAFETY: as in `entry`, only reading the one field.
        self.entries[at % CAPACITY].with(|cell| unsafe { (*cell).assume_init_ref().start })
    }

    /// Entry `at`, read.
    ///
    /// # Safety
    ///
    /// The caller holds `draining`, and `done <= at < written` with
    /// `written` read with `Acquire`.
    #[inline(always)]
    unsafe fn entry(&self, at: usize) -> Entry {
        // SAFETY: the caller's contract: the cell holds entry `at`, written
        // and published, and unchanged until `done` passes it.
        self.entries[at % CAPACITY].with(|cell| unsafe { (*cell).assume_init_read() })
    }
}

/// How many entries ahead a drain prefetches the count of a release entry
/// (the misses of that many decrements overlap).
const PREFETCH_AHEAD: usize = 8;

impl LastDrops {
    /// Prefetches the count word of the entry `PREFETCH_AHEAD` places after
    /// entry `i`, if it is below `written`: a drain's look-ahead, called
    /// under `draining` with `i` and `written` as in [`drain`](Self::drain).
    #[inline(always)]
    fn prefetch_ahead(&self, i: usize, written: usize) {
        if i + PREFETCH_AHEAD < written {
            // SAFETY: as for the drain's read of entry `i`, for a later entry
            // below `written` (only read).
            let ahead =
                self.entries[(i + PREFETCH_AHEAD) % CAPACITY].with(|cell| unsafe { (*cell).assume_init_ref().word });
            super::deferred_drops::prefetch_for_write(ahead.as_ptr().cast());
        }
    }
}

/// Applies a deferred drop: takes one count from `word`. True if that was
/// the last, with the `Acquire` fence of a last drop (see [`record`]): the
/// drainer then lists the slot as dead, as its thread would have.
///
/// # Safety
///
/// `word` is the header word of a slot whose count holds the one taken
/// here, with its segment's provenance (a drop that is the last marks the
/// whole header dead).
unsafe fn release(word: NonNull<AtomicU32>) -> bool {
    // SAFETY: the caller's contract: the count keeps the slot allocated.
    // `Release`, as a handle's drop: the dropping thread's uses of the
    // object reach here through the ring's `Release` and `Acquire`.
    if unsafe { word.as_ref() }.fetch_sub(1, Ordering::Release) == 1 {
        // SAFETY: the entry's word is a slot header's, with its segment's
        // provenance (see `Entry`), and its count just reached zero here.
        unsafe { SlotHeader::mark_dead_at(word) };
        fence(Ordering::Acquire);
        return true;
    }
    false
}

/// A drain's progress: on drop (also when queueing a check panicked) it
/// pushes the lanes still open and stores `drained` and `done` past what
/// was read. Checks of entries read but not yet queued are then lost: their
/// reservations stay, and an object whose count is all the owner's
/// reservation waits for shutdown, which is a leak, never a double destroy.
struct Progress<'a> {
    ring: &'a LastDrops,
    /// The first drop not read yet.
    drained: usize,
    /// The entry that holds it.
    done: usize,
    lanes: Lanes,
}

impl Progress<'_> {
    /// The open lanes, for slots of the store whose shared part is
    /// `shared`: those open now if they are that store's, else new ones
    /// (the others pushed first).
    #[inline(always)]
    fn lanes_for(&mut self, shared: NonNull<StoreShared>) -> &mut Lanes {
        if self.lanes.shared != Some(shared) {
            self.push_lanes(Some(shared));
        }
        &mut self.lanes
    }

    /// Pushes the open lanes, and opens empty ones for the store whose
    /// shared part is `shared` (or none).
    #[inline(never)]
    fn push_lanes(&mut self, shared: Option<NonNull<StoreShared>>) {
        std::mem::replace(&mut self.lanes, Lanes::new(shared)).push();
    }
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        self.push_lanes(None);
        // No run drained here grows any more: the store of a drained slot
        // may be freed once its drops are drained, and a slot of another
        // store may then lie where the run's next would have.
        self.ring.next_word.store(0, Ordering::Relaxed);
        // `Release`: the pushes above, and the reads of the cells, happen
        // before the owner reuses them.
        self.ring.done.store(self.done, Ordering::Release);
        self.ring.drained.store(self.drained, Ordering::Release);
    }
}

/// A run of drained slots of one store, linked through their words into one
/// chain per dead lane (see `shared.rs`), each chain pushed with one
/// compare-exchange. A slot next to its predecessor follows it onto its
/// lane (slots released in index order, as when a level unloads, stay one
/// run of neighbours, which collection steps along); any other slot takes
/// the next lane, so slots released at random spread evenly and collection
/// loads their links side by side.
struct Lanes {
    /// The store's shared part (`None` before the drain reaches a dead slot).
    shared: Option<NonNull<StoreShared>>,
    /// Each lane's first slot ([`NIL`] while the lane is empty). The current
    /// lane's is `last` instead, which `link` keeps there and writes back
    /// only when it moves to another lane (and in `push`).
    firsts: [u32; DEAD_LANES],
    /// Each lane's last slot's word, once the lane has a slot.
    tails: [Option<NonNull<AtomicU32>>; DEAD_LANES],
    /// The current lane, which the slot linked last went onto.
    lane: usize,
    /// The local index of the slot linked last ([`NIL`] before the first).
    last: u32,
}

impl Lanes {
    fn new(shared: Option<NonNull<StoreShared>>) -> Self {
        Lanes { shared, firsts: [NIL; DEAD_LANES], tails: [None; DEAD_LANES], lane: 0, last: NIL }
    }

    /// Puts the slot `local`, whose header word is `word`, in front of its lane's chain.
    ///
    /// # Safety
    ///
    /// `word` is the header word of slot `local`, recorded dead (or just
    /// released to zero by the drainer) and not yet drained, of the store
    /// these lanes are for.
    #[inline]
    unsafe fn link(&mut self, local: u32, word: NonNull<AtomicU32>) {
        if self.last != NIL {
            let first = if local == self.last.wrapping_add(1) {
                // The neighbour of the slot linked last follows it onto the
                // current lane, whose first slot that one is: a level's
                // unload, in index order, takes only this path.
                self.last
            } else {
                self.firsts[self.lane] = self.last;
                self.lane = (self.lane + 1) % DEAD_LANES;
                self.firsts[self.lane]
            };
            if first != NIL {
                // SAFETY: the word of a recorded slot (the caller's
                // contract) stays valid, and only its drainer writes it
                // (`LastDrops` invariants). `Relaxed`:
                // the push's `Release` publishes the link.
                unsafe { word.as_ref() }.store(LINK_FLAG | first, Ordering::Relaxed);
                self.last = local;
                return;
            }
        }
        // The first slot of an empty lane: also its last.
        self.tails[self.lane] = Some(word);
        self.last = local;
    }

    /// Links `count` slots of a run (see [`LastDrops`]) whose first is
    /// `local` with its header word at `word`, from its `skip`th: slot
    /// `local + skip + i` with its word `(skip + i) * stride` bytes past
    /// `word`. All but the first follow their predecessor onto its lane.
    ///
    /// # Safety
    ///
    /// Those slots are recorded dead, not yet drained, and lie `stride`
    /// bytes apart in one chunk; `word` carries its segment's provenance.
    #[inline]
    unsafe fn link_run(&mut self, local: u32, word: NonNull<AtomicU32>, skip: usize, stride: usize, count: usize) {
        let mut local = local + skip as u32;
        // SAFETY: the caller's contract: the slot lies in `word`'s chunk.
        let mut word = unsafe { word.byte_add(skip * stride) };
        // SAFETY: the caller's contract, for the run's slot `skip`.
        unsafe { self.link(local, word) };
        for _ in 1..count {
            // SAFETY: as above, for the next slot of the run.
            word = unsafe { word.byte_add(stride) };
            // SAFETY: as in `link`; `Relaxed` as there. The slot before is
            // `last`, the current lane's first.
            unsafe { word.as_ref() }.store(LINK_FLAG | local, Ordering::Relaxed);
            local += 1;
        }
        self.last = local;
    }

    fn push(mut self) {
        let Some(shared) = self.shared else { return };
        if self.last != NIL {
            self.firsts[self.lane] = self.last;
        }
        for (lane, (first, tail)) in self.firsts.into_iter().zip(self.tails).enumerate() {
            if let Some(tail) = tail {
                // SAFETY: as in `link`, for the store's shared part and the last word.
                unsafe { shared.as_ref().push_dead_chain(lane, first, tail.as_ref()) };
            }
        }
    }
}

/// Checks drained from a ring, queued on their stores a batch at a time
/// (one lock per batch of one store; no allocation in a drain). A batch the
/// store's queue drops (no room, or queueing it unwound) is lost, and its
/// objects wait for shutdown (the queue logs it).
struct Checks {
    shared: Option<NonNull<StoreShared>>,
    checks: [Check; 64],
    len: usize,
}

impl Default for Checks {
    fn default() -> Self {
        Checks { shared: None, checks: [Check { local: 0, generation: 0 }; 64], len: 0 }
    }
}

impl Checks {
    fn add(&mut self, shared: NonNull<StoreShared>, check: Check) {
        if self.shared != Some(shared) || self.len == self.checks.len() {
            self.flush();
            self.shared = Some(shared);
        }
        self.checks[self.len] = check;
        self.len += 1;
    }

    fn flush(&mut self) {
        if let Some(shared) = self.shared.take() {
            // SAFETY: the store's shared part outlives its entries (`LastDrops` invariants).
            // A batch with no room is lost (logged by the queue, see the type's docs).
            let _queued = unsafe { shared.as_ref() }.queue_checks(&self.checks[..self.len]);
            self.len = 0;
        }
    }
}

/// Queues the check of a lease the owner thread just took on the object
/// with `generation` in slot `local` (see `owner_counts.rs`): through the
/// thread's ring, or straight onto the store's queue if it has none. With
/// no room there either, the lease is given back at once.
///
/// Out of line: every handle clone inlines the test that leads here.
///
/// # Safety
///
/// The caller is the owner thread, holds a handle to the object in slot
/// `local` of `shared`'s store, whose header is `header`, and just took the
/// lease.
#[inline(never)]
pub(crate) unsafe fn record_lease(shared: &StoreShared, local: u32, generation: u32, header: &SlotHeader) {
    let check = Check { local, generation };
    let entry = Entry::new(shared, NonNull::from(&header.word), Found::Check(check));
    // SAFETY: the caller, the owner thread, holds a handle to the object, so
    // its count (or the lease's, until the check gives it back) keeps the
    // slot held and the store's shared part allocated until the entry is
    // drained (shutdown counts the slot as outliving meanwhile).
    if !unsafe { record_mine(entry) } && !shared.queue_checks(&[check]) {
        header.end_lease();
    }
}

/// Queues the slot whose header word is `word`, whose count the caller just
/// took to zero with a `Release` decrement, for collection: through the
/// calling thread's ring, or straight onto the dead list if the thread has
/// none (it is exiting, or the ring could not be allocated). `stride` is
/// the size of the store's slots; `place` gives the store's shared part and
/// the slot's local index, which a drop that joins a run does not need.
///
/// The `Acquire` fence makes every other reference's use of the object
/// happen before it is destroyed (the same pairing as `Arc`'s drop); the
/// ring, then the dead list, carry that on to the collector.
///
/// Every handle drop inlines the test that leads to its out-of-line caller
/// (`Handle::record_last_drop`), which inlines this. Its common cases, a
/// drop that joins the last entry's run (a handful of instructions) and a
/// ring with room, are here; a full ring, a thread with none and the push
/// are in [`record_rest`], out of line.
///
/// # Safety
///
/// `word` is the header word of a slot whose count the caller took to
/// zero, with its segment's provenance, and slots of its store lie `stride`
/// bytes apart within a chunk.
#[inline(always)]
pub(crate) unsafe fn record<'s>(
    word: NonNull<AtomicU32>,
    stride: usize,
    place: impl FnOnce() -> (&'s StoreShared, u32),
) {
    // SAFETY: `word` is a slot header's word with its segment's provenance
    // (the caller), and the caller took its count to zero.
    unsafe { SlotHeader::mark_dead_at(word) };
    fence(Ordering::Acquire);
    if let Ok(Some(ring)) = RING.try_with(Cell::get) {
        // SAFETY: a ring in `RING` is this thread's own and still allocated
        // (`RING`'s invariant).
        let ring = unsafe { ring.as_ref() };
        // Only this thread stores `recorded`.
        let recorded = ring.recorded.load(Ordering::Relaxed);
        if !ring.is_full(recorded) {
            // SAFETY: the caller took the slot's count to zero (its contract).
            unsafe { ring.record_dead(recorded, word, stride, place) };
            return;
        }
    }
    let (shared, local) = place();
    // SAFETY: the caller took the slot's count to zero (its contract).
    unsafe { record_rest(shared, local, word, stride) };
}

/// Writes `entry` into the calling thread's ring if it has one with room:
/// the common case of every record, inlined. False otherwise.
///
/// # Safety
///
/// The entry is as the `LastDrops` invariants ask.
#[inline(always)]
unsafe fn record_if_room_here(entry: Entry) -> bool {
    match RING.try_with(Cell::get) {
        // SAFETY: a ring in `RING` is this thread's own and still allocated
        // (`RING`'s invariant), and the entry is as the invariants ask (caller).
        Ok(Some(ring)) => unsafe { ring.as_ref().record_if_room(entry) },
        _ => false,
    }
}

/// Records a handle's drop on a manager that defers its drops (see
/// `deferred_drops.rs`): its decrement waits for the thread's ring to be
/// drained. With no ring, or none with room (its own thread is draining it),
/// the drop counts at once, and a last drop goes straight onto the dead list.
///
/// The caller's handle is gone after this: its count now belongs to the
/// entry, which keeps the slot allocated until the drain applies it.
///
/// Inlined into the handle's out-of-line drop path: its common case, a
/// ring with room, is a dozen instructions; the rest is in
/// [`record_release_rest`].
///
/// # Safety
///
/// `word` is the header word of a slot the caller's handle counts on, with
/// its segment's provenance (a handle's).
#[inline]
pub(crate) unsafe fn record_release(shared: &StoreShared, local: u32, word: NonNull<AtomicU32>) {
    let entry = Entry::new(shared, word, Found::Release(local));
    // SAFETY: the caller's count keeps the slot held until the entry is drained (the invariants).
    if !unsafe { record_if_room_here(entry) } {
        // SAFETY: this function's contract.
        unsafe { record_release_rest(shared, local, word) };
    }
}

/// The rest of [`record_release`]: the ring drained first if it is full (or
/// made, if this is the thread's first drop), else the drop counted at once.
///
/// # Safety
///
/// As for [`record_release`].
#[cold]
#[inline(never)]
unsafe fn record_release_rest(shared: &StoreShared, local: u32, word: NonNull<AtomicU32>) {
    let entry = Entry::new(shared, word, Found::Release(local));
    // SAFETY: the caller's count keeps the slot held until the entry is drained.
    if unsafe { record_mine(entry) } {
        return;
    }
    // SAFETY: the caller's count is still in the word, which has its
    // segment's provenance (`record_release`'s contract).
    if unsafe { release(word) } {
        note_here();
        // SAFETY: the word outlives a dead slot's push.
        shared.push_dead(local, unsafe { word.as_ref() });
    }
}

/// The rest of [`record`]: the ring drained first if it is full (or made,
/// if this is the thread's first last drop), else the slot pushed straight
/// onto the dead list.
///
/// # Safety
///
/// As for [`record`]: the caller took the slot's count to zero.
#[cold]
#[inline(never)]
unsafe fn record_rest(shared: &StoreShared, local: u32, word: NonNull<AtomicU32>, stride: usize) {
    // SAFETY: the caller's contract.
    if !unsafe { record_mine(Entry::new(shared, word, Found::Dead { local, stride })) } {
        note_here();
        // SAFETY: the slot's word outlives a dead slot's record.
        shared.push_dead(local, unsafe { word.as_ref() });
    }
}

/// Writes `entry` into the calling thread's ring. False if the thread has
/// none (it is exiting, or the ring could not be allocated).
///
/// # Safety
///
/// The entry is as the `LastDrops` invariants ask.
#[inline]
unsafe fn record_mine(entry: Entry) -> bool {
    let recorded = MINE.try_with(|mine| match mine.ring() {
        Some(ring) => {
            // SAFETY: `ring` is this thread's own, and the entry is as the
            // invariants ask (caller).
            unsafe { ring.as_ref().record(entry) }
        }
        None => false,
    });
    matches!(recorded, Ok(true))
}

/// A number that grows whenever the calling thread records a drop (in its
/// ring, or straight onto a dead list) or, as an owner, marks an object
/// [`PENDING`](super::owner_counts::PENDING): a collection compares it
/// around a round to learn whether the objects it destroyed released
/// others (a cascade), which only this thread's drops can do.
pub(crate) fn noted_here() -> usize {
    let ring = RING.try_with(Cell::get).ok().flatten();
    // SAFETY: a ring in `RING` is this thread's own and still allocated
    // (`RING`'s invariant); only this thread stores `recorded`.
    let recorded = ring.map_or(0, |ring| unsafe { ring.as_ref() }.recorded.load(Ordering::Relaxed));
    recorded.wrapping_add(NOTED.try_with(Cell::get).unwrap_or(0))
}

/// Counts a drop or mark that [`noted_here`] does not find in the ring.
#[cold]
pub(crate) fn note_here() {
    let _ = NOTED.try_with(|noted| noted.set(noted.get().wrapping_add(1)));
}

// Drops pushed straight onto a dead list and owners' marks (see `noted_here`).
#[cfg(not(loom))]
std::thread_local!(static NOTED: Cell<usize> = const { Cell::new(0) });
#[cfg(loom)]
loom::thread_local!(static NOTED: Cell<usize> = Cell::new(0));

/// Drains every thread's ring: afterwards every last drop that happened
/// before the call is on its store's dead list.
pub(crate) fn drain_all() {
    if registry().held_here() {
        // User code run under this drain (a store allocator or a logger,
        // queueing a check) read or collected a manager: the drain under
        // way goes on, and what it has not reached waits for the next one.
        return;
    }
    let rings = registry().lock();
    for ring in rings.iter() {
        // SAFETY: a registered ring stays allocated until its thread takes it
        // out of the registry, which waits for this lock (see `ThreadRing`).
        unsafe { ring.0.as_ref() }.drain();
    }
}

/// A registered ring's address.
struct RingPtr(NonNull<LastDrops>);

// SAFETY: no type parameter, no bound. `LastDrops` is `Sync`, and the
// registry only ever shares the ring (its thread keeps the ownership).
unsafe impl Send for RingPtr {}

#[cfg(not(loom))]
fn registry() -> &'static NamedMutex<Vec<RingPtr>> {
    static RINGS: NamedMutex<Vec<RingPtr>> = NamedMutex::new(Vec::new(), "draining every thread's last drops", "");
    &RINGS
}

#[cfg(loom)]
fn registry() -> &'static NamedMutex<Vec<RingPtr>> {
    loom::lazy_static! {
        static ref RINGS: NamedMutex<Vec<RingPtr>> =
            NamedMutex::new(Vec::new(), "draining every thread's last drops", "");
    }
    &RINGS
}

// The calling thread's ring, made on its first last drop: a thread-local
// without a destructor, so that reaching it tests no state (one with a
// destructor checks on every access whether it is registered or has run:
// a dozen instructions on every last drop). `MINE`'s destructor frees it.
//
// Invariant: once set, it is a `Box<LastDrops>`'s allocation, listed in
// the registry; only `ThreadRing::register` sets it, and only
// `ThreadRing`'s drop empties it (then drains the ring, takes it out of
// the registry and frees it).
#[cfg(not(loom))]
std::thread_local!(static RING: Cell<Option<NonNull<LastDrops>>> = const { Cell::new(None) });
#[cfg(loom)]
loom::thread_local!(static RING: Cell<Option<NonNull<LastDrops>>> = Cell::new(None));

/// The destructor of the calling thread's ring ([`RING`]): reached before a
/// ring is made, so the thread's exit frees it, and unreachable once the
/// thread-locals are being destroyed, when no ring is made any more.
struct ThreadRing;

#[cfg(not(loom))]
std::thread_local!(static MINE: ThreadRing = const { ThreadRing });
#[cfg(loom)]
loom::thread_local!(static MINE: ThreadRing = ThreadRing);

impl ThreadRing {
    /// The ring, made and registered if this is the thread's first last
    /// drop; `None` if there was no memory for it (the caller then pushes
    /// the slot itself, and the next drop tries again).
    #[inline]
    fn ring(&self) -> Option<NonNull<LastDrops>> {
        if let Some(ring) = RING.try_with(Cell::get).ok().flatten() {
            return Some(ring);
        }
        self.register()
    }

    #[cold]
    fn register(&self) -> Option<NonNull<LastDrops>> {
        if registry().held_here() {
            // Called from user code under `drain_all`: no ring for now, the
            // caller pushes the slot itself.
            return None;
        }
        // Framework memory, like a store's: never charged to the tag in scope
        // at the thread's first last drop (freed untracked too, in `drop`).
        let _untracked = crate::track::Reentry::enter();
        // Both allocations fallible: a drop must not abort for want of a ring.
        let mut entries = Vec::new();
        entries.try_reserve_exact(CAPACITY).ok()?;
        entries.extend((0..CAPACITY).map(|_| UnsafeCell::new(MaybeUninit::uninit())));
        let entries: Box<[_; CAPACITY]> = entries.into_boxed_slice().try_into().ok()?;
        let layout = std::alloc::Layout::new::<LastDrops>();
        // SAFETY: `LastDrops` is not zero-sized.
        let raw = NonNull::new(unsafe { std::alloc::alloc(layout) }.cast::<LastDrops>())?;
        let ring = LastDrops {
            entries,
            recorded: AtomicUsize::new(0),
            written: AtomicUsize::new(0),
            drained: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            draining: NamedMutex::new((), "draining the last drops of a thread", ""),
            next_word: AtomicUsize::new(0),
        };
        // SAFETY: `raw` is a fresh allocation of `LastDrops`'s layout.
        unsafe { raw.as_ptr().write(ring) };
        let mut rings = registry().lock();
        if rings.try_reserve(1).is_err() {
            drop(rings);
            // SAFETY: written above, and shared with no one.
            drop(unsafe { Box::from_raw(raw.as_ptr()) });
            return None;
        }
        if RING.try_with(|ring| ring.set(Some(raw))).is_err() {
            // Never for a thread-local without a destructor; but a ring
            // nobody can reach must not stay listed.
            drop(rings);
            // SAFETY: written above, and shared with no one.
            drop(unsafe { Box::from_raw(raw.as_ptr()) });
            return None;
        }
        rings.push(RingPtr(raw));
        Some(raw)
    }
}

/// Not under loom: loom drops the main thread's thread-locals after the
/// registry, and every model drains through the registry anyway (a ring of
/// a finished thread stays listed, and leaks with the model's execution).
#[cfg(not(loom))]
impl Drop for ThreadRing {
    fn drop(&mut self) {
        // First out of reach: a drop the drain below leads to (user code)
        // pushes its slot itself, as every drop from now on does.
        let Some(ring) = RING.try_with(Cell::take).ok().flatten() else { return };
        // Drained while still listed: a thread that saw this one finish
        // (a scoped join can return before thread-local destructors ran)
        // and drains every ring either finds these slots pushed already or
        // waits for them under the ring's lock. No drop records here any
        // more: this thread's `MINE` is being destroyed.
        // SAFETY: the ring was made by `register`, and only this drop frees it.
        unsafe { ring.as_ref() }.drain();
        // Then out of the registry: a drainer holding the lock finishes with
        // the ring before this returns, and none finds it afterwards.
        registry().lock().retain(|listed| listed.0 != ring);
        let _untracked = crate::track::Reentry::enter();
        // SAFETY: made by `register` as a leaked box; no other thread can
        // reach it any more (above).
        drop(unsafe { Box::from_raw(ring.as_ptr()) });
    }
}
