//! A `PoolBox<'pool, T>` is invariant in `T` (it borrows an invariant `Pool<T>`), so the
//! value it owns cannot be relabelled with a shorter lifetime and written through.
use mmobject::alloc::PoolBox;

fn shorten<'pool, 'short>(b: PoolBox<'pool, &'static str>) -> PoolBox<'pool, &'short str> {
    b
}

fn main() {}
