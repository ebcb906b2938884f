//! A simulated game loop: the tour of `mmobject`'s object manager.
//!
//! Run it with `cargo run --release --example game_loop [-- --frames N] [--plot memory.svg]`
//! (`--plot` draws live objects and bytes per type, frame by frame, as an SVG chart).
//!
//! - A level loads textures, meshes and materials (which hold texture handles).
//! - Every frame, entities spawn and despawn, a targeting system follows them
//!   through weak handles, explosions create one-frame particles, and
//!   `collect_garbage` destroys whatever became unreachable.
//! - Each frame moves every entity with `iter_mut`, reading its mesh at the
//!   same time through `views` (one type written, another read).
//! - Entities spawn in pairs of wingmen that hold each other. Once both have
//!   despawned, the pair keeps only itself alive: a reference cycle, which a
//!   `CycleCollector` frees a 200 µs slice per frame, reading only the
//!   objects that lost a handle (its candidate roots), never every entity.
//! - Halfway through, the level is swapped. The next level streams in on a
//!   loader thread (`ObjectManager::loader`) while the frames go on; then
//!   dropping one handle to the old `Level` frees its materials and then
//!   their textures, once the last entities using them are gone (the wingman
//!   pairs among them over the next frames' cycle collection).
//! - All object memory comes from a 32 MiB budget the game set aside
//!   (`ObjectManagerBuilder::allocator`), and goes back to it at shutdown.
//! - At the end, two objects are kept alive on purpose to show the leak report.
//!
//! Logging goes through `env_logger` (default filter `info`; set `RUST_LOG` to change it).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use mmobject::alloc::SegmentAlloc;
use mmobject::{CollectStats, CycleCollector, Handle, Loader, MMObject, MemoryTimeline, ObjectManager, WeakHandle};

/// Where every object store's memory comes from: a fixed budget, as a console
/// memory map would give the object system. Past it, `try_create` fails.
static OBJECT_MEMORY: SegmentAlloc = SegmentAlloc::with_limit(32 << 20);

// ---- Game data ----------------------------------------------------------------

#[derive(MMObject)]
#[mm(tag = "Textures")]
struct Texture {
    width: u32,
    height: u32,
    pixels: Vec<u8>, // RGBA8, so `size()` reports real bytes
}

#[derive(MMObject)]
#[mm(tag = "Meshes")]
struct Mesh {
    vertices: Vec<[f32; 3]>,
}

/// Holds its textures: a texture lives as long as some material uses it.
#[derive(MMObject)]
struct Material {
    albedo: Handle<Texture>,
    detail: Option<Handle<Texture>>,
}

/// Everything a level owns. Dropping the last `Handle<Level>` releases it all.
#[derive(MMObject)]
struct Level {
    name: &'static str,
    meshes: Vec<Handle<Mesh>>,
    materials: Vec<Handle<Material>>,
}

/// A moving thing in the world. It keeps its mesh and material alive, even
/// after the level that loaded them is gone.
#[derive(MMObject)]
struct Entity {
    mesh: Handle<Mesh>,
    material: Handle<Material>,
    /// Wingmen hold each other, so a pair outlives its last outside handle
    /// as a reference cycle (freed by the `CycleCollector`).
    wingman: Option<Handle<Entity>>,
    pos: [f32; 2],
    vel: [f32; 2],
    ttl: u32,
}

/// Scratch object: created by an explosion, dropped at the end of the frame.
#[derive(MMObject)]
struct Particle {
    pos: [f32; 2],
    vel: [f32; 2],
}

/// What to load: counts of each asset type.
struct LevelSpec {
    name: &'static str,
    textures: usize,
    meshes: usize,
}

const LEVELS: [LevelSpec; 2] =
    [LevelSpec { name: "Forest", textures: 24, meshes: 16 }, LevelSpec { name: "Caves", textures: 32, meshes: 12 }];

