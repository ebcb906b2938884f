//! The part of a store that handles point at: its identity and its dead lists.
//!
//! A dead list is a lock-free stack of local slot indices, threaded through
//! the slots' header words. Any thread pushes (the drain of a ring of last
//! drops, see `last_drops.rs`, or a raw release that takes the count to
//! zero); only collection, which holds `&mut ObjectManager`, takes a whole
//! stack at once with one swap. Since nothing ever pops a single node, a
//! successful push CAS always links the node to the true top: no ABA.
//!
//! A store has [`DEAD_LANES`] such stacks. Walking one is a chain of
//! dependent loads (each slot's word names the next slot), and a frame's
//! profile put half of collection's time on waiting for them; collection
//! walks the lanes side by side, so the CPU has one load of each in flight
//! at once (see `Store::collect`).

use hashbrown::{DefaultHashBuilder, HashMap};

use crate::sync::{fence, AtomicU32, Ordering};

use super::candidates::Candidates;
use super::layout::{locate, MAX_SEGMENTS};
use super::owner_counts::Check;
use super::reentry::NamedMutex;
use super::slot::{LINK_FLAG, NIL};
use super::store_alloc::StoreAlloc;

/// The dead lists of a store (see the module docs).
pub(crate) const DEAD_LANES: usize = 4;

/// The lane a single slot `local` is pushed onto: spread by index.
#[inline]
pub(crate) fn lane_of(local: u32) -> usize {
    local as usize % DEAD_LANES
}

/// Outstanding raw references by local slot index, in the store's allocator.
pub(crate) type RawRefs = HashMap<u32, u32, DefaultHashBuilder, StoreAlloc>;

/// Makes room for one more entry in `refs`, so that the insert that follows
/// cannot fail (and abort) in the store's allocator.
pub(crate) fn reserve_raw_ref(refs: &mut RawRefs, type_name: &'static str) -> Result<(), crate::Error> {
    refs.try_reserve(1).map_err(|_| crate::Error::StoreOutOfMemory {
        type_name,
        part: "the raw-reference table",
        bytes: (refs.len() + 1) * std::mem::size_of::<(u32, u32)>(),
        allocator: refs.allocator().name(),
    })
}

/// What a store shares with its handles.
///
/// # Invariants
///
/// - It is allocated once per store and outlives every handle into the store:
///   the manager frees it only after proving that no handle is left, and
///   leaks it otherwise.
/// - `segment_start[k]` is written before segment `k` is published, and never again.
#[repr(C, align(64))]
pub(crate) struct StoreShared {
    /// Top of each dead stack (a local index, or [`NIL`]). Alone on their cache line.
    dead_heads: [AtomicU32; DEAD_LANES],
    _pad: [u8; 64 - 4 * DEAD_LANES],
    /// The owning manager's id.
    pub(crate) manager_id: u32,
    /// This store's position in the manager's store table.
    pub(crate) store_index: u32,
    /// log2 of the first segment's slot count.
    pub(crate) base_bits: u32,
    /// The store's object type, for messages.
    pub(crate) type_name: &'static str,
    /// True if the type's objects may hold handles: a drop that leaves
    /// references behind then queues a candidate root (also in every chunk
    /// header, one load closer to a handle).
    pub(crate) cyclable: bool,
    /// The manager's owner thread's token, or 0 for none (see `owner_counts.rs`).
    pub(crate) owner_thread: u64,
    /// Candidate roots for cycle collection (see `candidates.rs`).
    pub(crate) candidates: NamedMutex<Candidates>,
    /// Set when a candidate could not be queued because this thread was
    /// already queueing one (user code, the store allocator, dropped a
    /// handle there): the collector then scans the store, as after a refusal.
    pub(crate) candidates_missed: std::sync::atomic::AtomicBool,
    /// Checks of the objects whose last handle may be gone while the owner
    /// thread holds counts on them, for the owner's next collection (see
    /// `owner_counts.rs`). A slot may be named twice.
    checks: NamedMutex<allocator_api2::vec::Vec<Check, StoreAlloc>>,
    /// Set once a collection on another thread than the owner left checks
    /// queued, and said so.
    pub(crate) warned_not_owner: std::sync::atomic::AtomicBool,
    /// The manager-wide index of each segment's first slot.
    segment_start: [AtomicU32; MAX_SEGMENTS],
    /// Outstanding raw references, by local slot index. Raw calls check it, so
    /// a raw handle can never give back more references than it holds.
    pub(crate) raw_refs: NamedMutex<RawRefs>,
    /// Where each live handle was made (feature `handle-sites`).
    #[cfg(feature = "handle-sites")]
    pub(crate) handle_sites: super::handle_sites::SiteTable,
}

