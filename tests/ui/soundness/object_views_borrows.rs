// What the borrow checker refuses for per-frame access:
// - a create (or any other use of the manager) while `iter_mut` runs;
// - a view that outlives the `Views` it came from;
// - the manager used while its `Views` lives;
// - `Views` shared between threads (its borrow flags are `Cell`s).
use mmobject::{MMObject, ObjectManager};

#[derive(MMObject)]
struct Entity {
    pos: f32,
}

fn create_during_iter_mut(mm: &mut ObjectManager) {
    for (_, e) in mm.iter_mut::<Entity>() {
        mm.create(Entity { pos: e.pos });
    }
}

fn view_outlives_views(mm: &mut ObjectManager) {
    let view = {
        let views = mm.views();
        views.view_mut::<Entity>()
    };
    drop(view);
}

fn manager_used_while_views_live(mm: &mut ObjectManager) {
    let views = mm.views();
    let _count = mm.count::<Entity>();
    drop(views);
}

fn views_are_not_sync(mm: &mut ObjectManager) {
    fn need_sync<T: Sync>(_: &T) {}
    need_sync(&mm.views());
}

fn main() {}
