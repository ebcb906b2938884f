//! Slots held for loader threads: freed slots a collection hands to the
//! shard of each thread that creates through a [`Loader`](super::Loader).
//!
//! A pop of the store's shared free list reads the popped slot's link (a
//! miss: the collecting thread wrote it last) while it holds the list's
//! lock, so two loader threads creating all the time spent half their time
//! there, waiting for each other (see `BENCHMARKS.md`, O8). Instead, each
//! loader thread pops a chain of its own shard (one of [`SHARDS`], chosen by
//! the thread), under a lock no other thread takes unless two threads share
//! the shard: the miss on the slot's line is paid outside any lock the
//! other threads wait on. Only a thread whose shard is empty pops the free
//! list.
//!
//! **Who fills the chains.** Collection, which frees the slots, under `&mut
//! ObjectManager`. Each shard counts the creates its threads made since the
//! last collection (its *demand*). A collection starts by making twice that
//! the shard's *target* (at most [`SHARD_MAX`]), and then gives the shards
//! the slots it frees until each holds its target (every shard half of its
//! target first, so that the first does not take what the next needs),
//! before it keeps the rest for the owner thread (`owner_slots.rs`). It
//! decides where each slot goes as it frees it ([`Share`]), so no chain is
//! walked to split it. A thread that replaces the objects it made, as a job
//! system spawning entities does, thus finds in its shard what it will make
//! until the next collection, even in a frame that makes twice as many as
//! the last.
//!
//! **When they go back.** A collection first puts the chains of shards
//! whose threads made nothing since the last one back on the free list,
//! for every thread: a loader that went idle holds slots for one frame at
//! most. Shutdown puts every chain back. A store with a capacity below the
//! index space's holds nothing for any thread, as for the owner: held slots
//! would be slots another thread's `create` is refused.
//!
//! **Counts.** The held slots are below the store's `len` but vacant and
//! on no shared list, so every count that derives objects from `len`
//! subtracts [`LoaderSlots::held`], as it does the owner's.

use crate::sync::{thread_shard, AtomicBool, AtomicU32, Mutex, Ordering};

use super::owner_slots::Chain;

/// Shards of a store's loader slots (few under loom, to keep the models small).
#[cfg(not(loom))]
pub(crate) const SHARDS: usize = 8;
#[cfg(loom)]
pub(crate) const SHARDS: usize = 2;

/// The most slots a shard holds.
pub(crate) const SHARD_MAX: u32 = 1 << 16;

/// The slots held for a store's loader threads, a chain per shard.
///
/// # Invariants
///
/// - Each shard's `chain` is a chain of vacant slots of the store linked
///   through their words (`LINK_FLAG | next`; the last one's `next` is not
///   read), on no other list and in no other shard. A thread pops it only
///   under the shard's lock; a holder of `&mut ObjectManager` fills and
///   empties it, under the same lock.
/// - Each shard's `held` is its chain's length, stored under its lock.
/// - While a shard has demand, a target or slots, `active` is true (so a
///   collection that finds it false has nothing to do here). A loader sets
///   it under its shard's lock; a collection clears it before it looks at
///   the shards, and sets it again if one still needs it.
/// - A shard that holds slots has a target (a collection gives back the
///   chain of a shard whose target it sets to zero).
/// - Nothing is held, ever, unless `holds`.
#[derive(Debug)]
pub(crate) struct LoaderSlots {
    holds: bool,
    active: AtomicBool,
    shards: [Shard; SHARDS],
}

/// One shard, alone on its cache line (two lines: the adjacent-line
/// prefetcher pairs them).
#[derive(Debug)]
#[repr(align(128))]
struct Shard {
    state: Mutex<ShardState>,
    held: AtomicU32,
}

#[derive(Debug)]
struct ShardState {
    chain: Chain,
    /// Creates through a loader on this shard's threads since the last
    /// collection began.
    demand: u32,
    /// How many slots collections give the shard, at most: twice the
    /// demand the last collection found.
    target: u32,
}

impl LoaderSlots {
    /// Nothing held, and nothing ever if not `holds` (see the module docs).
    pub(crate) fn new(holds: bool) -> Self {
        LoaderSlots {
            holds,
            active: AtomicBool::new(false),
            shards: std::array::from_fn(|_| Shard {
                state: Mutex::new(ShardState { chain: Chain::EMPTY, demand: 0, target: 0 }),
                held: AtomicU32::new(0),
            }),
        }
    }

    /// Slots held in every shard (not objects).
    pub(crate) fn held(&self) -> u32 {
        self.shards.iter().map(|shard| shard.held.load(Ordering::Relaxed)).sum()
    }

