//! Every error `#[derive(MMObject)]` reports, as the compiler shows it.
//!
//! Regenerate the expected output with `TRYBUILD=overwrite cargo test --test ui_derive`,
//! then read each `.stderr`: one clear error, pointing at the mistake.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/derive/*.rs");
}
