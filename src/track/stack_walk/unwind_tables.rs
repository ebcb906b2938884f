//! The stack walk by unwind tables: the `.eh_frame` rules the system unwinder follows, read
//! with `gimli`, with each return address's rule cached, so that a capture through call sites
//! seen before costs a few loads per frame instead of a table search and a CFI program run.
//!
//! For every frame the rule says where the caller's frame starts (the CFA: `rsp` or `rbp`
//! plus an offset), where the return address is saved, and whether the caller's `rbp` is
//! saved. Rules of any other shape (a DWARF expression, a register held in another register,
//! an address without unwind information, a signal frame) make the walk give up, and the
//! capture falls back to the unwinder, which handles them all.
//!
//! A rule stays right as long as the code at its address does. Code changes only when a
//! shared library is unloaded (its addresses may later hold another library), so each capture
//! first reads the loader's count of unloads (`dl_iterate_phdr`'s `dlpi_subs`, a few tens of
//! nanoseconds) and the cache is emptied when it moved.
//!
//! Every word the walk reads lies inside the current thread's stack, between the walk's own
//! stack pointer and the top of the stack's mapping, so even a wrong rule could only make the
//! walk stop or give up, never read elsewhere.
//!
//! x86-64 Linux only.

use std::ffi::{c_char, c_int, c_void};

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, NativeEndian, Pointer, RegisterRule, UnwindContext, UnwindSection,
    X86_64,
};

use super::rule_cache::RuleCache;
use super::stack_top;

/// How to find the caller's frame from one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The caller's frame is found by this rule.
    Frame(FrameRule),
    /// The outermost frame: its return address is undefined.
    End,
    /// No rule this walk can follow: the capture falls back to the unwinder.
    Unknown,
}

/// A rule of the common shape: CFA = (`rbp` if `cfa_from_rbp`, else `rsp`) + `cfa_offset`;
/// the return address is saved at CFA - 8; the caller's `rbp` is as `rbp` says, and the
/// caller's `rsp` is the CFA (the x86-64 psABI's definition of the CFA, whose every frame
/// saves its return address just below it: rules that say otherwise are left to the
/// unwinder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameRule {
    cfa_from_rbp: bool,
    cfa_offset: i32,
    rbp: SavedRbp,
}

/// Where the caller's `rbp` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SavedRbp {
    /// In `rbp` still: this frame did not change it.
    Same,
    /// Saved at CFA + the offset.
    At(i16),
    /// Not recoverable: a caller whose CFA is `rbp`-based cannot be walked.
    Lost,
}

/// A [`Step`] packed in the rule cache's word, which the walk reads field by field. Never 0
/// (0 marks an empty cache entry). Bits 0..2: the kind (1 frame, 2 end, 3 unknown); bit 2:
/// the CFA is `rbp`-based; bit 3: the caller's `rbp` is saved, at the offset in bits 16..32;
/// bit 4: the caller's `rbp` is lost; bits 32..64: the CFA's offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PackedStep(u64);

impl PackedStep {
    const KIND: u64 = 3;
    const FRAME: u64 = 1;
    const END: u64 = 2;
    const UNKNOWN: u64 = 3;
    const CFA_FROM_RBP: u64 = 1 << 2;
    const RBP_SAVED: u64 = 1 << 3;
    const RBP_LOST: u64 = 1 << 4;

    fn pack(step: Step) -> PackedStep {
        PackedStep(match step {
            Step::End => Self::END,
            Step::Unknown => Self::UNKNOWN,
            Step::Frame(rule) => {
                let rbp = match rule.rbp {
                    SavedRbp::Same => 0,
                    SavedRbp::At(offset) => Self::RBP_SAVED | u64::from(offset as u16) << 16,
                    SavedRbp::Lost => Self::RBP_LOST,
                };
                let base = if rule.cfa_from_rbp { Self::CFA_FROM_RBP } else { 0 };
                Self::FRAME | base | rbp | u64::from(rule.cfa_offset as u32) << 32
            }
        })
    }

    #[cfg_attr(not(test), allow(dead_code))]
    fn unpack(self) -> Step {
        match self.0 & Self::KIND {
            Self::FRAME => Step::Frame(FrameRule {
                cfa_from_rbp: self.cfa_from_rbp(),
                cfa_offset: self.cfa_offset() as i32,
                rbp: match self.rbp_saved_at() {
                    Some(offset) => SavedRbp::At(offset as i16),
                    None if self.0 & Self::RBP_LOST != 0 => SavedRbp::Lost,
                    None => SavedRbp::Same,
                },
            }),
            Self::END => Step::End,
            _ => Step::Unknown,
        }
    }

