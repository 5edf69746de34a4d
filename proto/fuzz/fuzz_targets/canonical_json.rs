//! Canonical JSON over arbitrary text: never panics; when the text is JSON, its canonical form is
//! a fixed point and means the same value.

#![no_main]

use kernel_proto::canonical;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(once) = canonical::canonicalize(text) else {
        return;
    };
    let twice = canonical::canonicalize(&once).expect("canonical text parses");
    assert_eq!(once, twice, "canonicalize is idempotent");
    let original: Value = serde_json::from_str(text).expect("parsed once already");
    let reparsed: Value = serde_json::from_str(&once).expect("canonical text parses");
    assert_eq!(original, reparsed, "canonical text means the same value");
    let _ = canonical::model_text(&reparsed);
    let _ = canonical::call_hash("tool", "fingerprint", &reparsed);
});
