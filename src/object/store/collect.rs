//! Collection: destroying a store's dead objects, and what it does with
//! their slots.
//!
//! The dead wait on the store's dead lanes (`shared.rs`); collection takes
//! them under `&mut ObjectManager` and walks the lanes side by side (see
//! [`Store::collect`]), destroys each object through one per-object step
//! shared with `release_many` ([`Store::destroy_dead`]), and keeps the freed
//! slots for the owner thread's creates (`owner_slots.rs`). A guard
//! ([`Requeue`]) finishes a collection that a panicking `Drop` interrupts.

use crate::sync::Ordering;

use super::super::loader_slots::Share;
use super::super::owner_counts::Decided;
use super::super::owner_slots::Chain;
use super::super::shared::DEAD_LANES;
use super::super::slot::{Slot, GENERATION_LIMIT, LINK_FLAG, NIL};
use super::super::{CollectStats, Destroyed, MMObject};
use super::{DestroyHook, Store};

impl<T: MMObject> Store<T> {
    /// Hands the slots a collection (or `release_many`) freed for the
    /// loader threads' shards to them (see `loader_slots.rs`), and adds the
    /// rest, `freed`, to those kept for the owner's `create`s (see
    /// `owner_slots.rs`).
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of this store's manager, and
    /// `freed` and `share`'s chains hold vacant slots on no list.
    unsafe fn keep_freed(&self, freed: Chain, share: &Share) {
        if share.gives() {
            // SAFETY: the caller's contract.
            unsafe { self.loader_slots.take_share(share, |tail, head| self.link(tail, head)) };
        }
        if freed.len == 0 {
            return;
        }
        if !self.owner_slots.holds() {
            // A capped store: every thread's `create` must find them.
            self.push_free_chain(freed);
            return;
        }
        // SAFETY: the caller's contract.
        let kept = unsafe { self.owner_slots.kept() };
        let chain = freed.then(kept, |tail, head| self.link(tail, head));
        // SAFETY: the caller's contract; `chain` links the freed slots, then the kept ones.
        unsafe { self.owner_slots.set_kept(chain) };
    }

    /// Starts a `collect_garbage` call: the slots the last one kept for the
    /// owner that it did not use go on the free list, for every thread.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of this store's manager.
    pub(super) unsafe fn share_unused_kept(&self) {
        // SAFETY: the caller's contract; the old chain goes on the free list.
        let unused = unsafe { self.owner_slots.set_kept(Chain::EMPTY) };
        self.push_free_chain(unused);
    }

