//! Issue 8, item 6: `Pool<T>` inserts through `&self`, so it must be invariant in `T`.
//! Were it covariant, `&Pool<&'static str>` could become `&Pool<&'short str>`, take a
//! reference to a local, and hand it back later as `&'static str`.
use mmobject::alloc::Pool;

fn shorten<'short>(pool: &'short Pool<&'static str>) -> &'short Pool<&'short str> {
    pool
}

fn main() {
    let pool: Pool<&'static str> = Pool::with_capacity(2);
    let local = String::from("gone soon");
    let _boxed = shorten(&pool).alloc(local.as_str());
}
