//! A frame loop under the memory tracker.
//!
//! Every heap allocation goes through `TrackingAllocator` and lands on the tag in scope.
//! The loop goes over the "Particles" budget (a warning, via env_logger), leaks one
//! allocation on purpose (the leak report shows it with a resolved call stack), and writes
//! the per-frame timeline to `memory.csv` (or the path after `--csv`).
//!
//! ```text
//! cargo run --example tracker -- --csv /tmp/memory.csv
//! ```

use std::alloc::System;
use std::collections::HashMap;

use mmobject::track::{scope, Mode, Tag, TagId, Tracker, TrackingAllocator};

#[global_allocator]
static ALLOC: TrackingAllocator<System> = TrackingAllocator::new(System);

static TEXTURES: Tag = Tag::new("Textures");
static MESHES: Tag = Tag::new("Meshes");
static PARTICLES: Tag = Tag::new("Particles");
static SCRIPTS: Tag = Tag::new("Scripts");

fn main() -> std::io::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let csv_path = std::env::args().skip_while(|a| a != "--csv").nth(1).unwrap_or_else(|| "memory.csv".to_string());

    let tracker = Tracker::global();
    tracker.set_mode(Mode::Stacks { depth: 8 });
    tracker.set_budget(&PARTICLES, 256 << 10);

    let textures: Vec<Vec<u8>> = scope(&TEXTURES, || (0..8).map(|i| vec![i as u8; 64 << 10]).collect());
    let mut meshes: HashMap<String, Vec<[f32; 3]>> = HashMap::new();
    let mut particles: Vec<[f32; 4]> = Vec::new();
    let mut leaked = None;

    for frame in 0..60 {
        // Streaming: a mesh appears every few frames.
        if frame % 5 == 0 {
            let _g = MESHES.enter();
            meshes.insert(format!("mesh{frame}"), vec![[0.0; 3]; 1000 + frame * 50]);
        }
        // Particles grow until they go over budget (one warning), then get trimmed.
        scope(&PARTICLES, || {
            particles.extend(std::iter::repeat_n([0.0f32; 4], 400));
            if particles.len() > 20_000 {
                particles.truncate(1_000);
                particles.shrink_to_fit();
            }
        });
        // Short-lived script garbage every frame.
        let garbage: Vec<String> = scope(&SCRIPTS, || (0..100).map(|i| i.to_string()).collect());
        drop(garbage);
        if frame == 30 {
            leaked = Some(leak_a_script_buffer());
        }
        tracker.frame_mark();
    }

    println!("{}", tracker.snapshot());

    // The leak report, without the untagged allocations of std and the logger.
    let mut leaks = tracker.leak_report();
    leaks.retain(|g| g.tag == SCRIPTS.id());
    println!("{leaks}");
    assert!(leaks.groups.iter().any(|g| g.tag != TagId::UNTAGGED));

    let file = std::fs::File::create(&csv_path)?;
    tracker.write_csv(std::io::BufWriter::new(file))?;
    println!("wrote {} frames of per-tag bytes to {csv_path}", tracker.timeline_frames());
    drop((textures, meshes, particles));
    let _ = leaked;
    Ok(())
}

/// Allocates a buffer and "forgets" it: the leak report will point here.
#[inline(never)]
fn leak_a_script_buffer() -> &'static mut [u8] {
    scope(&SCRIPTS, || Vec::leak(vec![0u8; 4096]))
}
