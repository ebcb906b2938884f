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
//! A ring is *drained* (its slots linked into chains, one compare-exchange
//! per dead lane that a run of slots of one store reaches, see [`Lanes`])
//! when it fills, when its thread exits, and by every call that reads a
//! dead list: `collect_garbage` (every round, so cascades still finish in
//! one call), `dead_count` and the counts derived from it, and shutdown.
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

/// Slots a ring holds before its thread drains it (small under loom, so the
/// models reach a full ring).
#[cfg(not(loom))]
pub(crate) const CAPACITY: usize = 256;
#[cfg(loom)]
pub(crate) const CAPACITY: usize = 2;

/// One recorded slot: its store's shared part, its header word, and what
/// was recorded: a drop that found a count of 0 (its local index), a drop
/// whose decrement the drain applies (see `deferred_drops.rs`), or the
/// check of a lease the owner thread took, for its collection to decide
/// (see `owner_counts.rs`).
#[derive(Clone, Copy)]
struct Entry {
    shared: NonNull<StoreShared>,
    word: NonNull<AtomicU32>,
    found: Found,
}

/// What was recorded.
#[derive(Clone, Copy)]
enum Found {
    Dead(u32),
    Release(u32),
    Check(Check),
}

/// One thread's ring of last drops.
///
/// # Invariants
///
/// - `recorded` counts the entries ever written and is stored only by the
///   owning thread, after it wrote the entry (`Release`); `drained` counts
///   the entries ever drained and is stored only under `draining`, after the
///   drainer read them and pushed their slots (`Release`); their checks are
///   queued, or lost if queueing them panicked (see [`Progress`]).
///   `drained <= recorded <= drained + CAPACITY`, so entry `i` lives in cell
///   `i % CAPACITY` from its write until `drained` passes it.
/// - Every dead entry names a slot whose count its thread took to zero: no
///   other thread writes that slot's word until the entry is drained. Every
///   release entry names a slot whose count still holds the one it will
///   take away. The store's shared part of every entry stays allocated until
///   it is drained (module docs).
pub(crate) struct LastDrops {
    entries: Box<[UnsafeCell<MaybeUninit<Entry>>; CAPACITY]>,
    recorded: AtomicUsize,
    drained: AtomicUsize,
    draining: NamedMutex<()>,
}

// The cells are written only by the owning thread, in cells no drainer reads
// (`drained` has passed them, read with `Acquire`), and read by a drainer only
// under `draining` after the `Acquire` load of `recorded` that publishes them.
// SAFETY: no type parameter, no bound (no `Rc` inside); as above, and the entries
// point at atomics and a `Sync` `StoreShared`, valid until drained.
unsafe impl Sync for LastDrops {}
// SAFETY: no type parameter, no bound. Only the pointers in the entries keep
// the type from being `Send` on its own; they point at `Sync` data that does
// not belong to any thread (as above).
unsafe impl Send for LastDrops {}

