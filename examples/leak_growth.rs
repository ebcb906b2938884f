//! Finding three leaks: a list that keeps one entity per frame, a `HashMap`
//! cache that never evicts, and a UI panel whose parent and child hold each
//! other.
//!
//! Run it with `cargo run --example leak_growth [-- --frames N] [--plot leak.svg]`.
//!
//! - Every frame, entities spawn and die, as in `game_loop`. A `KillFeed`
//!   meant to *show* the frame's most valuable entity keeps a strong handle to
//!   it for ever (it should hold a `WeakHandle`): one entity and its mesh's
//!   share of memory leak per frame. With `--plot`, the chart shows the
//!   `Entity` line rising while everything else stays flat.
//! - Every tenth frame an explosion effect gets a one-off mesh, cached by name
//!   in a `MeshCache` (a `HashMap<String, Handle<Mesh>>`) that nothing ever
//!   evicts. The forensics see handles inside the map: the retention path of
//!   such a mesh names `MeshCache#….by_name`.
//! - A closed `Panel` and its `Button` hold each other: a reference cycle that
//!   `collect_garbage` cannot free and `find_cycles` finds.
//! - At the end it asks the manager why the oldest entity and the oldest
//!   explosion mesh are still alive, and shuts down: the leak report starts
//!   with a summary by type and creation site, names the roots that hold the
//!   rest (the kill feed, the cache) and the cycle, then details a few objects
//!   per creation site.

use std::collections::HashMap;

use mmobject::{Handle, MMObject, MemoryTimeline, ObjectManager};

#[derive(MMObject)]
#[mm(tag = "Meshes")]
struct Mesh {
    vertices: Vec<[f32; 3]>,
}

#[derive(MMObject)]
struct Entity {
    mesh: Handle<Mesh>,
    ttl: u32,
}

/// The bug: `Handle` where a `WeakHandle` was meant.
#[derive(MMObject)]
struct KillFeed {
    shown: Vec<Handle<Entity>>,
}

/// Meshes by name. The bug: entries are added, never evicted.
#[derive(MMObject)]
struct MeshCache {
    by_name: HashMap<String, Handle<Mesh>>,
}

/// A UI widget tree with parent links: a cycle as soon as it has children.
#[derive(MMObject)]
struct Widget {
    name: &'static str,
    parent: Option<Handle<Widget>>,
    children: Vec<Handle<Widget>>,
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).format_timestamp(None).init();
    let (frames, plot) = parse_args();
    let mut mm = ObjectManager::new();
    let mut timeline = MemoryTimeline::new();

    let meshes: Vec<_> = (0..4).map(|i| mm.create(Mesh { vertices: vec![[0.0; 3]; 100 << i] })).collect();
    let feed = mm.create(KillFeed { shown: Vec::new() });
    let cache = mm.create(MeshCache { by_name: HashMap::new() });

    // A panel opened and closed on frame 1: the button's parent link keeps both alive.
    let panel = mm.create(Widget { name: "pause menu", parent: None, children: Vec::new() });
    let button = mm.create(Widget { name: "resume", parent: Some(panel.clone()), children: Vec::new() });
    mm[&panel].children.push(button);
    println!("opened and closed the '{}' panel", mm[&panel].name);
    drop(panel);

    let session = mm.snapshot();
    let mut entities: Vec<Handle<Entity>> = Vec::new();
    for frame in 1..=frames {
        for i in 0..6 {
            let mesh = meshes[(frame as usize + i) % meshes.len()].clone();
            entities.push(mm.create(Entity { mesh, ttl: 20 + (frame + i as u32 * 7) % 40 }));
        }
        // The frame's best entity goes on the kill feed... and never leaves it.
        let spawned = &entities[entities.len() - 6..];
        let best = spawned.iter().max_by_key(|e| mm[*e].ttl).expect("spawned above").clone();
        mm[&feed].shown.push(best);
        // An explosion's one-off mesh, cached "for reuse" and never evicted.
        if frame % 10 == 0 {
            let effect = mm.create(Mesh { vertices: vec![[0.0; 3]; 64] });
            mm[&cache].by_name.insert(format!("explosion-{frame}"), effect);
        }

        for e in &entities {
            mm[e].ttl -= 1;
        }
        entities.retain(|e| mm[e].ttl > 0);
        mm.collect_garbage();
        timeline.sample(u64::from(frame), &mm.report());
    }

    println!("after {frames} frames:\n{}\n", mm.report());
    // The session ends: every entity should go.
    drop(entities);
    mm.collect_garbage();
    let left = mm.alive_since(&session);
    println!("{} object(s) created during the session are still alive", left.len());
    if let Some(oldest) = mm[&feed].shown.first() {
        let key = oldest.key();
        let path = mm.retention_path(key).expect("alive");
        println!("why is Entity{key} still alive?\n  {path}\n");
    }
    if let Some(mesh) = mm[&cache].by_name.get("explosion-10") {
        let key = mesh.key();
        println!("who holds Mesh{key}? {:?}", mm.holders(key));
        println!("why is Mesh{key} still alive?\n  {}\n", mm.retention_path(key).expect("alive"));
    }
    for cycle in mm.reference_cycles() {
        println!("reference cycle: {cycle}");
    }
    if let Some(path) = plot {
        match timeline.write_svg(&path) {
            Ok(()) => println!("wrote {path}"),
            Err(e) => exit_with(&format!("cannot write {path}: {e}"), 1),
        }
    }

    // A script still holds the kill feed and the cache when the game exits.
    let _script = (feed.into_raw(), cache.into_raw());
    drop(meshes);
    let report = mm.shutdown();
    println!("\n{report}");
}

/// `--frames N` (default 300), `--plot PATH` and `--help`.
fn parse_args() -> (u32, Option<String>) {
    let usage = "usage: leak_growth [--frames N] [--plot PATH]\n\n\
                 Simulates N frames (default 300) with a leak and a reference cycle, then shows the forensics.";
    let (mut frames, mut plot) = (300, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--frames" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => frames = n,
                None => exit_with(&format!("--frames needs a number\n{usage}"), 2),
            },
            "--plot" => match args.next() {
                Some(path) => plot = Some(path),
                None => exit_with(&format!("--plot needs a file name\n{usage}"), 2),
            },
            "-h" | "--help" => exit_with(usage, 0),
            _ => exit_with(&format!("unknown argument '{arg}'\n{usage}"), 2),
        }
    }
    (frames, plot)
}

fn exit_with(message: &str, code: i32) -> ! {
    if code == 0 {
        println!("{message}");
    } else {
        eprintln!("{message}");
    }
    std::process::exit(code)
}
