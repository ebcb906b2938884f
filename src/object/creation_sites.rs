//! A store's creation sites: each `file:line` that created one of its
//! objects, numbered, so a slot keeps a 4-byte number instead of an 8-byte
//! pointer (its header then holds the owner thread's reservation, see
//! `owner_counts.rs`, and stays 16 bytes).
//!
//! The first [`FAST`] sites live in a small open-addressed table, where a
//! site's number is its position: `create` finds it by the `Location`'s
//! address with a hash and, nearly always, one load of a cached line, and
//! takes no lock. Rust does not promise one address per call site (Miri
//! makes a new `Location` on every call), so a site whose address is not in
//! the table is looked for by its contents before it is given a number: a
//! new one is claimed with one compare-exchange, and sites past those the
//! table holds (a type created in very many places) are numbered in a
//! locked map. Reports read the sites back by number.

use std::panic::Location;
use std::ptr;

use allocator_api2::vec::Vec;
use hashbrown::{DefaultHashBuilder, HashMap};

// `std`'s atomics even under loom: the table is no part of a modelled
// protocol (only that a site keeps its number is), and its searches would
// otherwise multiply the states of every loom model that creates objects.
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::Error;

use super::reentry::NamedMutex;
use super::store_alloc::StoreAlloc;

/// Sites numbered without a lock.
pub(crate) const FAST: usize = 1 << 6;

/// The number of a site that has none: the store's allocator refused room
/// for it. Reports show such objects' site as unknown.
pub(crate) const UNNUMBERED: u32 = u32::MAX;

/// Entries a search of the fast table looks at before the site goes to the
/// locked map: the table stays sparse for most types, so searches are short.
const MAX_PROBES: usize = 8;

/// The numbered sites of one store.
///
/// # Invariants
///
/// - `fast` holds [`FAST`] entries. Each is null or a `&'static Location`,
///   set once (null to the site) and never changed again; its number is its
///   position.
/// - `more` numbers other sites from [`FAST`] up: `more.1[n - FAST]` is the
///   site numbered `n`, and `more.0` maps each site's contents (file, line,
///   column) to its number.
/// - Two numbers may name equal sites (two threads numbering copies of one
///   site at once): reports show the same `file:line` for both.
pub(crate) struct CreationSites {
    fast: Vec<AtomicPtr<Location<'static>>, StoreAlloc>,
    more: NamedMutex<More>,
}

type More = (HashMap<SiteKey, u32, DefaultHashBuilder, StoreAlloc>, Vec<&'static Location<'static>, StoreAlloc>);

/// A site's contents, as the locked map keys it.
type SiteKey = (&'static str, u32, u32);

fn key(site: &'static Location<'static>) -> SiteKey {
    (site.file(), site.line(), site.column())
}

impl CreationSites {
    /// An empty table, in `alloc`.
    pub(crate) fn new(alloc: StoreAlloc, type_name: &'static str) -> Result<Self, Error> {
        let mut fast = Vec::new_in(alloc.clone());
        if fast.try_reserve_exact(FAST).is_err() {
            return Err(Error::StoreOutOfMemory {
                type_name,
                part: "its creation-site table",
                bytes: FAST * std::mem::size_of::<AtomicPtr<Location<'static>>>(),
                allocator: alloc.name(),
            });
        }
        fast.extend((0..FAST).map(|_| AtomicPtr::new(ptr::null_mut())));
        let more = (HashMap::with_hasher_in(DefaultHashBuilder::default(), alloc.clone()), Vec::new_in(alloc));
        Ok(CreationSites { fast, more: NamedMutex::new(more, "numbering a creation site of", type_name) })
    }

    /// The number of `site`, given one if it has none yet; [`UNNUMBERED`]
    /// only if the store's allocator refuses room for a new site's number.
    ///
    /// Inline, only the site's home entry, where nearly every `create` finds
    /// it; the search past it is out of line.
    #[inline]
    pub(crate) fn number(&self, site: &'static Location<'static>) -> u32 {
        let wanted = ptr::from_ref(site).cast_mut();
        let at = home(wanted);
        // SAFETY: `home` is below `FAST`, the table's length (invariants).
        if unsafe { self.fast.get_unchecked(at) }.load(Ordering::Acquire) == wanted {
            return at as u32;
        }
        self.number_searching(site, at).unwrap_or(UNNUMBERED)
    }

    /// [`number`](Self::number) for a site not in its home entry.
    #[cold]
    #[inline(never)]
    fn number_searching(&self, site: &'static Location<'static>, mut at: usize) -> Option<u32> {
        let wanted = ptr::from_ref(site).cast_mut();
        for _ in 0..MAX_PROBES {
            let seen = self.fast[at].load(Ordering::Acquire);
            if seen == wanted {
                return Some(at as u32);
            }
            if seen.is_null() {
                return self.number_slowly(site, Some(at));
            }
            at = (at + 1) % FAST;
        }
        self.number_slowly(site, None)
    }

    /// A site whose address is not in the table: an equal site's number if
    /// one has one, else a new number (the table's free entry `free`, if the
    /// search found one, else one from the locked map).
    fn number_slowly(&self, site: &'static Location<'static>, free: Option<usize>) -> Option<u32> {
        // A search that found no free entry is, nearly always, for a site numbered in the
        // map (its entries were taken when it came, and entries are never cleared): look
        // there first. Scanning the table by contents first cost such a site's every
        // `create` about 1,000 instructions (a type created in 100 places: +354 a create).
        if free.is_none() && !self.more.held_here() {
            if let Some(&number) = self.more.lock().0.get(&key(site)) {
                return Some(number);
            }
        }
        if let Some(number) = self.fast.iter().position(|entry| {
            let seen = entry.load(Ordering::Acquire);
            // SAFETY: a non-null entry is a `&'static Location` (type invariant).
            !seen.is_null() && unsafe { *seen == *site }
        }) {
            return Some(number as u32);
        }
        if self.more.held_here() {
            // A create from user code (the store allocator) while this thread
            // numbers a site: no number, as when the table has no room.
            return None;
        }
        let mut more = self.more.lock();
        let (numbers, sites) = &mut *more;
        if let Some(&number) = numbers.get(&key(site)) {
            return Some(number);
        }
        if let Some(at) = free {
            let wanted = ptr::from_ref(site).cast_mut();
            let claimed = self.fast[at].compare_exchange(ptr::null_mut(), wanted, Ordering::AcqRel, Ordering::Acquire);
            if claimed.is_ok() {
                return Some(at as u32);
            }
        }
        numbers.try_reserve(1).ok()?;
        sites.try_reserve(1).ok()?;
        let number = (FAST + sites.len()) as u32;
        numbers.insert(key(site), number);
        sites.push(site);
        Some(number)
    }

    /// The site numbered `number`, if one is.
    pub(crate) fn site(&self, number: u32) -> Option<&'static Location<'static>> {
        let number = number as usize;
        match self.fast.get(number) {
            Some(entry) => {
                let site = entry.load(Ordering::Acquire);
                // SAFETY: a non-null entry is a `&'static Location` (type invariant).
                (!site.is_null()).then(|| unsafe { &*site })
            }
            None => self.more.lock().1.get(number - FAST).copied(),
        }
    }
}

impl std::fmt::Debug for CreationSites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fast = self.fast.iter().filter(|e| !e.load(Ordering::Relaxed).is_null()).count();
        f.debug_struct("CreationSites").field("sites", &(fast + self.more.lock().1.len())).finish()
    }
}