impl LastDrops {
    /// Records a slot whose count the calling thread just took to zero,
    /// draining the ring first if it is full. Returns false, recording
    /// nothing, if it is full while this thread drains it (user code that
    /// the drain ran): the caller then pushes the slot itself.
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
        // Everything recorded so far is drained when this returns, so there is room.
        self.drain();
        // SAFETY: the caller's contract.
        unsafe { self.record_if_room(entry) }
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
        // `Acquire`: a drainer's reads of the cell about to be reused happen before the write.
        if recorded - self.drained.load(Ordering::Acquire) == CAPACITY {
            return false;
        }
        self.entries[recorded % CAPACITY].with_mut(|cell| {
            // SAFETY: `drained > recorded - CAPACITY`, so no drainer reads
            // this cell until `recorded` below publishes it (invariants).
            unsafe { (*cell).write(entry) };
        });
        // `Release`: publishes the entry (and, through the caller's fence,
        // every use of the object) to whoever drains it.
        self.recorded.store(recorded + 1, Ordering::Release);
        true
    }

    /// Pushes every recorded slot onto its store's dead lanes. Any thread may
    /// call it; drainers take turns.
    fn drain(&self) {
        // `Acquire` pairs with a drainer's `Release`: if nothing is left, its pushes are visible.
        if self.drained.load(Ordering::Acquire) == self.recorded.load(Ordering::Acquire) {
            return;
        }
        let _turn = self.draining.lock();
        let drained = self.drained.load(Ordering::Relaxed);
        let recorded = self.recorded.load(Ordering::Acquire);
        // Queueing a check runs user code (the store allocator, a logger),
        // which may panic: the guard then still pushes the open lanes and
        // marks what was read as drained, so no entry is linked twice.
        let mut progress = Progress { ring: self, next: drained, lanes: None };
        let mut checks = Checks::default();
        for i in drained..recorded {
            // SAFETY: `i` is below `recorded` (read with `Acquire`, so its
            // write is visible) and at or above `drained`, which only we may
            // move: the cell holds entry `i` and its thread does not touch it.
            let entry = self.entries[i % CAPACITY].with(|cell| unsafe { (*cell).assume_init_read() });
            let dead = match entry.found {
                Found::Dead(local) => Some(local),
                Found::Release(local) => {
                    // Only here: a ring of last drops (no releases) pays nothing for it.
                    self.prefetch_ahead(i, recorded);
                    // SAFETY: the entry's count keeps the slot, and its store's
                    // shared part, allocated until this decrement (invariants).
                    unsafe { release(entry.word) }.then_some(local)
                }
                Found::Check(check) => {
                    checks.add(entry.shared, check);
                    None
                }
            };
            if let Some(local) = dead {
                match &mut progress.lanes {
                    Some(open) if open.shared == entry.shared => open.link(local, entry.word),
                    other => {
                        if let Some(done) = other.take() {
                            done.push();
                        }
                        let mut open = Lanes::new(entry.shared);
                        open.link(local, entry.word);
                        *other = Some(open);
                    }
                }
            }
            progress.next = i + 1;
        }
        if let Some(done) = progress.lanes.take() {
            done.push();
        }
        checks.flush();
    }
}

/// How many entries ahead a drain prefetches the count of a release entry
/// (the misses of that many decrements overlap).
const PREFETCH_AHEAD: usize = 8;