    /// Starts a `collect_garbage` call: the slots held for loader threads
    /// that made nothing since the last collection began go on the free
    /// list, for every thread (see `loader_slots.rs`).
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of this store's manager.
    pub(super) unsafe fn share_idle_loader_slots(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.loader_slots.begin_collection(|chain| self.push_free_chain(chain)) };
    }

    /// Links slot `tail` (vacant, at the end of a chain) to slot `head`.
    fn link(&self, tail: u32, head: u32) {
        let tail = self.slot(tail).expect("chained slots live in published segments");
        tail.header.word.store(LINK_FLAG | head, Ordering::Relaxed);
    }

    /// Objects on the dead list, counted by walking it, and those whose
    /// queued check finds them dead (see `owner_counts.rs`): O(dead +
    /// checks), after every thread's last drops are drained.
    pub(crate) fn dead_count(&self) -> usize {
        self.dead_count_read(true)
    }

    /// [`dead_count`](Self::dead_count), taking an object whose count is all
    /// the owner's reservation for dead only if `reads_reservations` (as the
    /// owner thread does); else only once the owner marked it `PENDING`, as
    /// iterators on other threads do (see `SlotHeader::is_referenced`).
    pub(crate) fn dead_count_read(&self, reads_reservations: bool) -> usize {
        super::super::last_drops::drain_all();
        let mut count = 0;
        self.shared().for_each_check(|local| {
            if self.slot(local).is_some_and(|slot| slot.header.awaits_check(reads_reservations)) {
                count += 1;
            }
        });
        for head in self.shared().peek_dead() {
            self.walk_chain(head, |_, _| count += 1);
        }
        count
    }

    /// Calls `f` with each slot of the chain from `at`, linked through the
    /// slots' words (a dead or free list), in order.
    pub(super) fn walk_chain<'s>(&'s self, mut at: u32, mut f: impl FnMut(u32, &'s Slot<T>)) {
        while at != NIL {
            let slot = self.slot(at).expect("listed slots live in published segments");
            f(at, slot);
            at = slot.header.word.load(Ordering::Acquire) & !LINK_FLAG;
        }
    }

    /// Destroys dead objects until the dead list is empty or `budget` runs out,
    /// recording each in `events` if given. Returns how many it destroyed.
    /// It decides the queued checks first; `ends_unused` only in the first
    /// round of a collection (see [`decide_checks`](Self::decide_checks)).
    ///
    /// If a `Drop`, `size()` or the destroy hook panics, that object is
    /// destroyed all the same (its value counts as dropped, as after any
    /// panicking drop), the rest of the chain goes back onto the dead list,
    /// and then the panic propagates.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of this store's manager: no
    /// reference into any of its values is alive, and no `create` through the
    /// manager runs (loaders may).
    pub(crate) unsafe fn collect(
        &self,
        ends_unused: bool,
        budget: &mut usize,
        stats: &mut CollectStats,
        mut events: Option<&mut std::vec::Vec<Destroyed>>,
    ) -> usize {
        self.note_peak();
        // No iterator is alive under `&mut ObjectManager` (invariants).
        self.iterating.store(0, Ordering::Relaxed);
        // The collecting thread becomes the owner (see `owner_slots.rs`).
        if !self.owner_slots.is_owner() {
            // SAFETY: the caller holds `&mut ObjectManager`.
            unsafe { self.release_owner_slots(true) };
        }
        self.decide_checks(ends_unused);
        if *budget == 0 {
            return 0;
        }
        let heads = self.shared().take_dead();
        if heads == [NIL; DEAD_LANES] {
            return 0;
        }
        // Only deaths leave stale candidate entries, so only a store with
        // dead objects compacts its buffer: amortised O(1) per entry (see
        // `candidates.rs`), and nothing for a store with nothing to collect.
        super::super::candidates::compact(self);
        let mut hook = self.on_destroy.lock();
        let mut requeue = Requeue::new(self, heads);
        // The budget and the counts in locals, so that the loop keeps them in
        // registers (the caller's are behind references), and the loop
        // unswitched on what most collections have none of: a hook, events
        // to record and a tracker to credit (a dozen instructions per object).
        let mut left = *budget;
        let mut bytes = 0;
        if self.destroys_plainly(&hook, &events) {
            // SAFETY: the caller's contract; none of the three is there.
            unsafe { self.collect_lanes::<true>(&mut requeue, &mut hook, &mut events, &mut left, &mut bytes) };
        } else {
            // SAFETY: the caller's contract.
            unsafe { self.collect_lanes::<false>(&mut requeue, &mut hook, &mut events, &mut left, &mut bytes) };
        }
        *budget = left;
        // Each step counts its object in `destroyed`.
        let destroyed = requeue.freed.destroyed as usize;
        stats.objects += destroyed;
        stats.bytes = stats.bytes.saturating_add(bytes);
        destroyed
    }

    /// True if there is no destroy hook (`hook`, held locked), no `events`
    /// to record and no tracker: a collection's and `release_many`'s steps
    /// then leave out their tests (`destroy_dead`'s `PLAIN`).
    #[inline]
    pub(super) fn destroys_plainly(&self, hook: &Option<DestroyHook<T>>, events: &Option<&mut Vec<Destroyed>>) -> bool {
        hook.is_none() && events.is_none() && self.tracking.is_none()
    }

    /// The walk of [`collect`](Self::collect) over the dead lanes taken in
    /// `requeue`, until they are empty or `budget` runs out. `PLAIN`: there
    /// is no hook, no events and no tracker (`destroy_dead` then skips them).
    ///
    /// # Safety
    ///
    /// As for `collect`, and with `PLAIN`, `hook` and `events` are `None`
    /// and the store has no tracker.
    #[inline(always)]
    unsafe fn collect_lanes<const PLAIN: bool>(
        &self,
        requeue: &mut Requeue<'_, T>,
        hook: &mut Option<DestroyHook<T>>,
        events: &mut Option<&mut std::vec::Vec<Destroyed>>,
        budget: &mut usize,
        bytes: &mut usize,
    ) {
        // One slot of each lane in turn while two or more have slots left:
        // the lanes' links are independent loads, so the CPU waits for one
        // of each at once (see `shared.rs`).
        let mut steps = [NeighbourStep::new(self); DEAD_LANES];
        while *budget > 0 && requeue.rest.iter().filter(|&&rest| rest != NIL).count() > 1 {
            for (lane, step) in steps.iter_mut().enumerate() {
                if requeue.rest[lane] == NIL || *budget == 0 {
                    continue;
                }
                *budget -= 1;
                // SAFETY: the caller's contract; `lane` has slots left.
                unsafe { self.collect_next::<PLAIN>(lane, step, requeue, hook, events, bytes) };
            }
        }
        // Then the last lane alone (a level's unload, released in index
        // order, is one run of neighbours in one lane).
        if let Some(lane) = requeue.rest.iter().position(|&rest| rest != NIL) {
            let mut step = steps[lane];
            // A budget above any store's slot count (local indices are
            // `u32`) cannot run out here (`collect_garbage`'s is
            // `usize::MAX`): it is not counted down per object, only by what
            // was destroyed, once, after.
            if *budget > u32::MAX as usize {
                let before = requeue.freed.destroyed;
                while requeue.rest[lane] != NIL {
                    // SAFETY: as above.
                    unsafe { self.collect_next::<PLAIN>(lane, &mut step, requeue, hook, events, bytes) };
                }
                *budget -= (requeue.freed.destroyed - before) as usize;
            } else {
                while requeue.rest[lane] != NIL && *budget > 0 {
                    *budget -= 1;
                    // SAFETY: as above.
                    unsafe { self.collect_next::<PLAIN>(lane, &mut step, requeue, hook, events, bytes) };
                }
            }
        }
    }

    /// Destroys the next dead object of `lane` (reached through `step`),
    /// and returns the slot after it in that lane.
    ///
    /// # Safety
    ///
    /// As for [`destroy_dead`](Self::destroy_dead), for the slot
    /// `requeue.rest[lane]`, which is not [`NIL`].
    #[inline(always)]
    unsafe fn collect_next<const PLAIN: bool>(
        &self,
        lane: usize,
        step: &mut NeighbourStep<'_, T>,
        requeue: &mut Requeue<'_, T>,
        hook: &mut Option<DestroyHook<T>>,
        events: &mut Option<&mut Vec<Destroyed>>,
        bytes: &mut usize,
    ) -> u32 {
        let local = requeue.rest[lane];
        // SAFETY: a slot on a dead lane was handed out by this store.
        let slot = unsafe { step.slot(local) };
        let next = slot.header.word.load(Ordering::Relaxed) & !LINK_FLAG;
        requeue.rest[lane] = next;
        // SAFETY: a slot taken off the dead list holds a dead object that
        // nothing references; the caller holds `&mut ObjectManager`.
        unsafe { self.destroy_dead::<PLAIN>(local, slot, requeue, hook, events.as_deref_mut(), bytes) };
        next
    }

    /// Destroys the dead object in slot `local`: its `size()` and the destroy
    /// hook, its event, the slot freed into `requeue`'s chain, its value
    /// dropped, its tracker charge credited. `PLAIN`: there is no hook, no
    /// events and no tracker, and the tests for them are left out.
    ///
    /// If `size()`, the hook or the value's `Drop` panics, the object is
    /// destroyed all the same (its value counts as dropped, as after any
    /// panicking drop) and the panic propagates; `requeue` finishes the rest
    /// as it drops.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of this store's manager, and the
    /// slot holds a dead object (occupied, its count gone, on no list) that
    /// nothing references. With `PLAIN`, `hook` and `events` are `None` and
    /// the store has no tracker.
    #[inline(always)]
    pub(super) unsafe fn destroy_dead<const PLAIN: bool>(
        &self,
        local: u32,
        slot: &Slot<T>,
        requeue: &mut Requeue<'_, T>,
        hook: &mut Option<DestroyHook<T>>,
        events: Option<&mut Vec<Destroyed>>,
        bytes: &mut usize,
    ) {
        debug_assert!(!PLAIN || self.destroys_plainly(hook, &events), "a plain step has nothing to skip");
        // Only the hook and the events name the object (an atomic load is not
        // left out when unused, so a plain step does not make it).
        let generation = if PLAIN { 0 } else { slot.header.generation(Ordering::Relaxed) };
        // A panicking `size()` or hook must not keep the object queued
        // forever (every later collection, and shutdown, would stop at
        // it): destroy the object first, then let the panic propagate.
        let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: a dead slot is still occupied, and the caller's
            // `&mut ObjectManager` excludes every other reference to it.
            let value = unsafe { slot.value_mut() };
            let bytes = value.size();
            if let Some(hook) = hook.as_mut().filter(|_| !PLAIN) {
                hook(self.key_of(local, generation), value);
                // The hook may have created objects (through a `Loader`) while this
                // one is still resident: the peak must see both.
                self.note_peak();
            }
            bytes
        }));
        if let Some(events) = events.filter(|_| !PLAIN) {
            events.push(Destroyed::new::<T>(self.key_of(local, generation)));
        }
        requeue.freed.destroyed += 1;
        if self.free_slot(slot) {
            requeue.push_freed(local, slot);
        }
        // Credited before the value drops: a panicking `Drop` still destroys
        // the object, so its charge must not stay on the tag.
        if let Some(tracking) = self.tracking.as_ref().filter(|_| !PLAIN) {
            tracking.release(local);
        }
        // SAFETY: the slot was occupied (its value initialised) and is now
        // vacant and unreachable from any handle; the value is dropped
        // exactly once, here.
        unsafe { slot.drop_value() };
        match seen {
            Ok(size) => *bytes = bytes.saturating_add(size),
            Err(payload) => std::panic::resume_unwind(payload),
        }
    }

    /// Decides the queued checks (see `owner_counts.rs`): the leases the
    /// owner used since the previous collection stay (their checks are
    /// queued again), the other reservations go back to the words, and the
    /// objects that leaves dead go onto the dead lanes, one chain per lane.
    /// On another thread than the owner the reservations cannot be given
    /// back (the owner may be using them), so the checks stay queued for
    /// the owner.
    ///
    /// `ends_unused`: the collection's first look, which also ends the
    /// leases the owner did not use since the previous collection (and
    /// clears `USED` on those it renews). Its later rounds pass false: they
    /// look only for objects that died meanwhile (see
    /// `SlotHeader::decide_check`).
    ///
    /// The caller holds `&mut ObjectManager` (as for [`collect`](Self::collect)).
    pub(super) fn decide_checks(&self, ends_unused: bool) {
        let shared = self.shared();
        if !self.reads_reservations_here() {
            // The flag first: a collection here need not lock the queue once it warned.
            if !shared.warned_not_owner.load(std::sync::atomic::Ordering::Relaxed)
                && shared.has_checks()
                && !shared.warned_not_owner.swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                log::warn!(
                    target: "mmobject",
                    "collect_garbage ran on a thread that does not own object manager #{}: released {} objects \
                     wait for a collection on the thread that built it, or for shutdown \
                     (see ObjectManagerBuilder::owner_thread)",
                    self.config.manager_id,
                    T::TYPE_NAME
                );
            }
            return;
        }
        let mut checks = shared.take_checks();
        let mut dead = DeadChains::default();
        // Compacted in place (the renewed checks move down), so requeueing
        // them allocates nothing.
        let mut renewed = 0;
        for at in 0..checks.len() {
            let check = checks[at];
            let slot = self.slot(check.local).expect("checked slots live in published segments");
            match slot.header.decide_check(check, ends_unused) {
                Decided::Renewed => {
                    checks[renewed] = check;
                    renewed += 1;
                }
                Decided::Ended => {}
                Decided::Dead => dead.push(check.local, slot),
            }
        }
        checks.truncate(renewed);
        if let Err(renewed) = shared.requeue_checks(checks) {
            // No room to keep them queued: these leases end now instead.
            for check in renewed {
                let slot = self.slot(check.local).expect("checked slots live in published segments");
                if slot.header.give_back() {
                    dead.push(check.local, slot);
                }
            }
        }
        self.push_dead_chains(dead);
    }

    /// Shutdown's settling, on the owner thread (the caller holds `&mut
    /// ObjectManager`, after `destroy_all`): gives back every reservation,
    /// queued check or not (one lost to a store allocator with no room or
    /// that panicked among them), and lists the objects that leaves dead,
    /// those destroyed in place included. O(slots), as `destroy_all` is,
    /// and as `destroy_all` skips the pass when no slot holds an object:
    /// free, retired, held and returned slots are vacant, and a vacant
    /// slot keeps no reservation (`free_slot` clears it). After an unload
    /// that collected, that pass over 100k cold slots was most of an owned
    /// manager's drop. Debug builds make the pass and check it found nothing.
    pub(super) fn give_back_all(&self) {
        self.shared().take_checks();
        let empty = self.resident() + self.destroyed_in_place.load(Ordering::Relaxed) == 0;
        if empty && !cfg!(debug_assertions) {
            return;
        }
        let mut dead = DeadChains::default();
        let mut given_back = 0usize;
        self.for_each_slot(|local, slot| {
            if cfg!(debug_assertions) {
                given_back += usize::from(slot.header.reserve.load(Ordering::Relaxed) != 0);
            }
            if slot.header.give_back() {
                dead.push(local, slot);
            }
        });
        debug_assert!(!empty || given_back == 0, "no slot held an object, but {given_back} kept a reservation");
        self.push_dead_chains(dead);
    }

    /// Pushes each lane's chain onto the store's dead lane of that number.
    fn push_dead_chains(&self, dead: DeadChains) {
        let shared = self.shared();
        for (lane, dead) in dead.lanes.iter().enumerate() {
            if dead.chain.len != 0 {
                let tail = self.slot(dead.chain.tail).expect("checked slots live in published segments");
                shared.push_dead_chain(lane, dead.chain.head, &tail.header.word);
            }
        }
    }

    /// Marks a dead slot vacant. Returns false if the slot retired instead
    /// (its next occupied generation would reach [`GENERATION_LIMIT`]): it
    /// then stays vacant for good, and must not go on the free list.
    #[inline]
    fn free_slot(&self, slot: &Slot<T>) -> bool {
        let generation = slot.header.generation(Ordering::Relaxed) + 1;
        debug_assert!(generation & 1 == 0, "freeing an occupied slot makes it vacant");
        debug_assert!(generation <= GENERATION_LIMIT, "generations never pass the limit");
        // A lease spent by clones leaves `LEASED` on an object that died
        // elsewhere (its check, about this generation, decides nothing): the
        // next object starts with no reservation. No handle is left and the
        // caller holds `&mut ObjectManager`, so the owner cannot touch it now.
        slot.header.reserve.store(0, Ordering::Relaxed);
        slot.header.generation.store(generation, Ordering::Release);
        if generation >= GENERATION_LIMIT {
            self.retire(slot);
            return false;
        }
        true
    }
}

