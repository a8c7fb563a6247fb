//! Every bad attribute is a compile error with a span and a message that says
//! what to write instead, and nothing else: no `unused variable` warning, no
//! error repeated. Regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p lock-tests --test compile_fail`.
//! `ui/pass/` holds attributes that look like mistakes and are not.

#[test]
fn bad_attributes_are_compile_errors() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/*.rs");
    cases.pass("ui/pass/*.rs");
}