impl LastDrops {
    /// Prefetches the count word of the entry `PREFETCH_AHEAD` places after
    /// entry `i`, if it is below `recorded`: a drain's look-ahead, called
    /// under `draining` with `i` and `recorded` as in [`drain`](Self::drain).
    #[inline(always)]
    fn prefetch_ahead(&self, i: usize, recorded: usize) {
        if i + PREFETCH_AHEAD < recorded {
            // SAFETY: as for the drain's read of entry `i`, for a later entry
            // below `recorded` (only read).
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
/// `word` is the header word of a slot whose count holds the one taken here.
unsafe fn release(word: NonNull<AtomicU32>) -> bool {
    // SAFETY: the caller's contract: the count keeps the slot allocated.
    // `Release`, as a handle's drop: the dropping thread's uses of the
    // object reach here through the ring's `Release` and `Acquire`.
    if unsafe { word.as_ref() }.fetch_sub(1, Ordering::Release) == 1 {
        fence(Ordering::Acquire);
        return true;
    }
    false
}

/// A drain's progress: on drop (also when queueing a check panicked) it
/// pushes the lanes still open and stores `drained` past the entries read.
/// Checks of entries read but not yet queued are then lost: their
/// reservations stay, and an object whose count is all the owner's
/// reservation waits for shutdown, which is a leak, never a double destroy.
struct Progress<'a> {
    ring: &'a LastDrops,
    /// The first entry not read yet.
    next: usize,
    lanes: Option<Lanes>,
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        if let Some(done) = self.lanes.take() {
            done.push();
        }
        // `Release`: the pushes above, and the reads of the cells, happen
        // before the owner reuses them.
        self.ring.drained.store(self.next, Ordering::Release);
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
    shared: NonNull<StoreShared>,
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
    fn new(shared: NonNull<StoreShared>) -> Self {
        Lanes { shared, firsts: [NIL; DEAD_LANES], tails: [None; DEAD_LANES], lane: 0, last: NIL }
    }

    /// Puts the slot `local`, whose header word is `word`, in front of its lane's chain.
    #[inline]
    fn link(&mut self, local: u32, word: NonNull<AtomicU32>) {
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
                // SAFETY: the word of a recorded slot stays valid, and only
                // its drainer writes it (`LastDrops` invariants). `Relaxed`:
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

    fn push(mut self) {
        if self.last != NIL {
            self.firsts[self.lane] = self.last;
        }
        for (lane, (first, tail)) in self.firsts.into_iter().zip(self.tails).enumerate() {
            if let Some(tail) = tail {
                // SAFETY: as in `link`, for the store's shared part and the last word.
                unsafe { self.shared.as_ref().push_dead_chain(lane, first, tail.as_ref()) };
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
#[inline(never)]
pub(crate) fn record_lease(shared: &StoreShared, local: u32, generation: u32, header: &SlotHeader) {
    let check = Check { local, generation };
    let entry = Entry { shared: NonNull::from(shared), word: NonNull::from(&header.word), found: Found::Check(check) };
    // SAFETY: the caller, the owner thread, holds a handle to the object, so
    // its count (or the lease's, until the check gives it back) keeps the
    // slot held and the store's shared part allocated until the entry is
    // drained (shutdown counts the slot as outliving meanwhile).
    if !unsafe { record_mine(entry) } && !shared.queue_checks(&[check]) {
        header.end_lease();
    }
}

/// Queues the slot `local`, whose count the caller just took to zero with a
/// `Release` decrement, for collection: through the calling thread's ring,
/// or straight onto the dead list if the thread has none (it is exiting, or
/// the ring could not be allocated).
///
/// The `Acquire` fence makes every other reference's use of the object
/// happen before it is destroyed (the same pairing as `Arc`'s drop); the
/// ring, then the dead list, carry that on to the collector.
///
/// Every handle drop inlines the test that leads to its out-of-line caller
/// (`Handle::record_last_drop`), which inlines this. Its common case, a
/// ring with room, is about twenty instructions; a full ring, a thread with none
/// and the push are in [`record_rest`], out of line.
#[inline(always)]
pub(crate) fn record(shared: &StoreShared, local: u32, word: &AtomicU32) {
    fence(Ordering::Acquire);
    let entry = Entry { shared: NonNull::from(shared), word: NonNull::from(word), found: Found::Dead(local) };
    // SAFETY: the caller took the slot's count to zero (the entry is as the invariants ask).
    if !unsafe { record_if_room_here(entry) } {
        record_rest(shared, local, word);
    }
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
#[inline]
pub(crate) fn record_release(shared: &StoreShared, local: u32, word: &AtomicU32) {
    let entry = Entry { shared: NonNull::from(shared), word: NonNull::from(word), found: Found::Release(local) };
    // SAFETY: the caller's count keeps the slot held until the entry is drained (the invariants).
    if !unsafe { record_if_room_here(entry) } {
        record_release_rest(shared, local, word);
    }
}

/// The rest of [`record_release`]: the ring drained first if it is full (or
/// made, if this is the thread's first drop), else the drop counted at once.
#[cold]
#[inline(never)]
fn record_release_rest(shared: &StoreShared, local: u32, word: &AtomicU32) {
    let entry = Entry { shared: NonNull::from(shared), word: NonNull::from(word), found: Found::Release(local) };
    // SAFETY: the caller's count keeps the slot held until the entry is drained.
    if unsafe { record_mine(entry) } {
        return;
    }
    // SAFETY: the caller's count is still in the word.
    if unsafe { release(NonNull::from(word)) } {
        shared.push_dead(local, word);
    }
}

/// The rest of [`record`]: the ring drained first if it is full (or made,
/// if this is the thread's first last drop), else the slot pushed straight
/// onto the dead list.
#[cold]
#[inline(never)]
fn record_rest(shared: &StoreShared, local: u32, word: &AtomicU32) {
    let entry = Entry { shared: NonNull::from(shared), word: NonNull::from(word), found: Found::Dead(local) };
    // SAFETY: the caller took the slot's count to zero.
    if !unsafe { record_mine(entry) } {
        shared.push_dead(local, word);
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
            drained: AtomicUsize::new(0),
            draining: NamedMutex::new((), "draining the last drops of a thread", ""),
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