    #[inline(always)]
    fn is_frame(self) -> bool {
        self.0 & Self::KIND == Self::FRAME
    }

    #[inline(always)]
    fn is_end(self) -> bool {
        self.0 & Self::KIND == Self::END
    }

    #[inline(always)]
    fn cfa_from_rbp(self) -> bool {
        self.0 & Self::CFA_FROM_RBP != 0
    }

    #[inline(always)]
    fn cfa_offset(self) -> isize {
        (self.0 >> 32) as u32 as i32 as isize
    }

    #[inline(always)]
    fn rbp_saved_at(self) -> Option<isize> {
        (self.0 & Self::RBP_SAVED != 0).then_some((self.0 >> 16) as u16 as i16 as isize)
    }

    #[inline(always)]
    fn rbp_lost(self) -> bool {
        self.0 & Self::RBP_LOST != 0
    }
}

/// The rules of every return address walked through: 16,384 entries, 256 KiB of zeroed
/// memory (pages are touched only as entries land on them).
static CACHE: RuleCache<{ 1 << 14 }> = RuleCache::new();

/// Fills `out` with return addresses, from the one into `walk`'s caller outwards, and
/// returns how many; or `None` if some frame cannot be walked by its rule (the caller then
/// uses the unwinder).
#[inline(never)]
pub(super) fn walk(out: &mut [usize]) -> Option<usize> {
    let (mut pc, mut sp, mut bp) = registers();
    let low = sp;
    let top = stack_top(sp)?;
    CACHE.sync(unloads()?);
    let epoch = CACHE.begin()?;
    let mut bp_known = true;
    // The first rule is `walk`'s own at `pc`, an exact address inside it; the others are
    // looked up one byte before their return address, inside the call instruction (a call
    // to a function that never returns can be a function's last instruction).
    let mut lookup = pc;
    let mut n = 0;
    while n < out.len() {
        let step = match CACHE.get(pc) {
            Some(word) => PackedStep(word),
            None => learn(epoch, pc, lookup),
        };
        if !step.is_frame() {
            if step.is_end() {
                break;
            }
            return None;
        }
        let base = if step.cfa_from_rbp() {
            if !bp_known {
                return None;
            }
            bp
        } else {
            sp
        };
        let cfa = base.checked_add_signed(step.cfa_offset())?;
        // A caller's frame lies above its callee's, inside the stack; so then does the
        // return address just below the CFA.
        if cfa <= sp || cfa > top || cfa % 8 != 0 {
            return None;
        }
        let ra = read_stack(cfa - 8, low, top)?;
        if let Some(offset) = step.rbp_saved_at() {
            bp = read_stack(cfa.checked_add_signed(offset)?, low, top)?;
        } else if step.rbp_lost() {
            bp_known = false;
        }
        if ra == 0 {
            break;
        }
        out[n] = ra;
        n += 1;
        sp = cfa;
        pc = ra;
        lookup = ra - 1;
    }
    CACHE.still(epoch).then_some(n)
}

/// This point's instruction pointer, stack pointer and frame base register, all read in
/// one asm block, so the rule at the instruction pointer describes that stack pointer.
#[inline(always)]
fn registers() -> (usize, usize, usize) {
    let (pc, sp, bp): (usize, usize, usize);
    // SAFETY: copies three registers (the first via `lea` of the next instruction's
    // address); touches no memory, no stack, no flags.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    (pc, sp, bp)
}

/// The word at `address`, if it lies in `[low, top)` and is aligned.
#[inline(always)]
fn read_stack(address: usize, low: usize, top: usize) -> Option<usize> {
    if address < low || address > top.checked_sub(8)? || address % 8 != 0 {
        return None;
    }
    // SAFETY: `[address, address + 8)` lies in `[low, top)`: this thread's stack between
    // the walk's own stack pointer and the top of its mapping (mapped and readable, and
    // holding the frames of the walk's callers, which do not change while it runs). The
    // address is aligned. Volatile because these words are not Rust values we own, only
    // stack memory read as integers.
    Some(unsafe { std::ptr::with_exposed_provenance::<usize>(address).read_volatile() })
}

