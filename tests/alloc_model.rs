//! One model drives every allocator through `allocator_api2::alloc::Allocator`, as a
//! collection would: allocate, grow and free blocks of random sizes and alignments, and check
//! after every step that each live block is aligned, overlaps no other, and still holds what
//! was written into it (growth in place included).

use std::alloc::Layout;
use std::ptr::NonNull;

use allocator_api2::alloc::Allocator;
use mmobject::alloc::{
    AlignedAlloc, DoubleBufferedAllocator, DoubleEndedStack, FrameAllocator, Pool, SizeClassPool, SmallObjectAllocator,
    SmallObjectConfig, StackAllocator, SystemRaw,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Allocate `size` bytes aligned to `1 << shift`.
    Alloc { size: usize, shift: u32 },
    /// Free the live block picked by the index.
    Free(usize),
    /// Grow the picked block by `extra` bytes, keeping its alignment.
    Grow(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..200, 0u32..7).prop_map(|(size, shift)| Op::Alloc { size, shift }),
        1 => any::<usize>().prop_map(Op::Free),
        2 => (any::<usize>(), 1usize..300).prop_map(|(i, extra)| Op::Grow(i, extra)),
    ]
}

/// A live block of the model: where, for what layout, and the byte written all over it.
struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
    fill: u8,
}

impl Block {
    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.ptr.as_ptr() as usize % self.layout.align(), 0, "misaligned");
        // SAFETY: a live block of `layout.size()` bytes, written with `fill`.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) };
        prop_assert!(bytes.iter().all(|&b| b == self.fill), "contents changed");
        Ok(())
    }
}

fn run<A: Allocator + Copy>(alloc: A, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut live: Vec<Block> = Vec::new();
    for (n, op) in ops.iter().enumerate() {
        let fill = n as u8;
        match *op {
            Op::Alloc { size, shift } => {
                let layout = Layout::from_size_align(size, 1 << shift).unwrap();
                if let Ok(block) = alloc.allocate(layout) {
                    let ptr = block.cast::<u8>();
                    // SAFETY: a fresh block of at least `size` bytes.
                    unsafe { ptr.as_ptr().write_bytes(fill, size) };
                    live.push(Block { ptr, layout, fill });
                }
            }
            Op::Free(pick) if !live.is_empty() => {
                let block = live.swap_remove(pick % live.len());
                block.check()?;
                // SAFETY: a live block of this allocator, freed once.
                unsafe { alloc.deallocate(block.ptr, block.layout) };
            }
            Op::Grow(pick, extra) if !live.is_empty() => {
                let i = pick % live.len();
                let old = live[i].layout;
                let new = Layout::from_size_align(old.size() + extra, old.align()).unwrap();
                // SAFETY: a live block allocated for `old`; `new` is larger.
                if let Ok(block) = unsafe { alloc.grow(live[i].ptr, old, new) } {
                    let ptr = block.cast::<u8>();
                    let kept = Block { ptr, layout: old, fill: live[i].fill };
                    kept.check()?;
                    // SAFETY: the grown block holds `new.size()` bytes.
                    unsafe { ptr.as_ptr().write_bytes(fill, new.size()) };
                    live[i] = Block { ptr, layout: new, fill };
                }
            }
            Op::Free(_) | Op::Grow(..) => {}
        }
        for (i, a) in live.iter().enumerate() {
            a.check()?;
            let a_start = a.ptr.as_ptr() as usize;
            for b in &live[i + 1..] {
                let b_start = b.ptr.as_ptr() as usize;
                let apart = a_start + a.layout.size() <= b_start || b_start + b.layout.size() <= a_start;
                prop_assert!(a.layout.size() == 0 || b.layout.size() == 0 || apart, "blocks overlap");
            }
        }
    }
    for block in live {
        // SAFETY: a live block of this allocator, freed once.
        unsafe { alloc.deallocate(block.ptr, block.layout) };
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 64 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_allocator_keeps_blocks_apart_and_intact(
        ops in proptest::collection::vec(op(), 0..if cfg!(miri) { 12 } else { 80 })
    ) {
        run(&SizeClassPool::new(&[(8, 16), (64, 16), (256, 8), (1024, 4)]), &ops)?;
        run(&SmallObjectAllocator::new(SmallObjectConfig { slots: [8; 7] }), &ops)?;
        run(&StackAllocator::with_capacity(8 * 1024), &ops)?;
        run(&DoubleEndedStack::with_capacity(8 * 1024), &ops)?;
        run(&FrameAllocator::with_capacity(8 * 1024), &ops)?;
        run(&DoubleBufferedAllocator::with_capacity(8 * 1024), &ops)?;
        run(&AlignedAlloc::new(SystemRaw), &ops)?;
        run(&Pool::<[u64; 32]>::with_capacity(16), &ops)?;
    }
}