// ---- A tiny deterministic RNG (xorshift64*) -------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A number in `-1.0..1.0`.
    fn signed(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

// ---- Loading ----------------------------------------------------------------------

/// Creates a level's assets through a loader, on whatever thread calls it.
/// Only the `Level` handle is returned: the level holds the meshes and
/// materials, and the materials hold the textures.
fn load_level(mm: &Loader, rng: &mut Rng, spec: &LevelSpec) -> Handle<Level> {
    let textures: Vec<Handle<Texture>> = (0..spec.textures)
        .map(|i| {
            let side = 32 << (i % 3); // 32, 64 or 128 pixels square
            mm.create(Texture { width: side, height: side, pixels: vec![0x80; (side * side * 4) as usize] })
        })
        .collect();
    let meshes =
        (0..spec.meshes).map(|_| mm.create(Mesh { vertices: vec![[0.0; 3]; 500 + rng.below(3500)] })).collect();
    // One material per texture; every third one also shares a detail texture.
    let materials = textures
        .iter()
        .enumerate()
        .map(|(i, albedo)| {
            let detail = (i % 3 == 0).then(|| textures[rng.below(textures.len())].clone());
            mm.create(Material { albedo: albedo.clone(), detail })
        })
        .collect();
    // `textures` drops here: from now on the materials keep them alive.
    mm.create(Level { name: spec.name, meshes, materials })
}

// ---- Systems ------------------------------------------------------------------------

/// Spawns a wave of `n` entities using the current level's meshes and
/// materials, with one `create_many` (the store is found once for the wave).
fn spawn(mm: &ObjectManager, rng: &mut Rng, level: &Handle<Level>, n: usize, out: &mut Vec<Handle<Entity>>) {
    let level = &mm[level];
    out.extend(mm.create_many((0..n).map(|_| Entity {
        mesh: level.meshes[rng.below(level.meshes.len())].clone(),
        material: level.materials[rng.below(level.materials.len())].clone(),
        wingman: None,
        pos: [rng.signed() * 100.0, rng.signed() * 100.0],
        vel: [rng.signed(), rng.signed()],
        ttl: 30 + rng.below(90) as u32,
    })));
}

/// A turret aims at one entity through a weak handle: it must not keep its target alive.
struct Turret {
    target: Option<WeakHandle<Entity>>,
}

/// Follows targets, notices when they die, and every 10 frames shoots them.
/// Returns how many targets died since the last frame.
fn targeting(
    mm: &mut ObjectManager,
    rng: &mut Rng,
    frame: u32,
    turrets: &mut [Turret],
    entities: &[Handle<Entity>],
) -> u32 {
    let mut lost = 0;
    for turret in turrets {
        // A weak handle can be read without taking a reference...
        if let Some(w) = turret.target {
            if mm.get_weak(w).is_none() {
                lost += 1; // despawned (or shot) since the last frame
                turret.target = None;
            }
        }
        if turret.target.is_none() && !entities.is_empty() {
            turret.target = Some(entities[rng.below(entities.len())].downgrade());
        }
        // ...or upgraded to a strong handle while we work on the object.
        if frame % 10 == 0 {
            if let Some(target) = turret.target.and_then(|w| mm.upgrade(w)) {
                let hit = mm.get_mut(&target);
                hit.ttl = hit.ttl.saturating_sub(25);
            }
        }
    }
    lost
}

// ---- Main loop ------------------------------------------------------------------------

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).format_timestamp(None).init();
    let (frames, plot) = parse_args();
    let mut timeline = MemoryTimeline::new();

    // This thread runs every frame and collects: as the manager's owner, its
    // handle clones and drops cost plain loads and stores.
    let mut mm = ObjectManager::builder().allocator(&OBJECT_MEMORY).owner_thread(true).build();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut level = load_level(&mm.loader(), &mut rng, &LEVELS[0]);
    println!("{frames} frames; loaded level '{}': {} objects", mm[&level].name, mm.len());
    let mut next_level: Option<mpsc::Receiver<Handle<Level>>> = None;

    let mut entities: Vec<Handle<Entity>> = Vec::new();
    let mut turrets: Vec<Turret> = (0..4).map(|_| Turret { target: None }).collect();
    let (mut targets_lost, mut gc_total, mut gc_max) = (0, Duration::ZERO, Duration::ZERO);
    let mut cycles = CycleCollector::new();
    let (mut cycle_freed, mut cycle_max) = (0, Duration::ZERO);

    for frame in 1..=frames {
        // Level swap: dropping the only `Handle<Level>` and the level's
        // entities starts a cascade (level and entities, then meshes and
        // materials, then textures) that this frame's collect finishes, but
        // for the wingman pairs, which the cycle collector frees over the
        // next frames (and their meshes and materials with them).
        if frame == frames / 4 {
            // Stream the next level in on a loader thread: it creates objects
            // while this thread goes on updating and collecting.
            let (send, receive) = mpsc::channel();
            let loader = mm.loader();
            std::thread::spawn(move || send.send(load_level(&loader, &mut Rng(0x5EED), &LEVELS[1])));
            next_level = Some(receive);
        }
        let swap = frame == frames / 2;
        if swap {
            let next = match next_level.take().map(|loaded| loaded.recv()) {
                Some(Ok(next)) => next,
                _ => load_level(&mm.loader(), &mut rng, &LEVELS[1]), // too few frames to stream it
            };
            let old = std::mem::replace(&mut level, next);
            println!(
                "frame {frame:>4}  unloading '{}' and its {} entities, loaded '{}'",
                mm[&old].name,
                entities.len(),
                mm[&level].name
            );
            entities.clear();
            drop(old);
        }

        let count = 4 + rng.below(10);
        spawn(&mm, &mut rng, &level, count, &mut entities);
        for pair in entities[entities.len() - count..].chunks_exact(2) {
            mm[&pair[0]].wingman = Some(pair[1].clone());
            mm[&pair[1]].wingman = Some(pair[0].clone());
        }

        // Movement: every entity, written in place, while reading its mesh
        // (big meshes move slower). `views` splits the manager by type.
        {
            let views = mm.views();
            let meshes = views.view::<Mesh>();
            for (_, e) in views.view_mut::<Entity>().iter_mut() {
                let speed = 1000.0 / meshes.get(&e.mesh).vertices.len() as f32;
                e.pos = [e.pos[0] + e.vel[0] * speed, e.pos[1] + e.vel[1] * speed];
                e.ttl = e.ttl.saturating_sub(1);
            }
        }
        targets_lost += targeting(&mut mm, &mut rng, frame, &mut turrets, &entities);

        // Despawn: each dead entity explodes into a burst of one-frame particles.
        let mut particles: Vec<Handle<Particle>> = Vec::new();
        entities.retain(|e| {
            let e = &mm[e];
            if e.ttl == 0 {
                particles.extend((0..8).map(|_| mm.create(Particle { pos: e.pos, vel: [rng.signed(), rng.signed()] })));
            }
            e.ttl > 0 // `false` drops the handle: the entity is now dead, not yet destroyed
        });
        for (_, p) in mm.iter_mut::<Particle>() {
            p.pos = [p.pos[0] + p.vel[0], p.pos[1] + p.vel[1]];
        }
        drop(particles);

        // The frame's sync point: destroy everything that became unreachable.
        let start = Instant::now();
        let freed = mm.collect_garbage();
        let took = start.elapsed();
        gc_total += took;
        gc_max = gc_max.max(took);
        // Then a slice of cycle collection: wingman pairs that both despawned.
        let start = Instant::now();
        cycle_freed += cycles.step(&mut mm, Duration::from_micros(200)).collected.objects;
        cycle_max = cycle_max.max(start.elapsed());

        if frame % 60 == 0 || swap || frame == frames {
            print_frame(&mm, frame, &freed, took);
        }
        if plot.is_some() {
            timeline.sample(u64::from(frame), &mm.report());
        }
    }
    if let Some(path) = &plot {
        match timeline.write_svg(path) {
            Ok(()) => println!("wrote {path}"),
            Err(e) => exit_with(&format!("cannot write {path}: {e}"), 1),
        }
    }

    println!(
        "turrets saw {targets_lost} targets die; collect_garbage: avg {:.1} µs, max {:.1} µs",
        gc_total.as_secs_f64() * 1e6 / f64::from(frames.max(1)),
        gc_max.as_secs_f64() * 1e6
    );
    println!(
        "the cycle collector freed {cycle_freed} entities in wingman cycles, in steps of at most {:.1} µs",
        cycle_max.as_secs_f64() * 1e6
    );
    println!("\n{}\n", mm.report());
    let memory = OBJECT_MEMORY.stats();
    println!(
        "object memory: {} KiB in use in {} blocks (peak {} KiB) of a {} KiB budget\n",
        memory.in_use >> 10,
        memory.live,
        memory.peak >> 10,
        memory.capacity >> 10
    );

    // Keep two objects alive past shutdown on purpose: a material and its
    // albedo texture, as raw handles (the way a script engine would hold them).
    println!("keeping a Texture and a Material alive on purpose to show the leak report:");
    let material = mm[&level].materials[1].clone();
    let texture = mm[&material].albedo.clone();
    let _raw = (texture.into_raw(), material.into_raw());

    drop((entities, level));
    // The last wingman pairs are cycles now: free them before the report.
    while !cycles.step(&mut mm, Duration::from_millis(1)).pass_finished {}
    // Shutdown (or dropping the manager) logs a WARN line per object still
    // alive, with its creation site; the returned `LeakReport` can be asserted in tests.
    let _leaks = mm.shutdown();
    println!("object memory after shutdown: {} KiB in use", OBJECT_MEMORY.stats().in_use >> 10);
}

/// One status line: live objects by type, what the collect freed, and how long it took.
fn print_frame(mm: &ObjectManager, frame: u32, freed: &CollectStats, took: Duration) {
    println!(
        "frame {frame:>4}  live: tex {:>2} mesh {:>2} mat {:>2} ent {:>4}  \
         freed {:>4} obj {:>7.1} KiB in {} round(s)  gc {:>5.1} µs",
        mm.count::<Texture>(),
        mm.count::<Mesh>(),
        mm.count::<Material>(),
        mm.count::<Entity>(),
        freed.objects,
        freed.bytes as f64 / 1024.0,
        freed.rounds,
        took.as_secs_f64() * 1e6
    );
}

/// `--frames N` (default 600), `--plot PATH` and `--help`.
fn parse_args() -> (u32, Option<String>) {
    let usage = "usage: game_loop [--frames N] [--plot PATH]\n\n\
                 Simulates N frames (default 600) of a game using mmobject's object manager.";
    let (mut frames, mut plot) = (600, None);
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
