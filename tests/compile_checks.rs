//! Every precision rule and every `#[amp]` misuse is a compile error with a message that names
//! the rule and the fix; the right programs compile. Each case's expected compiler output is in
//! its `.stderr` file (regenerate with `TRYBUILD=overwrite cargo test --test compile_checks`).

#[test]
fn precision_rules() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/precision_rules/fail/*.rs");
    t.pass("tests/precision_rules/pass/*.rs");
}

#[test]
fn amp_macro() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/amp_macro/fail/*.rs");
    t.pass("tests/amp_macro/pass/*.rs");
}