impl StoreShared {
    pub(crate) fn new(
        manager_id: u32,
        store_index: u32,
        base_bits: u32,
        type_name: &'static str,
        cyclable: bool,
        owner_thread: u64,
        alloc: StoreAlloc,
    ) -> Self {
        StoreShared {
            dead_heads: std::array::from_fn(|_| AtomicU32::new(NIL)),
            _pad: [0; 64 - 4 * DEAD_LANES],
            manager_id,
            store_index,
            base_bits,
            type_name,
            cyclable,
            owner_thread,
            candidates: NamedMutex::new(Candidates::new(alloc.clone()), "queueing a cycle candidate of", type_name),
            candidates_missed: std::sync::atomic::AtomicBool::new(false),
            checks: NamedMutex::new(
                allocator_api2::vec::Vec::new_in(alloc.clone()),
                "queueing checks of released",
                type_name,
            ),
            warned_not_owner: std::sync::atomic::AtomicBool::new(false),
            segment_start: std::array::from_fn(|_| AtomicU32::new(0)),
            #[cfg(feature = "handle-sites")]
            handle_sites: super::handle_sites::SiteTable::new(alloc.clone(), type_name),
            raw_refs: NamedMutex::new(
                HashMap::with_hasher_in(DefaultHashBuilder::default(), alloc),
                "updating the raw references of",
                type_name,
            ),
        }
    }

    /// Pushes the slot `local`, whose header word is `word`, onto a dead stack.
    ///
    /// The caller has just taken the slot's count to zero, so no other thread
    /// writes `word` until collection takes the stack.
    #[inline]
    pub(crate) fn push_dead(&self, local: u32, word: &AtomicU32) {
        self.push_dead_chain(lane_of(local), local, word);
    }

    /// Queues the slot `local` for collection after its count reached zero.
    ///
    /// The caller's decrement was `Release`; the `Acquire` fence here makes
    /// every other reference's use of the object happen before it is
    /// destroyed (the same pairing as `Arc`'s drop).
    #[inline]
    pub(crate) fn release_last(&self, local: u32, word: &AtomicU32) {
        fence(Ordering::Acquire);
        self.push_dead(local, word);
    }

    /// Queues the slot `local` as a candidate root. Returns false if there
    /// was no room (see [`Candidates::push`]).
    ///
    /// The caller holds a reference to the slot, so the store outlives the call.
    #[cold]
    pub(crate) fn note_candidate(&self, local: u32) -> bool {
        if self.candidates.held_here() {
            // Waiting would deadlock: the slot goes unqueued, as when the
            // buffer has no room, and the collector scans the store.
            self.candidates_missed.store(true, std::sync::atomic::Ordering::Relaxed);
            return false;
        }
        self.candidates.lock().push(local)
    }

    /// Queues the checks `new` for the owner's next collection.
    ///
    /// If the store's allocator refuses room, the checks are dropped and an
    /// error is logged: those objects are then reclaimed only at shutdown.
    /// Returns false if the checks were dropped (the owner's clone then gives
    /// its lease back at once, see `last_drops::record_lease`).
    #[must_use]
    pub(crate) fn queue_checks(&self, new: &[Check]) -> bool {
        // Called from user code that runs while this thread queues checks
        // (the store allocator, a logger): waiting would deadlock, so the
        // checks are dropped, as when there is no room.
        let queued = !self.checks.held_here() && {
            let mut checks = self.checks.lock();
            let room = checks.try_reserve(new.len()).is_ok();
            if room {
                checks.extend_from_slice(new);
            }
            room
        };
        if !queued {
            log::error!(
                target: "mmobject",
                "could not queue {} check(s) of released {} objects (no memory, or a store allocator or logger \
                 released them while the queue grew): they will be reclaimed at shutdown",
                new.len(),
                self.type_name
            );
        }
        queued
    }

