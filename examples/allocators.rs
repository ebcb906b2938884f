//! A few frames of a toy game, using each allocator for the job it is meant for.
//!
//! Run with `cargo run --example allocators` (set `RUST_LOG=warn` to see leak reports).

use std::alloc::Layout;

use mmobject::alloc::{
    AlignedAlloc, DoubleBufferedAllocator, DoubleEndedStack, End, FrameAllocator, Pool, SizeClassPool,
    SmallObjectAllocator, StackAllocator, SystemRaw,
};

#[derive(Debug, Clone, Copy)]
struct Particle {
    pos: [f32; 3],
    vel: [f32; 3],
    life: f32,
}

fn main() {
    env_logger::init();

    // Level load: level data on the lower end, temporary decode buffers on the upper end.
    let mut level_memory = DoubleEndedStack::with_capacity(256 * 1024);
    let scratch = level_memory.marker(End::Upper);
    let decoded = level_memory.alloc(End::Upper, [0u8; 64 * 1024]);
    decoded[0] = 42;
    let tiles = level_memory.alloc(End::Lower, [decoded[0]; 1024]);
    let tile_count = tiles.len(); // references end before the upper end is freed
    level_memory.free_to_marker(scratch);
    println!("level: {} tiles, {} bytes of level data kept", tile_count, level_memory.allocated_bytes(End::Lower));

    // Long-lived engine data out of fixed budgets.
    let pool = SizeClassPool::new(&[(64, 1024), (256, 256), (1024, 64), (4096, 16)]);
    let mut entities = hashbrown::HashMap::new_in(&pool);
    let small = SmallObjectAllocator::default();
    let mut script_strings = allocator_api2::vec::Vec::new_in(&small);
    let particles: Pool<Particle> = Pool::with_capacity(512);
    let mut live_particles = Vec::new();
    let gpu = AlignedAlloc::new(SystemRaw);
    let upload = gpu.alloc(Layout::from_size_align(64 * 1024, 4096).unwrap());

    // Per-frame memory.
    let mut frame = FrameAllocator::with_capacity(64 * 1024);
    let mut jobs = DoubleBufferedAllocator::with_capacity(16 * 1024);
    let mut last_job = None;
    let mut level_stack = StackAllocator::with_capacity(16 * 1024);

    for n in 0..3u32 {
        entities.insert(n, [n as f32; 4]);
        script_strings.push(n as u8);
        live_particles.push(particles.alloc(Particle { pos: [0.0; 3], vel: [1.0, 2.0, 0.0], life: 1.0 }));
        for p in live_particles.iter_mut() {
            for axis in 0..3 {
                p.pos[axis] += p.vel[axis] * 0.016;
            }
            p.life -= 0.4;
        }
        live_particles.retain(|p| p.life > 0.0);

        let visible = frame.alloc_slice_copy(&[n, n + 1, n + 2]);
        let label = frame.alloc_str("frame");
        let mark = level_stack.marker();
        let temp = level_stack.alloc([n; 16]);

        // Read last frame's job result, then publish this frame's.
        let previous = last_job.map(|r| *jobs.get(r)).unwrap_or(0);
        last_job = Some(jobs.alloc(previous + visible.len() as u32));

        println!(
            "{label} {n}: {} visible, {} particles, job result from last frame {previous}, temp[0] {}",
            visible.len(),
            live_particles.len(),
            temp[0]
        );
        level_stack.free_to_marker(mark);
        frame.reset();
        jobs.swap();
    }

    println!("frame allocator:\n{}", frame.stats());
    println!("size-class pool:\n{}", pool.stats());
    println!("small objects:\n{}", small.stats());
    println!("particle pool: {} live of {}", particles.len(), particles.capacity());
    // SAFETY: `upload` came from `gpu` and is freed once.
    unsafe { gpu.free(upload) };
}