/// Finds the rule for the frame at `pc` (a return address, or the walk's own first
/// address), which is in effect at `lookup`, and caches it. Slow (a search of the loaded
/// objects, a table search, a CFI program run): it runs once per return address, on a cache
/// miss. May allocate, so it runs with the tracker off.
#[cold]
#[inline(never)]
fn learn(epoch: u64, pc: usize, lookup: usize) -> PackedStep {
    let _reentry = crate::track::Reentry::enter();
    #[cfg(test)]
    tests::LEARNED.with(|n| n.set(n.get() + 1));
    let step = object_holding(lookup).and_then(|object| rule_in(&object, lookup)).unwrap_or(Step::Unknown);
    let packed = PackedStep::pack(step);
    CACHE.insert(epoch, pc, packed.0);
    packed
}

/// The rule for `address` in `object`'s `.eh_frame`, through its `.eh_frame_hdr` search
/// table; `None` if it has none there, or one of another shape.
fn rule_in(object: &LoadedObject, address: usize) -> Option<Step> {
    let (hdr_start, hdr_len) = object.eh_frame_hdr?;
    // SAFETY: `PT_GNU_EH_FRAME` names this range of a loaded object, which lies inside one
    // of its `PT_LOAD` segments: mapped and readable, and never written. Objects are
    // unloaded only by `dlclose`, which must not unload code still on a thread's stack,
    // and `address` is on this thread's stack.
    let hdr_bytes = unsafe { std::slice::from_raw_parts(std::ptr::with_exposed_provenance::<u8>(hdr_start), hdr_len) };
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_start as u64);
    let hdr = EhFrameHdr::new(hdr_bytes, NativeEndian).parse(&bases, 8).ok()?;
    let eh_frame_start = match hdr.eh_frame_ptr() {
        Pointer::Direct(address) => usize::try_from(address).ok()?,
        Pointer::Indirect(_) => return None,
    };
    let eh_frame_end = object.segment_end(eh_frame_start)?;
    // SAFETY: as above: `[eh_frame_start, eh_frame_end)` lies inside one mapped, read-only
    // `PT_LOAD` segment of the object (`segment_end` found the one holding its start).
    let eh_frame_bytes = unsafe {
        std::slice::from_raw_parts(
            std::ptr::with_exposed_provenance::<u8>(eh_frame_start),
            eh_frame_end - eh_frame_start,
        )
    };
    let eh_frame = EhFrame::new(eh_frame_bytes, NativeEndian);
    let bases = bases.set_eh_frame(eh_frame_start as u64);
    let fde = hdr.table()?.fde_for_address(&eh_frame, &bases, address as u64, EhFrame::cie_from_offset).ok()?;
    if fde.is_signal_trampoline() {
        // The frame it interrupted is at an exact address, not after a call: the unwinder
        // knows to look that up without stepping back a byte; this walk does not.
        return Some(Step::Unknown);
    }
    let mut context = UnwindContext::new();
    let row = fde.unwind_info_for_address(&eh_frame, &bases, &mut context, address as u64).ok()?;
    let (cfa_from_rbp, cfa_offset) = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RSP => (false, offset),
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RBP => (true, offset),
        _ => return Some(Step::Unknown),
    };
    match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return Some(Step::End),
        _ => return Some(Step::Unknown),
    }
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => SavedRbp::Same,
        Some(RegisterRule::Offset(offset)) => SavedRbp::At(i16::try_from(offset).ok()?),
        Some(RegisterRule::Undefined) => SavedRbp::Lost,
        Some(_) => return Some(Step::Unknown),
    };
    Some(Step::Frame(FrameRule { cfa_from_rbp, cfa_offset: i32::try_from(cfa_offset).ok()?, rbp }))
}

/// What the walk needs of a loaded object: where its `.eh_frame_hdr` is, and its
/// loaded segments (to bound `.eh_frame`, whose length no header gives).
#[derive(Debug, Default)]
struct LoadedObject {
    eh_frame_hdr: Option<(usize, usize)>,
    segments: [(usize, usize); 16],
    segment_count: usize,
}

impl LoadedObject {
    /// The end of the loaded segment holding `address`.
    fn segment_end(&self, address: usize) -> Option<usize> {
        self.segments[..self.segment_count].iter().find(|&&(start, end)| start <= address && address < end).map(|s| s.1)
    }
}

/// The start of `struct dl_phdr_info` (glibc and musl lay it out alike); the fields after
/// `subs` are not read.
#[repr(C)]
struct DlPhdrInfo {
    addr: usize,
    name: *const c_char,
    phdr: *const ElfPhdr,
    phnum: u16,
    adds: u64,
    subs: u64,
}

