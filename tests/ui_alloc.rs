//! Compile-fail tests: the borrow checker keeps allocator memory from being used after it is
//! released.

#[test]
#[cfg_attr(miri, ignore = "trybuild runs the compiler")]
fn ui_alloc() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/alloc/*.rs");
}
