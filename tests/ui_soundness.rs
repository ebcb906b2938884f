//! Compile-fail tests: what the type system refuses so that safe code cannot
//! reach undefined behaviour (variance, `Send`/`Sync`). File names start with
//! the part of the crate they test (`alloc_`, `object_`, `track_`).

#[test]
#[cfg_attr(miri, ignore = "trybuild runs the compiler")]
fn ui_soundness() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/soundness/*.rs");
}