    /// Takes every queued check.
    pub(crate) fn take_checks(&self) -> allocator_api2::vec::Vec<Check, StoreAlloc> {
        let mut checks = self.checks.lock();
        let alloc = checks.allocator().clone();
        std::mem::replace(&mut *checks, allocator_api2::vec::Vec::new_in(alloc))
    }

    /// Queues again the checks of the leases a collection renewed: into the
    /// queue itself if it is empty (no allocation), else after the checks
    /// queued since. Gives them back if there is no room.
    pub(crate) fn requeue_checks(
        &self,
        renewed: allocator_api2::vec::Vec<Check, StoreAlloc>,
    ) -> Result<(), allocator_api2::vec::Vec<Check, StoreAlloc>> {
        if renewed.is_empty() {
            return Ok(());
        }
        let mut checks = self.checks.lock();
        if checks.is_empty() {
            *checks = renewed;
            return Ok(());
        }
        if checks.try_reserve(renewed.len()).is_err() {
            return Err(renewed);
        }
        checks.extend_from_slice(&renewed);
        Ok(())
    }

    /// True if a check is queued (false when called from user code that
    /// runs while this thread queues checks: it reads nothing then).
    pub(crate) fn has_checks(&self) -> bool {
        !self.checks.held_here() && !self.checks.lock().is_empty()
    }

    /// Calls `f` with the local index of every slot a queued check names,
    /// once each.
    /// Reads nothing when called from user code that runs while this thread
    /// queues checks (the store allocator, a logger): a count made there
    /// leaves those objects out instead of waiting for itself.
    pub(crate) fn for_each_check(&self, mut f: impl FnMut(u32)) {
        if self.checks.held_here() {
            return;
        }
        let mut locals: std::vec::Vec<u32> = self.checks.lock().iter().map(|check| check.local).collect();
        locals.sort_unstable();
        locals.dedup();
        locals.into_iter().for_each(&mut f);
    }

    /// Pushes an already linked chain `first ..= last` (whose last word is
    /// `last_word`) onto the dead stack `lane`.
    pub(crate) fn push_dead_chain(&self, lane: usize, first: u32, last_word: &AtomicU32) {
        let top = &self.dead_heads[lane];
        let mut head = top.load(Ordering::Relaxed);
        loop {
            last_word.store(LINK_FLAG | head, Ordering::Relaxed);
            // Release: publishes the links (and, through the counts' release
            // sequences, every use of the objects) to the collector.
            match top.compare_exchange_weak(head, first, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    /// Takes every dead stack whole, leaving them empty. An empty one is
    /// only read: a store with nothing to collect costs a collection no
    /// locked instruction.
    pub(crate) fn take_dead(&self) -> [u32; DEAD_LANES] {
        std::array::from_fn(|lane| {
            let top = &self.dead_heads[lane];
            // Acquire (both): the links of a chain pushed before are visible.
            if top.load(Ordering::Acquire) == NIL {
                NIL
            } else {
                top.swap(NIL, Ordering::Acquire)
            }
        })
    }

    /// The tops of the dead stacks, without taking them.
    pub(crate) fn peek_dead(&self) -> [u32; DEAD_LANES] {
        std::array::from_fn(|lane| self.dead_heads[lane].load(Ordering::Acquire))
    }

    pub(crate) fn set_segment_start(&self, segment: usize, start: u32) {
        self.segment_start[segment].store(start, Ordering::Relaxed);
    }

    /// The manager-wide index of the slot `local`, whose segment must be published.
    #[inline]
    pub(crate) fn global_index(&self, local: u32) -> u32 {
        let (segment, offset) = locate(local, self.base_bits);
        self.segment_start[segment].load(Ordering::Relaxed) + offset
    }
}
