//! A `Pool<T>` owns its values, so it is `Send` only when `T` is: a pool of `Rc`s stays on
//! its thread.
use std::rc::Rc;

use mmobject::alloc::Pool;

fn main() {
    let pool = Pool::with_capacity(2);
    let shared = Rc::new(1u32);
    let _kept = mmobject::alloc::PoolBox::into_raw(pool.alloc(Rc::clone(&shared)));
    std::thread::spawn(move || drop(pool));
}
