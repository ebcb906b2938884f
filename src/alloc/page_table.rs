//! [`PageTable`]: a size-class pool's pages, with the two indexes that spare a thread
//! visiting every page when it looks for one it can use.

use std::sync::Arc;

use crate::sync::{AtomicU32, AtomicU64, Ordering};

use super::page::Page;

/// Every page of a [`SizeClassPool`](super::SizeClassPool), class after class, and two
/// hints about them:
///
/// - per class, how many of its pages no thread owns, so a thread looking for one to take
///   over skips the search when there is none;
/// - per page, a bit that says the page may hold blocks other threads freed, which a thread
///   that found no page of its own may claim (see [`hint_remote`](Self::hint_remote)).
///
/// Without them, a thread that allocates while another, idle thread owns every page of a
/// class visited all the class's pages three times per allocation: 8–13 µs a request with
/// 3,125 pages (see `BENCHMARKS.md`, thirty-sixth session).
///
/// # Invariants
///
/// - `unowned[c]` is the number of pages of class `c` whose owner is `UNOWNED`, counting a
///   page from just before its release until just after it is taken over: [`release`]
///   counts it before the page's `Release` store, and [`try_acquire`] uncounts it after
///   its `Acquire` compare-exchange, which reads that store. So the count never drops
///   below zero, and it reads zero only when no page of the class is unowned or one is
///   being released right now (a search may then miss it, as a search that passed the
///   page before its release would).
/// - A clear bit in `remote_hints` (or in `remote_words`, for a word of them) says
///   nothing: the page may still hold blocks freed remotely (frees made while the class
///   was under no pressure set no bit). A set bit says only that the page had some when it
///   was set. The hints are only a shortcut: the pool's last resort walks every page
///   before a request fails, and hints every page where it finds such a block.
///
/// [`release`]: Self::release
/// [`try_acquire`]: Self::try_acquire
pub(crate) struct PageTable {
    /// The pool holds the slice itself as well, for its hot paths (one load fewer).
    pages: Arc<[Page]>,
    unowned: Box<[Unowned]>,
    remote_hints: Box<[AtomicU64]>,
    /// Bit `w` is set when word `w` of `remote_hints` may have a bit set, so a claim skips
    /// the words without: one load finds the hinted pages among 4,096.
    remote_words: Box<[AtomicU64]>,
}

/// A class's count of unowned pages, on a cache line of its own: threads that take over
/// and give up pages of different classes do not contend for it.
#[repr(align(64))]
struct Unowned(AtomicU32);

