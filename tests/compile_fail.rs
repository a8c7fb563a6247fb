//! Every bad attribute is a compile error with a span and a message that says
//! what to write instead. Regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p lock-tests --test compile_fail`.

#[test]
fn bad_attributes_are_compile_errors() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/*.rs");
}