/// Where a site's search starts: a multiplicative hash of its address.
#[inline]
fn home(site: *mut Location<'static>) -> usize {
    const BITS: u32 = FAST.trailing_zeros();
    ((site.addr() as u64 >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BITS)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn here() -> &'static Location<'static> {
        Location::caller()
    }

    /// `site`'s number, checked to be one.
    fn numbered(sites: &CreationSites, site: &'static Location<'static>) -> u32 {
        let number = sites.number(site);
        assert_ne!(number, UNNUMBERED, "the table has room");
        number
    }

    #[test]
    fn a_site_keeps_its_number_and_reads_back() {
        let sites = CreationSites::new(StoreAlloc::default_segments(), "T").unwrap();
        let (first, second) = (here(), here());
        let (a, b) = (numbered(&sites, first), numbered(&sites, second));
        assert_ne!(a, b);
        assert_eq!(sites.number(first), a);
        assert_eq!(sites.site(a).map(ptr::from_ref), Some(ptr::from_ref(first)));
        assert_eq!(sites.site(b).map(|s| s.line()), Some(second.line()));
        assert_eq!(sites.site(u32::MAX), None);
    }

    #[test]
    fn copies_of_a_site_share_its_number() {
        // Copies of one site at distinct addresses, as Miri makes on every call.
        let storage: std::vec::Vec<Location<'static>> = (0..3).map(|_| *here()).collect();
        let sites = CreationSites::new(StoreAlloc::default_segments(), "T").unwrap();
        // SAFETY: `storage` is declared before `sites`, so it outlives every use of the table.
        let numbers: std::vec::Vec<u32> =
            storage.iter().map(|site| numbered(&sites, unsafe { &*ptr::from_ref(site) })).collect();
        assert_eq!(numbers, [numbers[0]; 3]);
    }

    #[test]
    fn sites_past_the_fast_table_are_numbered_too() {
        // 80 call sites (each its own column), more than the fast table holds.
        #[rustfmt::skip]
        let many = [
            here(), here(), here(), here(), here(), here(), here(), here(), here(), here(),
            here(), here(), here(), here(), here(), here(), here(), here(), here(), here(),
            here(), here(), here(), here(), here(), here(), here(), here(), here(), here(),
            here(), here(), here(), here(), here(), here(), here(), here(), here(), here(),
            here(), here(), here(), here(), here(), here(), here(), here(), here(), here(),
            here(), here(), here(), here(), here(), here(), here(), here(), here(), here(),
            here(), here(), here(), here(), here(), here(), here(), here(), here(), here(),
            here(), here(), here(), here(), here(), here(), here(), here(), here(), here(),
        ];
        let sites = CreationSites::new(StoreAlloc::default_segments(), "T").unwrap();
        let numbers: std::vec::Vec<u32> = many.iter().map(|site| numbered(&sites, site)).collect();
        let mut distinct = numbers.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), many.len(), "one number per site");
        assert!(distinct.last().is_some_and(|&n| n as usize >= FAST), "some past the fast table");
        for (site, &number) in many.iter().zip(&numbers) {
            assert_eq!(sites.number(site), number, "a site keeps its number");
            assert_eq!(sites.site(number), Some(*site));
        }
    }
}