/// `Elf64_Phdr`.
#[repr(C)]
struct ElfPhdr {
    p_type: u32,
    p_flags: u32,
    p_offset: u64,
    p_vaddr: u64,
    p_paddr: u64,
    p_filesz: u64,
    p_memsz: u64,
    p_align: u64,
}

const PT_LOAD: u32 = 1;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;

type PhdrCallback = unsafe extern "C" fn(*mut DlPhdrInfo, usize, *mut c_void) -> c_int;

extern "C" {
    fn dl_iterate_phdr(callback: Option<PhdrCallback>, data: *mut c_void) -> c_int;
}

/// How many objects the loader has unloaded so far, or `None` if it does not say.
fn unloads() -> Option<u64> {
    unsafe extern "C" fn first(info: *mut DlPhdrInfo, size: usize, data: *mut c_void) -> c_int {
        if size >= std::mem::offset_of!(DlPhdrInfo, subs) + std::mem::size_of::<u64>() {
            // SAFETY: the loader passes a valid `dl_phdr_info` of `size` bytes, which
            // covers `subs`; `data` is the `Option<u64>` `unloads` passed, alive and
            // unaliased for this call.
            unsafe { *data.cast::<Option<u64>>() = Some((*info).subs) };
        }
        1 // one object is enough: every object reports the same count
    }
    let mut found: Option<u64> = None;
    // SAFETY: `first` matches the callback's C signature, never unwinds, and writes
    // through `data` only as `Option<u64>`, which it is.
    unsafe { dl_iterate_phdr(Some(first), std::ptr::from_mut(&mut found).cast()) };
    found
}

/// The loaded object whose segments hold `address`.
fn object_holding(address: usize) -> Option<LoadedObject> {
    struct Search {
        address: usize,
        found: Option<LoadedObject>,
    }
    unsafe extern "C" fn visit(info: *mut DlPhdrInfo, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid `dl_phdr_info` whose `phdr` points to
        // `phnum` program headers; `data` is the `Search` `object_holding` passed, alive
        // and unaliased for this call.
        let (info, search) = unsafe { (&*info, &mut *data.cast::<Search>()) };
        let headers: &[ElfPhdr] = if info.phdr.is_null() {
            &[]
        } else {
            // SAFETY: as above: `phnum` headers at `phdr`.
            unsafe { std::slice::from_raw_parts(info.phdr, usize::from(info.phnum)) }
        };
        let mut object = LoadedObject::default();
        let mut holds = false;
        for header in headers {
            let start = info.addr.wrapping_add(header.p_vaddr as usize);
            let len = header.p_memsz as usize;
            match header.p_type {
                PT_LOAD => {
                    holds |= start <= search.address && search.address - start < len;
                    if object.segment_count < object.segments.len() {
                        object.segments[object.segment_count] = (start, start + len);
                        object.segment_count += 1;
                    }
                }
                PT_GNU_EH_FRAME => object.eh_frame_hdr = Some((start, len)),
                _ => {}
            }
        }
        if holds {
            search.found = Some(object);
            return 1;
        }
        0
    }
    let mut search = Search { address, found: None };
    // SAFETY: `visit` matches the callback's C signature, never unwinds (no call in it
    // can panic), and uses `data` only as the `Search` it is.
    unsafe { dl_iterate_phdr(Some(visit), std::ptr::from_mut(&mut search).cast()) };
    search.found
}

/// How many rules this thread computed (not found in the cache) so far.
#[cfg(test)]
pub(super) fn rules_learned() -> usize {
    tests::LEARNED.with(std::cell::Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    std::thread_local! {
        pub(super) static LEARNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn rules_survive_packing() {
        let rules = [
            Step::End,
            Step::Unknown,
            Step::Frame(FrameRule { cfa_from_rbp: false, cfa_offset: 8, rbp: SavedRbp::Same }),
            Step::Frame(FrameRule { cfa_from_rbp: true, cfa_offset: 16, rbp: SavedRbp::At(-16) }),
            Step::Frame(FrameRule { cfa_from_rbp: false, cfa_offset: i32::MAX, rbp: SavedRbp::Lost }),
            Step::Frame(FrameRule { cfa_from_rbp: true, cfa_offset: i32::MIN, rbp: SavedRbp::At(i16::MIN) }),
            Step::Frame(FrameRule { cfa_from_rbp: false, cfa_offset: -1, rbp: SavedRbp::At(i16::MAX) }),
        ];
        for rule in rules {
            let packed = PackedStep::pack(rule);
            assert_ne!(packed.0, 0, "0 is an empty cache entry");
            assert_eq!(packed.unpack(), rule);
        }
    }
}