impl PageTable {
    /// A table of `pages`, all unowned, whose classes are their [`Page::class`], each of
    /// `0..classes`.
    pub(crate) fn new(pages: Arc<[Page]>, classes: usize) -> PageTable {
        let mut unowned = vec![0u32; classes];
        for page in pages.iter() {
            unowned[page.class()] += 1;
        }
        PageTable {
            remote_hints: (0..pages.len().div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            remote_words: (0..pages.len().div_ceil(64 * 64)).map(|_| AtomicU64::new(0)).collect(),
            pages,
            unowned: unowned.into_iter().map(|n| Unowned(AtomicU32::new(n))).collect(),
        }
    }

    /// Whether some page of class `class` may be unowned (exact when no thread is taking
    /// over or giving up a page of it).
    #[inline]
    pub(crate) fn has_unowned(&self, class: usize) -> bool {
        self.unowned[class].0.load(Ordering::Relaxed) != 0
    }

    /// Takes page `p` if nobody owns it ([`Page::try_acquire`]).
    #[inline]
    pub(crate) fn try_acquire(&self, p: u32, token: u64) -> bool {
        let page = &self.pages[p as usize];
        if !page.try_acquire(token) {
            return false;
        }
        // After the compare-exchange that read the release's store: the release counted
        // the page before that store, so this never takes the count below zero.
        self.unowned[page.class()].0.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// Gives page `p` up ([`Page::release`]; its owner only).
    #[inline]
    pub(crate) fn release(&self, p: u32) {
        let page = &self.pages[p as usize];
        // Before the store: the next owner's compare-exchange reads it, so its decrement
        // comes after this increment (type invariants).
        self.unowned[page.class()].0.fetch_add(1, Ordering::Relaxed);
        page.release();
    }

    /// Marks page `p` as holding blocks freed remotely, in its word and in the summary.
    /// Loads first: the bits are usually set already, and loads keep the lines shared
    /// between freeing threads.
    #[inline]
    pub(crate) fn hint_remote(&self, p: u32) {
        let p = p as usize;
        set_bit(&self.remote_hints[p / 64], p % 64);
        set_bit(&self.remote_words[p / 64 / 64], p / 64 % 64);
    }

    /// Clears page `p`'s remote hint if `has_remote` says it has no such block left (after
    /// a claim took its last): the next claim then skips the page instead of visiting it.
    /// `has_remote` is asked again after the clearing, so a block freed meanwhile keeps its
    /// hint.
    #[inline]
    pub(crate) fn unhint_if_empty(&self, p: u32, has_remote: impl Fn() -> bool) {
        let p = p as usize;
        if has_remote() {
            return;
        }
        self.remote_hints[p / 64].fetch_and(!(1u64 << (p % 64)), Ordering::Relaxed);
        if has_remote() {
            set_bit(&self.remote_hints[p / 64], p % 64);
        }
    }

    /// Calls `claim` on each page of `pages` whose remote hint is set, in order, until it
    /// returns `Some`, and clears the hint of each page for which it returned `None` (and a
    /// word's summary bit once its pages have none). A free that races a clearing may find
    /// its bits still set and leave them: its block is then found by the pool's walk of
    /// every page, which sets them again.
    pub(crate) fn claim_hinted<R>(
        &self,
        pages: std::ops::Range<u32>,
        mut claim: impl FnMut(u32) -> Option<R>,
    ) -> Option<R> {
        let pages = pages.start as usize..pages.end as usize;
        let words = pages.start / 64..pages.end.div_ceil(64);
        for_set_bits(&self.remote_words, words, |w| {
            let word = &self.remote_hints[w];
            let found = for_set_bits(std::slice::from_ref(word), in_word(w, &pages), |b| {
                let found = claim((w * 64 + b) as u32);
                if found.is_none() {
                    word.fetch_and(!(1u64 << b), Ordering::Relaxed);
                }
                found
            });
            if found.is_none() && word.load(Ordering::Relaxed) == 0 {
                let summary = &self.remote_words[w / 64];
                summary.fetch_and(!(1u64 << (w % 64)), Ordering::Relaxed);
                // A page hinted since the load above keeps its word in the summary.
                if word.load(Ordering::Relaxed) != 0 {
                    set_bit(summary, w % 64);
                }
            }
            found
        })
    }
}

/// Sets bit `b` of `word` unless it is set already.
#[inline]
fn set_bit(word: &AtomicU64, b: usize) {
    if word.load(Ordering::Relaxed) & 1 << b == 0 {
        word.fetch_or(1 << b, Ordering::Relaxed);
    }
}

/// Bits `range` of word `w` (bit `i` of word `w` stands for `w * 64 + i`), as bits of that
/// word alone: the part of `range` in `w * 64..w * 64 + 64`, shifted down.
fn in_word(w: usize, range: &std::ops::Range<usize>) -> std::ops::Range<usize> {
    let base = w * 64;
    range.start.max(base) - base..range.end.min(base + 64) - base
}

/// Calls `visit` with the index of each bit set in `words` (bit `i` of word `w` is index
/// `w * 64 + i`) within `range`, in order, as each word reads when its turn comes, until
/// `visit` returns `Some`.
fn for_set_bits<R>(
    words: &[AtomicU64],
    range: std::ops::Range<usize>,
    mut visit: impl FnMut(usize) -> Option<R>,
) -> Option<R> {
    if range.is_empty() {
        return None;
    }
    let (first, end) = (range.start / 64, range.end.div_ceil(64));
    for (w, word) in words.iter().enumerate().take(end).skip(first) {
        let within = in_word(w, &range);
        let mask = (u64::MAX >> (64 - within.len())) << within.start;
        let mut bits = word.load(Ordering::Relaxed) & mask;
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(found) = visit(w * 64 + b) {
                return Some(found);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three pages of class 0, then 130 of class 1 (so class 1 spans three hint words).
    fn table() -> PageTable {
        let pages: Vec<Page> = (0..133).map(|p| Page::new(64, p * 512, 3, usize::from(p >= 3))).collect();
        PageTable::new(pages.into(), 2)
    }

    #[test]
    fn counts_unowned_pages_per_class() {
        let table = table();
        assert!(table.has_unowned(0) && table.has_unowned(1));
        for p in 0..3 {
            assert!(table.try_acquire(p, 7));
        }
        assert!(!table.try_acquire(1, 8), "owned");
        assert!(!table.has_unowned(0), "every page of class 0 is owned");
        assert!(table.has_unowned(1));
        table.release(2);
        assert!(table.has_unowned(0));
        assert!(table.try_acquire(2, 8));
        assert!(!table.has_unowned(0));
    }

    #[test]
    fn claims_from_hinted_pages_in_range_and_forgets_empty_ones() {
        let table = table();
        for p in [1, 3, 70, 131] {
            table.hint_remote(p);
        }
        let mut visited = Vec::new();
        // Class 1's pages only: page 1's hint is outside the range.
        let found = table.claim_hinted(3..133, |p| {
            visited.push(p);
            (p == 131).then_some(p)
        });
        assert_eq!(found, Some(131));
        assert_eq!(visited, [3, 70, 131]);
        // Pages 3 and 70 had nothing: their hints are gone; 131's and 1's stay. A claim
        // that finds nothing anywhere clears them all.
        let claim_nothing = |table: &PageTable| {
            let mut visited = Vec::new();
            assert_eq!(
                table.claim_hinted(0..133, |p| {
                    visited.push(p);
                    None::<()>
                }),
                None
            );
            visited
        };
        assert_eq!(claim_nothing(&table), [1, 131]);
        assert!(claim_nothing(&table).is_empty());
        assert_eq!(table.claim_hinted(5..5, |_| Some(())), None);
    }

    #[test]
    fn unhints_a_page_only_while_it_has_nothing_to_claim() {
        let table = table();
        let hinted = |table: &PageTable| {
            let mut visited = Vec::new();
            table.claim_hinted(0..133, |p| {
                visited.push(p);
                Some(())
            });
            visited
        };
        table.hint_remote(9);
        table.unhint_if_empty(9, || true);
        assert_eq!(hinted(&table), [9], "the page still has blocks to claim");
        table.unhint_if_empty(9, || false);
        assert!(hinted(&table).is_empty());
        // A block freed between the clearing and the second look keeps the hint.
        table.hint_remote(9);
        let looks = std::cell::Cell::new(0);
        table.unhint_if_empty(9, || {
            looks.set(looks.get() + 1);
            looks.get() > 1
        });
        assert_eq!(hinted(&table), [9]);
    }
}
