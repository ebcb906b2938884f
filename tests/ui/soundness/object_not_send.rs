// Objects are shared with every thread that holds `&ObjectManager` and
// destroyed on the collecting thread, so a `!Send`/`!Sync` type cannot be one.
use std::rc::Rc;

use mmobject::MMObject;

#[derive(MMObject)]
struct Shared {
    count: Rc<u32>,
}

fn main() {}