/// Slots linked through their header words, to be put on a list at once:
/// those one collection freed (the free list: one lock, not one per slot),
/// or those whose checks it found dead (the dead list: one push).
pub(super) struct SlotChain {
    pub(super) chain: Chain,
    /// Objects destroyed, retired slots included: added to `destroyed` at the
    /// end (one add per collection, not a locked add per slot, which would
    /// wait for the stores to each cold slot to drain).
    pub(super) destroyed: u64,
}

impl Default for SlotChain {
    fn default() -> Self {
        SlotChain { chain: Chain::EMPTY, destroyed: 0 }
    }
}

impl SlotChain {
    /// Links the slot `local` in front of the chain.
    pub(super) fn push<T>(&mut self, local: u32, slot: &Slot<T>) {
        push_front(&mut self.chain, local, slot);
    }
}

/// Links the vacant slot `local` in front of `chain`.
fn push_front<T>(chain: &mut Chain, local: u32, slot: &Slot<T>) {
    slot.header.word.store(LINK_FLAG | chain.head, Ordering::Relaxed);
    if chain.len == 0 {
        chain.tail = local;
    }
    chain.head = local;
    chain.len += 1;
}

/// The objects a collection's checks (or shutdown's give-back) found dead,
/// one chain per dead lane, filled in turn so that collection walks them
/// side by side.
#[derive(Default)]
struct DeadChains {
    lanes: [SlotChain; DEAD_LANES],
    found: usize,
}

