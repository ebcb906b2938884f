//! A small version of the `game_loop` example's scenario, checked frame by frame:
//! a level load and swap, entities that hold level assets, a weak "target",
//! one-frame particles, and a `collect_garbage` every frame. Cascades must
//! finish in the collect that starts them, and only the objects kept on
//! purpose may be left at shutdown.

use mmobject::{Handle, MMObject, ObjectManager, WeakHandle};

#[derive(MMObject)]
#[mm(tag = "Textures")]
struct Texture {
    pixels: Vec<u8>,
}

#[derive(MMObject)]
#[mm(tag = "Meshes")]
struct Mesh {
    vertices: Vec<[f32; 3]>,
}

#[derive(MMObject)]
struct Material {
    albedo: Handle<Texture>,
    detail: Option<Handle<Texture>>,
}

#[derive(MMObject)]
struct Level {
    meshes: Vec<Handle<Mesh>>,
    materials: Vec<Handle<Material>>,
}

#[derive(MMObject)]
struct Entity {
    mesh: Handle<Mesh>,
    material: Handle<Material>,
    ttl: u32,
}

#[derive(MMObject)]
struct Particle {
    pos: [f32; 2],
}

const TEXTURES: usize = 6;
const MESHES: usize = 4;
const PARTICLES: usize = 5;
const FRAMES: usize = 30;
const SWAP_FRAME: usize = 15;

/// One material per texture; even materials also use the next texture as detail.
/// Only the level handle is returned, so the level owns everything.
fn load_level(mm: &ObjectManager) -> Handle<Level> {
    let textures: Vec<_> = (0..TEXTURES).map(|i| mm.create(Texture { pixels: vec![i as u8; 256] })).collect();
    let meshes = (0..MESHES).map(|i| mm.create(Mesh { vertices: vec![[0.0; 3]; 10 + i] })).collect();
    let materials = (0..TEXTURES)
        .map(|i| {
            let detail = (i % 2 == 0).then(|| textures[(i + 1) % TEXTURES].clone());
            mm.create(Material { albedo: textures[i].clone(), detail })
        })
        .collect();
    mm.create(Level { meshes, materials })
}

#[test]
fn thirty_frames_with_a_level_swap() {
    let mut mm = ObjectManager::builder().report_leaks(false).build();
    let mut level = load_level(&mm);
    let mut entities: Vec<Handle<Entity>> = Vec::new();
    let mut target: Option<WeakHandle<Entity>> = None;
    let mut targets_died = 0;
    assert_eq!(mm.len(), 1 + MESHES + 2 * TEXTURES);

    for frame in 0..FRAMES {
        // Unload: drop the level and the entities that use its assets.
        let mut unloaded_entities = 0;
        if frame == SWAP_FRAME {
            let old = std::mem::replace(&mut level, load_level(&mm));
            unloaded_entities = entities.len();
            entities.clear();
            drop(old);
        }

        // Spawn three entities (ttl 2..=5, so none dies on its first frame).
        for i in 0..3 {
            let lv = &mm[&level];
            let entity = Entity {
                mesh: lv.meshes[(frame + i) % MESHES].clone(),
                material: lv.materials[(frame * 3 + i) % TEXTURES].clone(),
                ttl: 2 + ((frame + i) % 4) as u32,
            };
            entities.push(mm.create(entity));
        }
        for e in &entities {
            mm.get_mut(e).ttl -= 1;
        }

        // Targeting through a weak handle: notice when the target dies.
        if let Some(w) = target {
            if mm.get_weak(w).is_none() {
                assert!(mm.upgrade(w).is_none(), "a dead target cannot be revived");
                targets_died += 1;
                target = None;
            }
        }
        if target.is_none() {
            target = entities.first().map(Handle::downgrade);
        }
        let aimed = mm.upgrade(target.expect("there is always an entity")).expect("the target is alive");
        assert!(aimed.ref_count() >= 2, "the upgrade adds a reference to the entity's own");
        drop(aimed);

        entities.retain(|e| mm[e].ttl > 0);
        let particles: Vec<_> = (0..PARTICLES).map(|i| mm.create(Particle { pos: [i as f32; 2] })).collect();
        drop(particles);

        let queued = mm.dead_count();
        let stats = mm.collect_garbage();
        assert_eq!(mm.dead_count(), 0, "frame {frame}: the collect leaves nothing dead");
        assert!(stats.objects >= queued, "frame {frame}: cascades add to what was queued");
        assert_eq!(mm.count::<Particle>(), 0);
        assert_eq!(mm.count::<Entity>(), entities.len());
        assert_eq!(mm.count::<Level>(), 1);

        if frame == SWAP_FRAME {
            // Level and entities, then meshes and materials, then textures: one call.
            assert!(stats.rounds >= 2, "the swap cascades: {stats:?}");
            assert_eq!(stats.objects, 1 + MESHES + 2 * TEXTURES + unloaded_entities + PARTICLES);
            assert_eq!(mm.count::<Texture>(), TEXTURES);
            assert_eq!(mm.count::<Material>(), TEXTURES);
            assert_eq!(mm.count::<Mesh>(), MESHES);
        }
    }
    assert!(targets_died > 0, "the weak target died at least once");

    // Keep material 1 (no detail texture) alive on purpose: it keeps its albedo.
    let kept = mm[&level].materials[1].clone().into_raw();
    drop(entities);
    drop(level);
    let stats = mm.collect_garbage();
    assert_eq!(mm.dead_count(), 0);
    assert!(stats.rounds >= 2);
    assert_eq!((mm.count::<Material>(), mm.count::<Texture>()), (1, 1));
    assert_eq!(mm.len(), 2);

    let report = mm.shutdown();
    let mut leaked: Vec<_> = report.iter().map(|e| (e.type_name, e.ref_count)).collect();
    leaked.sort();
    assert_eq!(leaked, [("Material", 1), ("Texture", 1)]);
    assert!(report.iter().all(|e| e.site.file().ends_with("demo_smoke.rs")));
    assert_eq!(report.outliving_handles(), 0, "a raw reference alone keeps no slot memory");
    assert_eq!(report.leaked_bytes(), 0);
    let _ = kept;
}
