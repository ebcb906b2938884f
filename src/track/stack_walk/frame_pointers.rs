//! The stack walk by frame pointers: two words read per frame, for builds that keep them
//! (`-C force-frame-pointers=yes`).

/// Fills `out` with return addresses by following saved frame pointers from the caller of
/// `walk`; returns how many. Reads only inside this thread's stack.
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline(never)]
pub(super) fn walk(out: &mut [usize]) -> usize {
    let marker = 0u8;
    let sp = std::ptr::from_ref(&marker) as usize;
    let Some(top) = super::stack_top(sp) else {
        return 0;
    };
    let mut fp = frame_pointer();
    let mut n = 0;
    // Invariant at each step: `sp <= fp` and `fp + 16 <= top`, so both words read are
    // inside the mapped stack above the current stack pointer.
    while n < out.len() && fp >= sp && fp % std::mem::align_of::<usize>() == 0 && fp <= top - 16 {
        // SAFETY: `[fp, fp + 16)` lies in `[sp, top)`, this thread's stack above the
        // live stack pointer (mapped, readable, and not changing under us: it holds the
        // frames of our callers); the address is aligned. Volatile because the words are
        // not Rust values we own, just stack memory read as integers.
        let (next, ret) = unsafe {
            let p = std::ptr::with_exposed_provenance::<usize>(fp);
            (p.read_volatile(), p.add(1).read_volatile())
        };
        if ret == 0 {
            break;
        }
        out[n] = ret;
        n += 1;
        if next <= fp {
            break; // the chain must go up the stack; anything else is not a frame record
        }
        fp = next;
    }
    n
}

#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
pub(super) fn walk(_out: &mut [usize]) -> usize {
    0
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[inline(always)]
fn frame_pointer() -> usize {
    let fp: usize;
    // SAFETY: copies a register; touches no memory, no stack, no flags.
    unsafe { std::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags)) };
    fp
}

#[cfg(all(target_os = "linux", target_arch = "aarch64"))]
#[inline(always)]
fn frame_pointer() -> usize {
    let fp: usize;
    // SAFETY: copies a register; touches no memory, no stack, no flags.
    unsafe { std::arch::asm!("mov {}, x29", out(reg) fp, options(nomem, nostack, preserves_flags)) };
    fp
}