impl DeadChains {
    fn push<T>(&mut self, local: u32, slot: &Slot<T>) {
        self.lanes[self.found % DEAD_LANES].push(local, slot);
        self.found += 1;
    }
}

/// Finishes a collection, also when it unwinds: keeps the chain of freed
/// slots, and puts the unprocessed part of each dead lane back. No object is
/// half destroyed when it does: a panic in `size()` or the destroy hook is
/// caught in `destroy_dead`, which destroys the object before it goes on, and
/// a value's `Drop` runs once its slot is freed.
pub(super) struct Requeue<'a, T: MMObject> {
    pub(super) store: &'a Store<T>,
    /// The next dead slot to process in each lane.
    pub(super) rest: [u32; DEAD_LANES],
    /// The freed slots the loader threads' shards take first.
    share: Share,
    /// The rest, for the owner.
    pub(super) freed: SlotChain,
}

impl<'a, T: MMObject> Requeue<'a, T> {
    /// A requeue of the dead lanes from `rest` on, which has freed nothing yet.
    pub(super) fn new(store: &'a Store<T>, rest: [u32; DEAD_LANES]) -> Self {
        Requeue { store, rest, share: store.loader_slots.share(), freed: SlotChain::default() }
    }

    /// Takes the vacant slot `local`, just freed.
    #[inline]
    fn push_freed(&mut self, local: u32, slot: &Slot<T>) {
        match self.share.next() {
            Some(chain) => push_front(chain, local, slot),
            None => self.freed.push(local, slot),
        }
    }
}