    /// The first slot of the calling thread's shard, if it holds one, with
    /// what `read` found there. `read` loads a held slot's link (and may
    /// return its address with it). Counts a create of the shard's either
    /// way.
    #[inline]
    pub(crate) fn take<R>(&self, read: impl FnOnce(u32) -> (u32, R)) -> Option<(u32, R)> {
        if !self.holds {
            return None;
        }
        let shard = &self.shards[thread_shard(SHARDS)];
        let mut state = shard.state.lock();
        state.demand = state.demand.saturating_add(1);
        let Chain { head, tail, len } = state.chain;
        if len == 0 {
            // Under the lock, so that a collection clearing the flag sees
            // this demand or leaves the flag set (invariants).
            if !self.active.load(Ordering::Relaxed) {
                self.active.store(true, Ordering::Relaxed);
            }
            return None;
        }
        let (next, found) = read(head);
        state.chain = if len == 1 { Chain::EMPTY } else { Chain { head: next, tail, len: len - 1 } };
        shard.held.store(len - 1, Ordering::Relaxed);
        Some((head, found))
    }

    /// Starts a collection: sets each shard's target from its demand, and
    /// the chains of shards whose threads made nothing since the last
    /// collection go to `give_back` (for the free list).
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of the store's manager.
    pub(crate) unsafe fn begin_collection(&self, mut give_back: impl FnMut(Chain)) {
        if !self.active.load(Ordering::Relaxed) {
            return;
        }
        self.active.store(false, Ordering::Relaxed);
        for shard in &self.shards {
            let mut state = shard.state.lock();
            state.target = std::mem::take(&mut state.demand).saturating_mul(2).min(SHARD_MAX);
            let idle = if state.target == 0 { std::mem::replace(&mut state.chain, Chain::EMPTY) } else { Chain::EMPTY };
            if idle.len > 0 {
                shard.held.store(0, Ordering::Relaxed);
            }
            if state.target > 0 {
                self.active.store(true, Ordering::Relaxed);
            }
            drop(state);
            if idle.len > 0 {
                give_back(idle);
            }
        }
    }

    /// What the shards want of the slots a collection frees from now on:
    /// each up to half its target first, then up to the whole (so that the
    /// first does not take what the next needs for its next frame).
    pub(crate) fn share(&self) -> Share {
        let mut share = Share { wants: [0; 2 * SHARDS], step: 2 * SHARDS, chains: [Chain::EMPTY; SHARDS] };
        if !self.holds || !self.active.load(Ordering::Relaxed) {
            return share;
        }
        for (i, shard) in self.shards.iter().enumerate() {
            let state = shard.state.lock();
            let half = (state.target / 2).saturating_sub(state.chain.len);
            share.wants[i] = half;
            share.wants[SHARDS + i] = state.target.saturating_sub(state.chain.len + half);
        }
        share.step = 0;
        share
    }

    /// Puts the chains of `share` in front of their shards' chains.
    /// `link(tail, head)` links a chain's last slot to another's first.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of the store's manager, and
    /// `share`'s chains hold vacant slots of the store on no list.
    pub(crate) unsafe fn take_share(&self, share: &Share, link: impl Fn(u32, u32)) {
        for (shard, &given) in self.shards.iter().zip(&share.chains) {
            if given.len == 0 {
                continue;
            }
            let mut state = shard.state.lock();
            state.chain = given.then(state.chain, &link);
            shard.held.store(state.chain.len, Ordering::Relaxed);
        }
    }

    /// Empties every shard into `give_back` (shutdown).
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of the store's manager.
    pub(crate) unsafe fn release_all(&self, mut give_back: impl FnMut(Chain)) {
        self.active.store(false, Ordering::Relaxed);
        for shard in &self.shards {
            let mut state = shard.state.lock();
            let chain = std::mem::replace(&mut state.chain, Chain::EMPTY);
            (state.demand, state.target) = (0, 0);
            shard.held.store(0, Ordering::Relaxed);
            drop(state);
            give_back(chain);
        }
    }
}

/// Where the slots one collection frees go, decided as each is freed so
/// that no chain is walked to split it: to the loader shards' chains while
/// they want slots (see [`LoaderSlots::share`]), then to the caller's.
#[derive(Debug)]
pub(crate) struct Share {
    /// Slots still wanted at each step; step `i` fills shard `i % SHARDS`.
    wants: [u32; 2 * SHARDS],
    /// The first step that may still want slots.
    step: usize,
    /// What each shard was given (see [`LoaderSlots::take_share`]).
    chains: [Chain; SHARDS],
}

impl Share {
    /// The shard chain the next freed slot goes on, or `None` when no shard
    /// wants more.
    #[inline]
    pub(crate) fn next(&mut self) -> Option<&mut Chain> {
        while self.step < 2 * SHARDS {
            if self.wants[self.step] > 0 {
                self.wants[self.step] -= 1;
                return Some(&mut self.chains[self.step % SHARDS]);
            }
            self.step += 1;
        }
        None
    }

    /// True if a shard was given slots.
    pub(crate) fn gives(&self) -> bool {
        self.chains.iter().any(|chain| chain.len > 0)
    }
}
