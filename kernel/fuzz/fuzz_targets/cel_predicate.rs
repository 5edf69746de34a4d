//! CEL predicates over arbitrary text: compiling refuses what it cannot check, and a compiled
//! predicate evaluates against sample arguments to a boolean or an error, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Ok(expr) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(predicate) = kernel::policy::compile_predicate(expr) else {
        return;
    };
    for args in [
        json!({}),
        json!({"cents": 20_000, "path": "/etc/passwd", "tags": ["a", "b"], "nested": {"x": 1.5}}),
        json!({"cents": -1, "path": "", "tags": [], "nested": null}),
    ] {
        let _ = predicate.eval(&args);
    }
});