impl<T: MMObject> Drop for Requeue<'_, T> {
    fn drop(&mut self) {
        self.store.destroyed.fetch_add(self.freed.destroyed, Ordering::Relaxed);
        // SAFETY: a `Requeue` is only made under `&mut ObjectManager`
        // (collection, `release_many`), and its chains hold the slots it freed.
        unsafe { self.store.keep_freed(self.freed.chain, &self.share) };
        let shared = self.store.shared();
        for (lane, &rest) in self.rest.iter().enumerate() {
            let mut last = None;
            self.store.walk_chain(rest, |_, slot| last = Some(&slot.header.word));
            if let Some(word) = last {
                shared.push_dead_chain(lane, rest, word);
            }
        }
    }
}

/// The way from one slot of a dead lane to the next: a lane holds runs of
/// neighbours, newest first (slots released in index order, as when a level
/// unloads, come back descending), and stepping to the previous slot's
/// address, instead of computing it from the index just loaded, lets the
/// CPU load the next link before this one arrives.
///
/// Invariant: while `below_len` is non-zero, `below_ptr` is slot `below` of
/// `store`, whose header was written.
struct NeighbourStep<'s, T> {
    store: &'s Store<T>,
    /// The slot before the last one, its address, and how many slots lie
    /// contiguously up to it (the address is used only while that is non-zero).
    below: u32,
    below_ptr: *const Slot<T>,
    below_len: u32,
}

