//! The permanent adversarial suite: safe code that tries to reach undefined
//! behaviour, and must get a compile error (see `tests/ui/soundness/`), an
//! `Err`, a clear panic, or a clean Miri run instead.
//!
//! Every public generic type is tried for variance coercions, `!Send`/`!Sync`
//! payloads across threads, `mem::forget` of its guards and boxes, lying safe
//! trait impls, and counter wrap-around (through test-only hooks that start a
//! counter near its limit). A new public type gets its cases here.
//!
//! One module per part of the crate.

mod alloc;
mod object;
mod track;
