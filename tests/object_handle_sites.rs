//! The `handle-sites` feature: the leak report lists where each handle still
//! holding a leaked object was created, cloned, upgraded or taken from a raw
//! handle. Run with `cargo test --features handle-sites --test object_handle_sites`.
#![cfg(feature = "handle-sites")]

use mmobject::{Handle, HandleOrigin, MMObject};

mod support;
use support::quiet;

#[derive(MMObject)]
struct Texture {
    width: u32,
}

#[derive(MMObject)]
struct Material {
    albedo: Handle<Texture>,
}

fn sites_of(report: &mmobject::ObjectLeakReport, type_name: &str) -> Vec<(HandleOrigin, u32)> {
    let entry = report.iter().find(|e| e.type_name == type_name).expect("leaked");
    entry.handles.iter().map(|s| (s.origin, s.location.line())).collect()
}

#[test]
fn each_live_handle_reports_where_it_came_from() {
    let mm = quiet();
    let (created, line_created) = (mm.create(Texture { width: 1 }), line!());
    let (cloned, line_cloned) = (created.clone(), line!());
    let weak = created.downgrade();
    let (upgraded, line_upgraded) = (mm.upgrade(weak).unwrap(), line!());
    let raw = created.clone().into_raw();
    let (from_raw, line_from_raw) = (mm.handle_from_raw::<Texture>(raw).unwrap(), line!());
    let report = mm.shutdown();
    assert_eq!(
        sites_of(&report, "Texture"),
        [
            (HandleOrigin::Created, line_created),
            (HandleOrigin::Cloned, line_cloned),
            (HandleOrigin::Upgraded, line_upgraded),
            (HandleOrigin::FromRaw, line_from_raw),
        ]
    );
    let text = report.to_string();
    assert!(text.contains(&format!("handles: created at {}:{line_created}:", file!())), "{text}");
    drop((created, cloned, upgraded, from_raw));
}

#[test]
fn dropped_and_raw_handles_leave_the_list() {
    let mm = quiet();
    let texture = mm.create(Texture { width: 1 });
    let gone = texture.clone();
    drop(gone);
    let (kept, line_kept) = (texture.clone(), line!());
    let (raw, line_raw) = (texture.into_raw(), line!()); // a raw reference, not a handle
    let report = mm.shutdown();
    assert_eq!(sites_of(&report, "Texture"), [(HandleOrigin::Cloned, line_kept), (HandleOrigin::IntoRaw, line_raw)]);
    assert_eq!(report.iter().next().unwrap().ref_count, 2);
    drop(kept);
    let _ = raw;
}

#[test]
fn handles_inside_objects_are_listed_too() {
    let mm = quiet();
    let texture = mm.create(Texture { width: 1 });
    let (material, line) = (mm.create(Material { albedo: texture.clone() }), line!());
    drop(texture);
    let report = mm.shutdown();
    // The material's field holds the clone made on the same line.
    assert_eq!(sites_of(&report, "Texture"), [(HandleOrigin::Cloned, line)]);
    assert_eq!(sites_of(&report, "Material"), [(HandleOrigin::Created, line)]);
    drop(material);
}

#[test]
fn handles_on_other_threads_register_and_unregister() {
    let mm = quiet();
    let texture = mm.create(Texture { width: 1 });
    let n = if cfg!(miri) { 20 } else { 2000 };
    std::thread::scope(|s| {
        for _ in 0..3 {
            let texture = &texture;
            s.spawn(move || {
                for _ in 0..n {
                    drop(texture.clone());
                }
            });
        }
    });
    let report = mm.shutdown();
    assert_eq!(sites_of(&report, "Texture").len(), 1, "only the creating handle is left");
    assert_eq!(report.outliving_handles(), 1);
    drop(texture.clone()); // the table outlives the manager with the handle
    drop(texture);
}

#[test]
fn raw_references_record_where_they_were_taken() {
    let mm = quiet();
    let texture = mm.create(Texture { width: 1 });
    let keep = texture.clone();
    let (raw, line_raw) = (texture.into_raw(), line!());
    let (_, line_add) = (mm.add_ref_raw(raw).unwrap(), line!());
    let (_, _line_second) = (mm.add_ref_raw(raw).unwrap(), line!());
    mm.release_raw(raw).unwrap(); // the most recent raw site goes
    let report = mm.shutdown();
    let sites = sites_of(&report, "Texture");
    assert_eq!(sites[1..], [(HandleOrigin::IntoRaw, line_raw), (HandleOrigin::AddRefRaw, line_add)]);
    assert_eq!(report.iter().next().unwrap().ref_count, 3);
    let text = report.to_string();
    assert!(text.contains(&format!("made raw at {}:{line_raw}:", file!())), "{text}");
    drop(keep);
}