impl<T> Clone for NeighbourStep<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for NeighbourStep<'_, T> {}

impl<'s, T: MMObject> NeighbourStep<'s, T> {
    fn new(store: &'s Store<T>) -> Self {
        NeighbourStep { store, below: NIL, below_ptr: std::ptr::null(), below_len: 0 }
    }

    /// Slot `local` of the store, on a dead lane.
    ///
    /// # Safety
    ///
    /// The store handed slot `local` out (as it did every slot on its
    /// lists), so its header was written.
    #[inline]
    unsafe fn slot(&mut self, local: u32) -> &'s Slot<T> {
        let slot_ptr = if local == self.below && self.below_len != 0 {
            self.below_ptr
        } else {
            // SAFETY: the caller's contract.
            let (slot, len) =
                unsafe { self.store.slot_run_back(local) }.expect("dead slots live in published segments");
            self.below_len = len;
            slot.as_ptr().cast_const()
        };
        self.below = local.wrapping_sub(1);
        self.below_len -= 1;
        self.below_ptr = slot_ptr.wrapping_sub(1);
        // SAFETY: `slot_ptr` is slot `local` of the store, whose header was
        // written (from `slot_run_back` and the caller's contract, or the
        // type's invariant), in a published segment, which lives as long as
        // the store.
        unsafe { &*slot_ptr }
    }
}
